#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 4 (one H200): what the fix of 9eb9e97 costs on the served
# path, whose calls now ask cuStreamIsCapturing once more: nccl-tests all_reduce_perf -g 1
# (one rank, SERVE=all, -d float, 4 B to 1 MiB, 1000 iterations, -c 0) through the library
# without the fix (gpu-carry/before/) and with it (gpu-carry/), alternated three times.
source nccl/bench/common.sh gpu-carry $OUT
log=$OUT/call4 && mkdir -p $log && cp gpu-carry/call4.sh $log/
for round in 1 2 3; do
    for build in before after; do
        lib=gpu-carry/libpeerlink_nccl.so
        [[ $build == before ]] && lib=gpu-carry/before/libpeerlink_nccl.so
        env LD_PRELOAD=$PWD/$lib PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO \
            /tmp/nccl-tests/build/all_reduce_perf -g 1 -b 4 -e 1M -f 4 -d float -n 1000 -w 50 -c 0 \
            > $log/$build-$round.log 2>&1
        echo "$build $round: $(awk '/^ +[0-9]/ {printf "%s:%s ", $1, $6}' $log/$build-$round.log)"
    done
done
