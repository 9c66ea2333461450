#!/usr/bin/env bash
# Session 2026-12-02 (fourth), call 2 (one H200): every GPU test at the final binaries, and the
# library's served runs (nccl-tests -g 1 with and without -G 10, PyTorch eager and captured).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
cp -r gpu-carry/nccl/nccl-tests gpu-carry/nccl-tests
mkdir -p $OUT/call2
(time timeout 240 gpu-carry/gpu-tests --ignored --test-threads=1) > $OUT/call2/gpu-tests.log 2>&1
grep "test result\|FAILED\|failed\|panicked" $OUT/call2/gpu-tests.log | tail -5
timeout 300 bash nccl/bench/serve-h200.sh $carry $OUT/call2
cd $OUT && tar czf call2.tgz call2
