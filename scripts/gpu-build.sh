#!/usr/bin/env bash
# Builds peerlink, its GPU test binary and the Python package's wheel (abi3, CPython >= 3.11) on this
# machine (no CUDA needed here: the driver, NVRTC and NVML are loaded at run time) and puts them into
# gpu-carry/ (git-ignored) of this repository, ready to carry to a GPU host (which has no cargo and
# no network: the wheel is installed there with `pip install --no-index`).
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

# The NCCL-API library: carried beside peerlink (`peerlink launch --nccl` finds it there) and shipped
# in the wheel (peerlink.nccl_library() finds it beside the package), as .ci/run ships it.
cargo build --release -p peerlink-nccl

mkdir -p gpu-carry
cp target/release/peerlink gpu-carry/peerlink
cp "$tests_binary" gpu-carry/gpu-tests
cp target/release/libpeerlink_nccl.so gpu-carry/libpeerlink_nccl.so
cp target/release/libpeerlink_nccl.so python/peerlink/

# The wheel: tagged `linux` (not manylinux), for hosts with this machine's glibc or newer, as the
# binaries above are.
python_bin=$(scripts/python-env.sh)
rm -f gpu-carry/peerlink-*.whl
"$python_bin/maturin" build --release --quiet --out gpu-carry >&2
echo "gpu-build: built gpu-carry/peerlink, gpu-carry/gpu-tests, gpu-carry/libpeerlink_nccl.so and $(ls gpu-carry/peerlink-*.whl) in $repo" >&2
echo "On the GPU host, from the repository root:"
echo "  gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture"
echo "  gpu-carry/peerlink --gpu topo"
echo "  pip install --no-index --force-reinstall gpu-carry/peerlink-*.whl"
echo "  python3 python/benchmarks/torch_side_by_side.py --out \$OUT/python-side-by-side.json"
echo "  python3 python/benchmarks/python_layer.py --gpu --out \$OUT/python-layer.json"
