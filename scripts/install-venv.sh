#!/usr/bin/env bash
# Create the virtual environment and install cuzk-mp into it: what `make venv` runs (and so
# `make test` and `make bench`).
#
#   scripts/install-venv.sh [--dry-run] PYTHON VENV [EXTRAS]
#
# EXTRAS (comma-separated, e.g. "test,gpu") is installed as given. Without it: `test` and `fleet`
# (the fleet tests need its queue library; they start their own PostgreSQL server) plus the
# GPU extra that scripts/gpu-extra.sh picks for this machine's NVIDIA driver (none without one).
# Where that GPU extra cannot be installed (pip fails: no network, no wheel for this platform)
# or CuPy cannot use the GPU once installed, one line says so and why, and the CPU backend is
# what runs; extras given explicitly are never dropped (pip's failure fails the install).
# --dry-run prints the extras that would be installed ("extras: test,fleet,gpu") and installs nothing.
# After installing, scripts/warm_caches.py runs one small proof so that numba's kernels are
# compiled into their on-disk cache once, here, and not by the first real proof.
set -euo pipefail

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
if [[ $# -lt 2 || $# -gt 3 || "${1:-}" == -* ]]; then
  sed -n '5,6p' "$0" >&2; exit 2
fi
py="$1" venv="$2" extras="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
say() { echo "cuzk-mp: $*" >&2; }

gpu=""
if [[ -z "$extras" ]]; then
  gpu=$("$here/gpu-extra.sh")
  extras="test,fleet${gpu:+,$gpu}"
fi
if (( dry )); then
  echo "extras: $extras"
  exit 0
fi

vpy="$venv/bin/python"
[[ -x "$vpy" ]] || "$py" -m venv "$venv"
"$vpy" -m pip install -q --upgrade pip
cd "$here/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$vpy" -m pip install -q -e ".[$extras]" 2> "$log"; then
  if [[ -z "$gpu" ]]; then
    cat "$log" >&2; exit 1
  fi
  why=$(grep -E '^(ERROR|error):' "$log" | tail -n 1 || true)
  say "an NVIDIA GPU is here, but pip could not install the '$gpu' extra (${why:-no error line from pip}): installed without it, the CPU backend will run"
  gpu=""
  "$vpy" -m pip install -q -e ".[test,fleet]"
fi
if [[ -n "$gpu" ]]; then
  if ! why=$("$vpy" -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount(), "CUDA device(s)")' 2>&1); then
    say "CuPy ('$gpu' extra) is installed but cannot use the GPU ($(printf '%s\n' "$why" | tail -n 1)): the CPU backend will run"
  else
    say "CuPy ('$gpu' extra) sees $why"
  fi
fi
if ! "$vpy" scripts/warm_caches.py; then
  say "warming the numba caches failed (above): the first proof compiles its kernels instead"
fi
