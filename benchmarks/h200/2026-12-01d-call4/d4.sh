#!/usr/bin/env bash
# One H200 (the pair not lent): the GPU tests at the session's code, and Fabric.empty with one rank
# (its tensor, its memory kept until close, the warning at close; the reduce needs two GPUs).
set -uo pipefail
w=$(mktemp -d)
PEERLINK_BIN=gpu-carry/peerlink timeout 400 gpu-carry/gpu-tests --ignored --test-threads=1 --skip soak \
  >"$w/gpu-tests.log" 2>&1; echo "gpu tests exit: $?" >>"$w/gpu-tests.log"
python3 -m pip install --no-index --force-reinstall gpu-carry/peerlink-*.whl >"$w/pip.txt" 2>&1
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 \
timeout 60 python3 - >"$w/empty.txt" 2>&1 <<'PY'
import warnings
import torch
import peerlink
fabric = peerlink.Fabric(processes=True, gpu=True)
t = fabric.empty(4, 8, dtype=torch.bfloat16)
assert t.shape == (4, 8) and t.dtype == torch.bfloat16 and t.device == torch.device("cuda", 0), t
assert bool((t == 0).all())
t.add_(3)
assert bool((t == 3).all())
buffer = fabric.alloc_symmetric(256)
print("empty:", t.shape, t.dtype, t.device, "alloc_symmetric:", buffer.nbytes, buffer.device)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fabric.close()
print("warned:", [str(w.message) for w in caught])
assert caught
PY
echo "empty exit: $?" >>"$w/empty.txt"
tar czf "$OUT/results.tgz" -C "$w" .
grep -E "test result|FAILED|panicked|gpu tests exit" "$w/gpu-tests.log" | head
cat "$w/empty.txt"
