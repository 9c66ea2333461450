#!/usr/bin/env bash
# Session 2026-12-02 (fourth), call 1 (one H200): every GPU test with the release-word kernels (the
# two-GPU ones skip), and the library's nccl-tests check (-g 1, served) plus the training job.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
cp -r gpu-carry/nccl/nccl-tests gpu-carry/nccl-tests
mkdir -p $OUT/call1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/call1/gpu.txt 2>&1
(time timeout 240 gpu-carry/gpu-tests --ignored --test-threads=1) > $OUT/call1/gpu-tests.log 2>&1
grep "test result\|FAILED\|failed\|panicked" $OUT/call1/gpu-tests.log | tail -5
timeout 300 bash nccl/bench/fabric-runs.sh $carry $OUT/call1 check train
cd $OUT && tar czf call1.tgz call1
