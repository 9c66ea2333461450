#!/usr/bin/env bash
# Session 2026-12-03 (fifth), call 2 (one H200): the share tests again, the exports' files now
# passed to the child over a Unix socket (SCM_RIGHTS) — in call 1 the child reopened a
# /proc/<pid>/fd path, which for the descriptor CUDA exports of ncclMemAlloc memory names another
# file (cuMemImportFromShareableHandle: CUDA_ERROR_UNKNOWN).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p $OUT/call2
(time timeout 120 gpu-carry/gpu-tests --ignored --test-threads=1 processes::a_child_process) > $OUT/call2/gpu-tests.log 2>&1
grep "test \|test result\|panicked\|child" $OUT/call2/gpu-tests.log | tail -12
