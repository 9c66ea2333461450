#!/usr/bin/env bash
# On one H200: all_reduce_perf and reduce_scatter_perf type by type through libpeerlink_nccl.so
# (every op of the non-fp8 types with -o all; the fp8 types op by op), and the fp8 ops that NCCL
# refuses run once directly, without the library, to show the refusal is NCCL's own.
#   run-h200-reductions.sh CARRY OUT
source "$(dirname "$0")/common.sh" "$@"
# run LOG PRELOAD TEST ARGS...: one run appended to LOG, its command first and its exit status last.
run() {
    local log=$1 preload=$2 test=$3; shift 3
    echo "\$ ${preload:+LD_PRELOAD=$preload PEERLINK_NCCL_DEBUG=INFO }${test}_perf $*" >>$log
    LD_PRELOAD=$preload PEERLINK_NCCL_DEBUG=INFO NCCL_DEBUG=WARN /tmp/nccl-tests/build/${test}_perf "$@" >>$log 2>&1
    echo "exit status $?" >>$log
}
common="-b 8 -e 32M -f 4 -g 1 -c 1"
for test in all_reduce reduce_scatter; do
    for extra in "" "-G 10"; do
        log=$logs/${test}_by_type${extra:+_G10}.log
        for type in int8 uint8 int32 uint32 int64 uint64 half float double bfloat16; do
            run $log "$library" $test $common -d $type -o all $extra
        done
        for type in f8e4m3 f8e5m2; do
            for op in sum prod max min avg mulsum; do
                run $log "$library" $test $common -d $type -o $op $extra
            done
        done
        echo "$log: $(grep -c '^exit status 0' $log) runs passed, $(grep -c '^exit status [1-9]' $log) failed"
    done
    log=$logs/${test}_fp8_direct.log
    for type in f8e4m3 f8e5m2; do
        for op in sum prod max min avg mulsum; do
            run $log "" $test $common -d $type -o $op
        done
    done
    echo "$log: $(grep -c '^exit status 0' $log) runs passed, $(grep -c '^exit status [1-9]' $log) failed"
done
grep -h -B1 -A3 "NCCL WARN" $logs/*direct.log | head -20
tar -czf "$out/logs.tar.gz" -C $logs .
