#!/usr/bin/env bash
# Session 2026-12-04 (seventh), call 7 (one H200): call 6's latency runs again in the other order
# (the library with 52969aa first, then before it, 9eb9e97), to tell an order effect from a cost:
# all_reduce_perf -g 1 -d float -b 4 -e 4M -f 16 -n 2000 -w 200 -c 0, alternated four times.
source nccl/bench/common.sh gpu-carry $OUT
log=$OUT/call7 && mkdir -p $log && cp gpu-carry/call7.sh $log/
carry=$PWD/gpu-carry
for round in 1 2 3 4; do
    for build in new prev; do
        lib=$carry/libpeerlink_nccl.so
        [[ $build == prev ]] && lib=$carry/prev/libpeerlink_nccl.so
        env LD_PRELOAD=$lib PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO \
            /tmp/nccl-tests/build/all_reduce_perf -g 1 -b 4 -e 4M -f 16 -d float -n 2000 -w 200 -c 0 \
            > $log/$build-$round.log 2>&1
        echo "$build $round (out of place / in place, us): $(awk '/^ +[0-9]/ {printf "%s:%s/%s ", $1, $6, $10}' $log/$build-$round.log)"
    done
done
cd $OUT && tar czf call7.tgz call7 && rm -rf call7
