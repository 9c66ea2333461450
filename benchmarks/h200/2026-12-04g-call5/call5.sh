#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 5 (one H200): what the fix of 9eb9e97 costs on the served
# path, whose calls now ask cuStreamIsCapturing once more: nccl-tests all_reduce_perf -g 1
# (one rank, SERVE=all, -d float, 4 B to 4 KiB, 5000 iterations, -c 0) through the library
# without the fix (gpu-carry/before/) and with it (gpu-carry/), and NCCL alone, alternated six
# times (call 4 was too noisy to tell).
source nccl/bench/common.sh gpu-carry $OUT
log=$OUT/call5 && mkdir -p $log && cp gpu-carry/call5.sh $log/
for round in 1 2 3 4 5 6; do
    for build in before after nccl; do
        preload=(env LD_PRELOAD=$PWD/gpu-carry/libpeerlink_nccl.so PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO)
        [[ $build == before ]] && preload[1]=LD_PRELOAD=$PWD/gpu-carry/before/libpeerlink_nccl.so
        [[ $build == nccl ]] && preload=()
        "${preload[@]}" /tmp/nccl-tests/build/all_reduce_perf -g 1 -b 4 -e 4K -f 4 -d float -n 5000 -w 500 -c 0 \
            > $log/$build-$round.log 2>&1
        echo "$build $round: $(awk '/^ +[0-9]/ {printf "%s:%s ", $1, $6}' $log/$build-$round.log)"
    done
done
