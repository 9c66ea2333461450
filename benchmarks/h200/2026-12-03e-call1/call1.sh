#!/usr/bin/env bash
# Session 2026-12-03 (fifth), call 1 (one H200): every GPU test (the new one exports borrowed
# cudaMalloc and ncclMemAlloc memory to a child process), the library's nccl-tests check (-g 1,
# served, plain and -R 2: the window registrations now pass through the library's own function,
# held to the end of nccl-tests' group).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
cp -r gpu-carry/nccl/nccl-tests gpu-carry/nccl-tests
mkdir -p $OUT/call1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/call1/gpu.txt 2>&1
(time timeout 280 gpu-carry/gpu-tests --ignored --test-threads=1) > $OUT/call1/gpu-tests.log 2>&1
grep "test result\|FAILED\|failed\|panicked" $OUT/call1/gpu-tests.log | tail -8
grep -A3 "borrowed_and_exported_here" $OUT/call1/gpu-tests.log | head -12
timeout 280 bash nccl/bench/fabric-runs.sh $carry $OUT/call1 check threads
cd $OUT && tar czf call1.tgz call1
