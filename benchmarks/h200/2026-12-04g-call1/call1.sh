#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 1 (one H200), binaries of 0eb02ac: every GPU test (one rank's
# all-reduce across processes among them), the library's nccl-tests check (-g 1, served with
# SERVE=all: -d all/float/bfloat16/half, plain and -R 2, and -d float captured, -G 10 and -R 2 -G 10)
# against NCCL alone, and the PyTorch script (eager, captured, DDP) served. Every log in one archive.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
cp -r gpu-carry/nccl/nccl-tests gpu-carry/nccl-tests
log=$OUT/call1 && mkdir -p $log
cp gpu-carry/call1.sh $log/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $log/gpu.txt 2>&1
(time timeout 250 gpu-carry/gpu-tests --ignored --test-threads=1) > $log/gpu-tests.log 2>&1
grep "test result\|FAILED\|failed\|panicked" $log/gpu-tests.log | tail -8
grep "one_rank" $log/gpu-tests.log
timeout 290 bash nccl/bench/fabric-runs.sh $carry $log check
grep -h "served calls by peerlink's kernel" $log/check/*.log | sort | uniq -c
(echo "\$ LD_PRELOAD=gpu-carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO python3 gpu-carry/nccl_forwarding_torch.py"
 LD_PRELOAD=gpu-carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO timeout 50 python3 gpu-carry/nccl_forwarding_torch.py
 echo "exit status $?") > $log/torch.log 2>&1
tail -12 $log/torch.log
cd $OUT && tar czf call1.tgz call1 && rm -rf call1
