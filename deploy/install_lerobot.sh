#!/usr/bin/env bash
# LeRobot 0.4.4 in a virtualenv of its own, for the interop tests of the project's
# LeRobot dataset reader and writer (tests/trainer/data/test_lerobot_dataset.py).
#
#   deploy/install_lerobot.sh                  (what `./armature install-lerobot` runs)
#   deploy/install_lerobot.sh --print-python   the venv's python, installed or not
#
# lerobot's pins (torch, torchvision, huggingface-hub) clash with the project's, so it
# never enters the project's venv (see deploy/lerobot-requirements.txt). Its venv is
# $ARMATURE_LEROBOT_VENV, or by default ~/.cache/armature/lerobot-venv-<hash>, the hash
# of the requirement list and this script: editing either builds a new venv (the old
# default ones are removed, each is 5.5 GB), and a second run returns at once. The
# tests find the python with --print-python, or take $ARMATURE_LEROBOT_PYTHON.
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$script")/.."

REQUIREMENTS=deploy/lerobot-requirements.txt
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/armature"
hash=$(cat "$REQUIREMENTS" "$script" | sha256sum | cut -c1-16)
VENV="${ARMATURE_LEROBOT_VENV:-$CACHE/lerobot-venv-$hash}"

if [ "${1:-}" = "--print-python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
# The marker is written last: a venv without it is a broken install, built again.
if [ -f "$VENV/.installed" ]; then
  echo "LeRobot is already installed: $VENV/bin/python"
  exit 0
fi

version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then  # the pinned wheels are CPython 3.11's
  echo "$PYTHON is Python $version; set PYTHON to a Python 3.11" >&2
  exit 1
fi

started=$SECONDS
echo "Building LeRobot's virtualenv in $VENV (minutes and 5.5 GB the first time)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS"

# Import what the tests run, offline as they do, so a broken install fails here.
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c \
  "import lerobot, lerobot.datasets.lerobot_dataset, lerobot.rl.buffer; print('lerobot', lerobot.__version__)" \
  </dev/null

touch "$VENV/.installed"
if [ -z "${ARMATURE_LEROBOT_VENV:-}" ]; then
  for old in "$CACHE"/lerobot-venv-*; do
    [ "$old" = "$VENV" ] || rm -rf "$old"
  done
fi
echo "LeRobot installed in $((SECONDS - started)) s ($(du -sh "$VENV" | cut -f1)): $VENV/bin/python"
