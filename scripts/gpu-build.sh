#!/usr/bin/env bash
# Builds peerlink and its GPU test binary on this machine (no CUDA needed here: the driver, NVRTC and
# NVML are loaded at run time) and puts both into gpu-carry/ (git-ignored) of this repository, ready
# to carry to a GPU host.
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$repo"

cargo build --release --bin peerlink

# The test binary's name carries a hash: ask cargo for it.
tests_binary=$(
    cargo test --release --no-run --test gpu --message-format=json |
        grep '"reason":"compiler-artifact"' |
        grep '"name":"gpu"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
        tail -n 1
)
if [[ -z "$tests_binary" || ! -x "$tests_binary" ]]; then
    echo "gpu-build: cargo did not report the gpu test binary" >&2
    exit 1
fi

mkdir -p gpu-carry
cp target/release/peerlink gpu-carry/peerlink
cp "$tests_binary" gpu-carry/gpu-tests
echo "gpu-build: built gpu-carry/peerlink and gpu-carry/gpu-tests in $repo" >&2
echo "On the GPU host, from the repository root:"
echo "  gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture"
echo "  gpu-carry/peerlink --gpu topo"
