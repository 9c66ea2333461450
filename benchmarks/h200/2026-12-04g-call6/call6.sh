#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 6 (one H200), binaries of 52969aa (a served call out of place
# sums its input where it is, with no copy into the output first): every GPU test; the library's
# nccl-tests check (fabric-runs.sh check: -g 1, SERVE=all, 0 wrong expected); the one-rank latency
# of all_reduce_perf -g 1 -d float 4 B to 1 MiB (-n 2000 -w 200 -c 0) through the library before
# it (gpu-carry/prev/, 9eb9e97) and with it, and on NCCL alone, alternated four times; the
# PyTorch script. One archive.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
carry=$PWD/gpu-carry
log=$OUT/call6 && mkdir -p $log && cp gpu-carry/call6.sh $log/
(time timeout 230 gpu-carry/gpu-tests --ignored --test-threads=1) > $log/gpu-tests.log 2>&1
grep "test result\|FAILED\|panicked" $log/gpu-tests.log | tail -5
timeout 280 bash nccl/bench/fabric-runs.sh $carry $log check
grep -h "served calls by peerlink's kernel" $log/check/*.log | sort | uniq -c
mkdir -p $log/latency
# The NCCL fabric-runs.sh linked nccl-tests against (common.sh), found as there.
export LD_LIBRARY_PATH=/tmp/ncclhome/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4; do
    for build in prev new nccl; do
        preload=(env LD_PRELOAD=$carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO)
        [[ $build == prev ]] && preload[1]=LD_PRELOAD=$carry/prev/libpeerlink_nccl.so
        [[ $build == nccl ]] && preload=()
        "${preload[@]}" /tmp/nccl-tests/build/all_reduce_perf -g 1 -b 4 -e 1M -f 4 -d float -n 2000 -w 200 -c 0 \
            > $log/latency/$build-$round.log 2>&1
        echo "$build $round (out of place / in place, us): $(awk '/^ +[0-9]/ {printf "%s:%s/%s ", $1, $6, $10}' $log/latency/$build-$round.log)"
    done
done
(echo "\$ LD_PRELOAD=gpu-carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO python3 gpu-carry/nccl_forwarding_torch.py"
 LD_PRELOAD=gpu-carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO timeout 50 python3 gpu-carry/nccl_forwarding_torch.py
 echo "exit status $?") > $log/torch.log 2>&1
grep "right\|one's\|exit status" $log/torch.log
cd $OUT && tar czf call6.tgz call6 && rm -rf call6
