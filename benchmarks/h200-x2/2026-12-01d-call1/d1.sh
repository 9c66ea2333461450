#!/usr/bin/env bash
# Issue 18 on the pair: one tensor per process (group test, launch workload, torchrun side by side),
# the current-device test with the wheel before and after the fix.
set -uo pipefail
w=$(mktemp -d)
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 )) s: $*" | tee -a "$w/steps.txt" >&2; }
stamp smi
nvidia-smi >"$w/nvidia-smi.txt" 2>&1; nvidia-smi topo -m >>"$w/nvidia-smi.txt" 2>&1
stamp tests
PEERLINK_BIN=gpu-carry/peerlink gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture \
  group_all_reduce_sums the_backend_retains_a_context_only ranks_that_each_see_one_gpu \
  >"$w/tests.log" 2>&1; echo "tests exit: $?" >>"$w/tests.log"
stamp launch-workload
timeout 240 gpu-carry/peerlink launch -n 2 --timeout 120 -- --gpu workload all-reduce \
  --export-json "$w/launch-allreduce.json" >"$w/launch-allreduce.txt" 2>&1
echo "launch exit: $?" >>"$w/launch-allreduce.txt"
stamp pytest-before
python3 -m pip install --no-index --force-reinstall gpu-carry/before/peerlink-*.whl >"$w/pip-before.txt" 2>&1
timeout 120 python3 -m pytest -q python/tests/test_torch_gpu.py >"$w/pytest-before.txt" 2>&1
echo "pytest exit: $?" >>"$w/pytest-before.txt"
stamp pytest-after
python3 -m pip install --no-index --force-reinstall gpu-carry/peerlink-*.whl >"$w/pip-after.txt" 2>&1
timeout 120 python3 -m pytest -q python/tests/test_torch_gpu.py >"$w/pytest-after.txt" 2>&1
echo "pytest exit: $?" >>"$w/pytest-after.txt"
stamp torchrun
( while true; do nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader >>"$w/compute-apps.txt" 2>&1; echo --- >>"$w/compute-apps.txt"; sleep 2; done ) &
sampler=$!
cd python/benchmarks
timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 torch_processes.py \
  --contenders peerlink,nccl,nccl-graph,symm-one-shot,symm-two-shot --out "$w/processes.json" \
  >"$w/processes.txt" 2>&1
echo "torchrun exit: $?" >>"$w/processes.txt"
cd ../..
kill $sampler
stamp done
tar czf "$OUT/results.tgz" -C "$w" .
tail -n 3 "$w/tests.log"; grep -E "test result|FAILED|panicked" "$w/tests.log" | head
tail -n 25 "$w/launch-allreduce.txt"
tail -n 6 "$w/pytest-before.txt"; tail -n 4 "$w/pytest-after.txt"
tail -n 40 "$w/processes.txt"
cat "$w/steps.txt"
