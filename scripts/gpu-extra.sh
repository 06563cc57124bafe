#!/usr/bin/env bash
# Which GPU extra of cuzk-mp matches this machine's NVIDIA driver.
#
#   scripts/gpu-extra.sh
#
# Prints the extra's name on stdout: `gpu` (cupy-cuda12x) for a driver of CUDA 12, `gpu-cuda13`
# (cupy-cuda13x) for CUDA 13 and later; nothing when there is no NVIDIA driver or it is too old.
# One line on stderr says what was found and why. The driver's CUDA version is read from
# `nvidia-smi` (its "CUDA Version: X.Y" header) or, where nvidia-smi is missing, derived from
# the kernel module's version in /proc/driver/nvidia/version (CUDA 13 needs driver 580 or later,
# CUDA 12 driver 525 or later); $CUZK_MP_NVIDIA_PROC names another file to read instead.
# Always exits 0: no GPU is not an error.
set -euo pipefail

proc="${CUZK_MP_NVIDIA_PROC:-/proc/driver/nvidia/version}"
say() { echo "cuzk-mp: $*" >&2; }

extra_for() {  # $1: CUDA major version, $2: where it came from
  local major="$1" from="$2"
  if (( major >= 13 )); then
    say "$from: CUDA $major driver, GPU extra gpu-cuda13 (cupy-cuda13x)"
    echo gpu-cuda13
  elif (( major == 12 )); then
    say "$from: CUDA 12 driver, GPU extra gpu (cupy-cuda12x)"
    echo gpu
  else
    say "$from: the driver supports CUDA $major only; CuPy for cuzk-mp needs a CUDA 12 driver (525 or later): CPU only"
  fi
}

if command -v nvidia-smi > /dev/null 2>&1; then
  if ! out=$(nvidia-smi 2>&1); then
    say "nvidia-smi failed ($(printf '%s\n' "$out" | head -n 1)): no usable NVIDIA driver, CPU only"
    exit 0
  fi
  cuda=$(printf '%s\n' "$out" | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\.[0-9].*/\1/p' | head -n 1)
  if [[ -z "$cuda" ]]; then
    say "nvidia-smi printed no CUDA version: no usable NVIDIA driver, CPU only"
    exit 0
  fi
  extra_for "$cuda" "nvidia-smi"
  exit 0
fi

if [[ -r "$proc" ]]; then
  driver=$(sed -n 's/.*Kernel Module[^0-9]*\([0-9][0-9]*\)\.[0-9.]*.*/\1/p' "$proc" | head -n 1)
  if [[ -z "$driver" ]]; then
    say "$proc: no driver version found, CPU only"
  elif (( driver >= 580 )); then
    extra_for 13 "NVIDIA driver $driver ($proc)"
  elif (( driver >= 525 )); then
    extra_for 12 "NVIDIA driver $driver ($proc)"
  else
    extra_for 11 "NVIDIA driver $driver ($proc)"
  fi
  exit 0
fi
say "no NVIDIA driver (no nvidia-smi, no $proc): CPU only"
