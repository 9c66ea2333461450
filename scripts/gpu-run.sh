#!/usr/bin/env bash
# Runs on the GPU host, from the repository root, with gpu-carry/ built by scripts/gpu-build.sh.
# Collects nvidia-smi's view, peerlink's topo, bench, sweep, explain and engine-benchmark outputs and
# the GPU tests' log under $1 (default: $OUT, the device tool's output folder), packed into results.tgz.
set -uo pipefail
dest=${1:-${OUT:?give an output folder}}
work=$(mktemp -d)
bin=gpu-carry/peerlink
step() { echo "== $*" >&2; }

step nvidia-smi
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >"$work/nvidia-smi-topo.txt" 2>&1
nvidia-smi -q >"$work/nvidia-smi-q.txt" 2>&1
nvidia-smi nvlink -s >"$work/nvidia-smi-nvlink.txt" 2>&1

step topo
$bin --gpu topo >"$work/topo.txt" 2>&1
$bin --gpu topo --json >"$work/topo.json" 2>"$work/topo.err"

step gpu tests
gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture >"$work/gpu-tests.log" 2>&1
echo "gpu tests exit: $?" >>"$work/gpu-tests.log"

step bench
{ time $bin --gpu bench --json >"$work/bench.json" 2>"$work/bench.err"; } 2>"$work/bench.time"
$bin --gpu bench >"$work/bench.txt" 2>&1
$bin --gpu bench --tests sm-write,sm-read,ce-bidir-read,sm-bidir-write,staged,staged-bidir,all-to-one,one-to-all \
    --json >"$work/bench-more.json" 2>"$work/bench-more.err"
$bin --gpu bench --tests sm-write,sm-read,ce-bidir-read,sm-bidir-write,staged,staged-bidir,all-to-one,one-to-all \
    >"$work/bench-more.txt" 2>&1

step sweep
$bin --gpu bench --sizes 4B..1GiB --tests ce-write,sm-write,staged --json >"$work/sweep.json" 2>"$work/sweep.err"
$bin --gpu bench --sizes 4B..1GiB --tests ce-write,sm-write,staged >"$work/sweep.txt" 2>&1

step explain
for size in 8B 64KiB 256MiB; do
    $bin --gpu explain --src 0 --dst 0 --size $size --json >"$work/explain-$size.json" 2>"$work/explain-$size.err"
    $bin --gpu explain --src 0 --dst 0 --size $size >"$work/explain-$size.txt" 2>&1
done

step engine
$bin --gpu plan --src 0 --dst 0 --sizes 4B..1GiB --json >"$work/engine-sweep.json" 2>"$work/engine-sweep.err"
$bin --gpu plan --src 0 --dst 0 --sizes 4B..1GiB >"$work/engine-sweep.txt" 2>&1
$bin --gpu plan --src 0 --dst 0 --size 4KiB --messages 1000 --prove --json >"$work/engine-batch.json" 2>"$work/engine-batch.err"
$bin --gpu plan --src 0 --dst 0 --size 4KiB --messages 1000 --prove >"$work/engine-batch.txt" 2>&1
$bin --gpu plan --src 0 --dst 0 --size 256MiB --prove --json >"$work/engine-256MiB.json" 2>"$work/engine-256MiB.err"
$bin --gpu plan --src 0 --dst 0 --size 256MiB --prove >"$work/engine-256MiB.txt" 2>&1

tar czf "$dest/results.tgz" -C "$work" .
grep -E "^test |test result|random transfers|gpu tests exit" "$work/gpu-tests.log" | tail -n 25
cat "$work/bench.time"
cat "$work/engine-batch.txt" "$work/engine-256MiB.txt"
grep -h "gap:" "$work"/explain-*.txt
cat "$work"/*.err
