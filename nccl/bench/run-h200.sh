#!/usr/bin/env bash
# On one H200 of the GPU image: builds nccl-tests against the NCCL inside the PyTorch install and
# runs it, a PyTorch script and the forwarding-cost program through libpeerlink_nccl.so.
#   run-h200.sh CARRY OUT   (CARRY holds libpeerlink_nccl.so, nccl-tests/, forward_cost.c and
#                            nccl_forwarding_torch.py; OUT receives the logs)
source "$(dirname "$0")/common.sh" "$@"
for test in all_reduce all_gather reduce_scatter broadcast sendrecv; do
    for extra in "" "-G 10"; do
        name=${test}${extra:+_G10}
        echo "\$ LD_PRELOAD=$library PEERLINK_NCCL_DEBUG=INFO ${test}_perf -b 8 -e 32M -f 4 -g 1 -d all -o all -c 1 $extra" >$logs/$name.log
        LD_PRELOAD=$library PEERLINK_NCCL_DEBUG=INFO /tmp/nccl-tests/build/${test}_perf \
            -b 8 -e 32M -f 4 -g 1 -d all -o all -c 1 $extra >>$logs/$name.log 2>&1
        echo "exit status $?" >>$logs/$name.log
        echo "$name: $(grep -c '^peerlink-nccl' $logs/$name.log) library lines; $(grep 'Out of bounds' $logs/$name.log)"
    done
done
echo "\$ LD_PRELOAD=$library PEERLINK_NCCL_DEBUG=INFO python3 nccl_forwarding_torch.py" >$logs/torch.log
LD_PRELOAD=$library PEERLINK_NCCL_DEBUG=INFO PYTHONUNBUFFERED=1 python3 "$carry/nccl_forwarding_torch.py" >>$logs/torch.log 2>&1
echo "exit status $?" >>$logs/torch.log
tail -25 $logs/torch.log
gcc -O2 -o /tmp/forward_cost "$carry/forward_cost.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -ldl \
    && { echo "\$ forward_cost $nccl/lib/libnccl.so.2 $library 4000"; /tmp/forward_cost "$nccl/lib/libnccl.so.2" "$library" 4000; } >$logs/forward_cost.log 2>&1
cat $logs/forward_cost.log
tar -czf "$out/logs.tar.gz" -C $logs .
