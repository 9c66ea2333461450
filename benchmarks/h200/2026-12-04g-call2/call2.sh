#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 2 (one H200), binaries of 9eb9e97 (the shared buffers a
# captured call used are kept when a larger call grows them): every GPU test, the library's
# nccl-tests check (-g 1, SERVE=all: -d all/float/bfloat16/half, plain and -R 2, -d float with
# -G 10 and -R 2 -G 10) against NCCL alone, and the PyTorch script (eager; captured, replayed,
# then replayed again after a larger eager call grew the shared buffer; DDP). One archive.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
cp -r gpu-carry/nccl/nccl-tests gpu-carry/nccl-tests
log=$OUT/call2 && mkdir -p $log
cp gpu-carry/call2.sh $log/
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
cd $OUT && tar czf call2.tgz call2 && rm -rf call2
