#!/usr/bin/env bash
# Issue 18 on the pair: symmetric memory across processes (group test, launch workload, torchrun
# beside NCCL and SymmetricMemory), the contract's offset refusal, the current-device test.
set -uo pipefail
w=$(mktemp -d)
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 )) s: $*" | tee -a "$w/steps.txt" >&2; }
stamp tests
PEERLINK_BIN=gpu-carry/peerlink gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture \
  group_all_reduce_sums rank_all_reduce_refuses >"$w/tests.log" 2>&1; echo "tests exit: $?" >>"$w/tests.log"
stamp launch-workload
timeout 240 gpu-carry/peerlink launch -n 2 --timeout 120 -- --gpu workload all-reduce \
  --export-json "$w/launch-allreduce.json" >"$w/launch-allreduce.txt" 2>&1
echo "launch exit: $?" >>"$w/launch-allreduce.txt"
stamp pip
python3 -m pip install --no-index --force-reinstall gpu-carry/peerlink-*.whl >"$w/pip.txt" 2>&1
timeout 120 python3 -m pytest -q python/tests/test_torch_gpu.py >"$w/pytest.txt" 2>&1
echo "pytest exit: $?" >>"$w/pytest.txt"
stamp torchrun
cd python/benchmarks
timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 torch_processes.py \
  --contenders peerlink,peerlink-symm,nccl,nccl-graph,symm-one-shot,symm-two-shot --out "$w/processes.json" \
  >"$w/processes.txt" 2>&1
echo "torchrun exit: $?" >>"$w/processes.txt"
cd ../..
stamp done
tar czf "$OUT/results.tgz" -C "$w" .
grep -E "test result|FAILED|panicked|tests exit" "$w/tests.log" | head
grep -E "symmetric memory (pick|by two-shot)" "$w/tests.log" | grep "rank 0" | head -20
grep -E "(pick)|NCCL  " "$w/launch-allreduce.txt" | head -40; tail -2 "$w/launch-allreduce.txt"
tail -n 3 "$w/pytest.txt"
grep -vE "^\*|OMP_NUM" "$w/processes.txt" | tail -n 95
cat "$w/steps.txt"
