#!/usr/bin/env bash
# Fetches (once) NVRTC for CUDA 13 from PyPI's nvidia-cuda-nvrtc wheel, for a machine without the
# CUDA toolkit, and prints the directory holding libnvrtc.so.13. With it on LD_LIBRARY_PATH the
# kernels compile here as they do on a GPU host (the GPU is not needed to compile, only to run):
#
#   LD_LIBRARY_PATH=$(scripts/nvrtc.sh) cargo test --release --lib kernels_compile -- --ignored
#
# It lives in target/nvrtc (git-ignored, beside cargo's artifacts).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir="$repo/target/nvrtc"
lib="$dir/wheel/nvidia/cu13/lib"
if [[ ! -e "$lib/libnvrtc.so.13" ]]; then
    python_bin=$("$repo/scripts/python-env.sh")
    rm -rf "$dir"
    "$python_bin/pip" download -q --disable-pip-version-check --no-deps -d "$dir" \
        "nvidia-cuda-nvrtc==13.0.*" >&2
    "$python_bin/python" -m zipfile -e "$dir"/nvidia_cuda_nvrtc-*.whl "$dir/wheel"
fi
if [[ ! -e "$lib/libnvrtc.so.13" ]]; then
    echo "nvrtc: the wheel holds no nvidia/cu13/lib/libnvrtc.so.13" >&2
    exit 1
fi
echo "$lib"
