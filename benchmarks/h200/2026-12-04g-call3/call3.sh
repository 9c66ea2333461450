#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 3 (one H200): the PyTorch script through the library built
# without 9eb9e97's fix (its parent 8fb3f01's engine with group.rs and buffers.rs of 9eb9e97~1),
# to see whether a graph replayed after a larger call grew the shared buffer fails on a GPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log=$OUT/call3 && mkdir -p $log && cp gpu-carry/call3.sh $log/
(echo "\$ LD_PRELOAD=gpu-carry/before/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO python3 gpu-carry/nccl_forwarding_torch.py"
 LD_PRELOAD=gpu-carry/before/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO timeout 60 python3 gpu-carry/nccl_forwarding_torch.py
 echo "exit status $?") > $log/torch-before.log 2>&1
tail -25 $log/torch-before.log
