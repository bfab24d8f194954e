#!/usr/bin/env bash
# The GPU check (tests/gpu, then bench/gpu.py) on a CUDA machine that has Python, torch,
# numpy and pytest but not the trainer's two other dependencies, nor a network:
#
#   tests/gpu/bare_machine.sh wheels [PYTHON_VERSION]   here, with a network: pydantic and
#       ruamel.yaml (pinned as pyproject.toml pins them) and what they need, as wheels for
#       that machine's Python (default 3.12, x86-64 Linux), into .gpu-wheels/ (ignored by git)
#   tests/gpu/bare_machine.sh run [PYTHON]               there, in a copy of the repo that
#       holds .gpu-wheels/: unpacks them beside it (no pip, no install), then runs the GPU
#       tests and the benchmark, and exits with the tests' status
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.gpu-wheels

pinned() {  # pinned NAME: NAME==VERSION as pyproject.toml pins it
  grep -oE "\"$1==[^\"]+\"" pyproject.toml | tr -d '"'
}

case "${1:-}" in
  wheels)
    version="${2:-3.12}"
    rm -rf "$WHEELS"
    python3 -m pip download --quiet --only-binary=:all: --implementation cp \
      --python-version "$version" --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 -d "$WHEELS" "$(pinned pydantic)" "$(pinned ruamel.yaml)"
    ls "$WHEELS"
    ;;
  run)
    python="${2:-python3}"
    [ -d "$WHEELS" ] || { echo "no $WHEELS/: run '$0 wheels' first, where there is a network" >&2; exit 2; }
    site=$(mktemp -d)
    for wheel in "$WHEELS"/*.whl; do "$python" -m zipfile -e "$wheel" "$site"; done
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
    status=0
    "$python" -m pytest tests/gpu --noconftest -p no:cacheprovider -q -rs || status=$?
    "$python" bench/gpu.py
    exit "$status"
    ;;
  *)
    echo "usage: $0 wheels [PYTHON_VERSION] | $0 run [PYTHON]" >&2
    exit 2
    ;;
esac
