#!/usr/bin/env bash
# On one H200 of the GPU image: nccl-tests' all_reduce_perf and a PyTorch one-rank script through
# libpeerlink_nccl.so with PEERLINK_NCCL_SERVE=all, so that the library serves every all-reduce it
# can (f32 and bf16, sum and avg, one rank: the copy or nothing) and forwards the rest.
#   serve-h200.sh CARRY OUT   (CARRY holds libpeerlink_nccl.so, nccl-tests/ — e.g. from
#                              gpu-carry/nccl/nccl-tests — and nccl_forwarding_torch.py)
# Look for: "#wrong 0" / "Out of bounds values : 0 OK" in every log, and in the summary at exit
# "ncclAllReduce … N served" for the float and bfloat16 sizes.
source "$(dirname "$0")/common.sh" "$@"
logs=$out/serve && mkdir -p $logs && cp /tmp/logs/* $logs/
export PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO
# -d all stops where NCCL itself refuses avg on the fp8 types (BENCHMARKS.md, fifth session): the
# served types are also run alone, so their every row is seen.
for types in all float bfloat16; do
    for extra in "" "-G 10"; do
        name=all_reduce_${types}${extra:+_G10}
        echo "\$ LD_PRELOAD=$library all_reduce_perf -b 8 -e 256M -f 4 -g 1 -d $types -o all -c 1 $extra" >$logs/$name.log
        LD_PRELOAD=$library /tmp/nccl-tests/build/all_reduce_perf \
            -b 8 -e 256M -f 4 -g 1 -d $types -o all -c 1 $extra >>$logs/$name.log 2>&1
        echo "exit status $?" >>$logs/$name.log
        echo "$name: $(grep 'Out of bounds' $logs/$name.log); $(grep 'calls at exit' $logs/$name.log)"
    done
done
# The same float runs forwarded (PEERLINK_NCCL_SERVE=none): NCCL's own one-rank times beside the
# served ones.
for extra in "" "-G 10"; do
    name=all_reduce_float_forwarded${extra:+_G10}
    echo "\$ PEERLINK_NCCL_SERVE=none LD_PRELOAD=$library all_reduce_perf -b 8 -e 256M -f 4 -g 1 -d float -o sum -c 1 $extra" >$logs/$name.log
    PEERLINK_NCCL_SERVE=none LD_PRELOAD=$library /tmp/nccl-tests/build/all_reduce_perf \
        -b 8 -e 256M -f 4 -g 1 -d float -o sum -c 1 $extra >>$logs/$name.log 2>&1
    echo "exit status $?" >>$logs/$name.log
done
echo "\$ LD_PRELOAD=$library python3 nccl_forwarding_torch.py" >$logs/torch.log
LD_PRELOAD=$library PYTHONUNBUFFERED=1 python3 "$carry/nccl_forwarding_torch.py" >>$logs/torch.log 2>&1
echo "exit status $?" >>$logs/torch.log
tail -12 $logs/torch.log
