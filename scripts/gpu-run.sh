#!/usr/bin/env bash
# Runs on the GPU host, from the repository root, with gpu-carry/ built by scripts/gpu-build.sh.
# Collects nvidia-smi's view, peerlink's topo, bench, sweep, explain and engine-benchmark outputs and
# the GPU tests' log under $1 (default: $OUT, the device tool's output folder), packed into results.tgz.
set -uo pipefail
dest=${1:-${OUT:?give an output folder}}
# Which parts to run (default: all but readwrite, split, split-tuned, resident, processes and
# python): smi topo doctor tests bench check sweep explain managed engine tune torch concurrent
# workload torch-allreduce readwrite split split-tuned resident processes python
steps=${STEPS:-smi topo doctor tests bench check sweep explain managed engine tune torch concurrent workload torch-allreduce}
# How many separate default bench processes to record (bench.json, then bench-2.json, …): three
# show whether the latency medians hold still from run to run.
bench_runs=${BENCH_RUNS:-1}
# The pair that explain, the engine benchmark and the PyTorch side-by-side measure (default: GPU 0 to
# itself; say PAIR="0 1" on a two-GPU host).
read -r src dst <<<"${PAIR:-0 0}"
want() { [[ " $steps " == *" $1 "* ]]; }
# Where the outputs gather before they are packed (WORK= keeps them somewhere known, e.g. to pack them
# yourself when a time limit stops the script).
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
bin=gpu-carry/peerlink
step() { echo "== $*" >&2; }

if want smi; then
step nvidia-smi
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >"$work/nvidia-smi-topo.txt" 2>&1
nvidia-smi -q >"$work/nvidia-smi-q.txt" 2>&1
nvidia-smi nvlink -s >"$work/nvidia-smi-nvlink.txt" 2>&1
fi

if want topo; then
step topo
$bin --gpu topo >"$work/topo.txt" 2>&1
$bin --gpu topo --json >"$work/topo.json" 2>"$work/topo.err"
# NCCL's view of the GPUs and NICs beside peerlink's (NCCL run with NCCL_TOPO_DUMP_FILE).
$bin --gpu topo --nccl >"$work/topo-nccl.txt" 2>&1
$bin --gpu topo --nccl --json >"$work/topo-nccl.json" 2>"$work/topo-nccl.err"
fi

if want doctor; then
step doctor
# Exit 1 means a check failed: what it found is the record, so the status is kept beside it.
$bin --gpu doctor >"$work/doctor.txt" 2>&1
echo "doctor exit: $?" >>"$work/doctor.txt"
$bin --gpu doctor --json >"$work/doctor.json" 2>"$work/doctor.err"
echo "doctor --json exit: $?" >>"$work/doctor.err"
# What doctor reads of this host, for the record (lspci needs no root for the tree).
{ lspci -tv; lspci -vvv; } >"$work/lspci.txt" 2>&1
fi

if want tests; then
step gpu tests
gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture ${GPU_TEST_ARGS:-} >"$work/gpu-tests.log" 2>&1
echo "gpu tests exit: $?" >>"$work/gpu-tests.log"
fi

if want bench; then
step bench
{ time $bin --gpu bench --json >"$work/bench.json" 2>"$work/bench.err"; } 2>"$work/bench.time"
for run in $(seq 2 "$bench_runs"); do
    { time $bin --gpu bench --json >"$work/bench-$run.json" 2>"$work/bench-$run.err"; } \
        2>"$work/bench-$run.time"
done
# Each run's time on eight GPUs by src/bench/budget.rs's formula (each test's wall_s scaled by its
# places, start-up by the GPUs), against the 60 s goal.
runs=("$work/bench.json")
for run in $(seq 2 "$bench_runs"); do runs+=("$work/bench-$run.json"); done
python3 scripts/bench-budget.py "${runs[@]}" --gpus 8 >"$work/bench-budget.txt" 2>&1
$bin --gpu bench >"$work/bench.txt" 2>&1
$bin --gpu bench --tests sm-write,sm-read,ce-bidir-read,sm-bidir-write,staged,staged-bidir,all-to-one,one-to-all \
    --json >"$work/bench-more.json" 2>"$work/bench-more.err"
$bin --gpu bench --tests sm-write,sm-read,ce-bidir-read,sm-bidir-write,staged,staged-bidir,all-to-one,one-to-all \
    >"$work/bench-more.txt" 2>&1
fi

if want check; then
step check
# peerlink check (issue 15) against a default bench of this call (bench.json when the bench step
# ran): three healthy runs (each must exit 0), the text once, then the same baseline made 10%
# faster (must exit 1 naming every test and pair); also against the shipped reference figures and
# against the pair's baseline of an earlier session (benchmarks/h200-x2/bench.json: exit 2 on other
# GPUs). Each file ends with the exit status.
base="$work/bench.json"
if [[ ! -s "$base" ]]; then
    base="$work/check-baseline.json"
    $bin --gpu bench --json >"$base" 2>"$work/check-baseline.err"
fi
python3 scripts/faster-baseline.py "$base" >"$work/check-baseline-faster.json"
checked() {
    local name=$1
    shift
    { time $bin --gpu check "$@" >"$work/check-$name" 2>"$work/check-$name.err"; } \
        2>"$work/check-$name.time"
    echo "exit: $?" >>"$work/check-$name.err"
}
for run in 1 2 3; do
    checked "$run.json" --baseline "$base" --json
done
checked healthy.txt --baseline "$base"
checked faster.json --baseline "$work/check-baseline-faster.json" --json
checked faster.txt --baseline "$work/check-baseline-faster.json"
checked reference.json --json
checked reference.txt
checked earlier-session.txt --baseline benchmarks/h200-x2/bench.json
grep -H "exit:" "$work"/check-*.err
fi

if want sweep; then
step sweep
# Every ordered pair of the GPUs in SWEEP_DEVICES (default: all); on eight GPUs say two, SWEEP_DEVICES=0,1.
sweep_devices=()
[[ -n "${SWEEP_DEVICES:-}" ]] && sweep_devices=(--devices "$SWEEP_DEVICES")
$bin --gpu "${sweep_devices[@]}" bench --sizes 4B..1GiB --tests ce-write,ce-read,sm-write,sm-read,staged \
    --json >"$work/sweep.json" 2>"$work/sweep.err"
$bin --gpu "${sweep_devices[@]}" bench --sizes 4B..1GiB --tests ce-write,ce-read,sm-write,sm-read,staged \
    >"$work/sweep.txt" 2>&1
fi

if want explain; then
step explain
for size in 8B 64KiB 256MiB; do
    $bin --gpu explain --src $src --dst $dst --size $size --json >"$work/explain-$size.json" 2>"$work/explain-$size.err"
    $bin --gpu explain --src $src --dst $dst --size $size >"$work/explain-$size.txt" 2>&1
done
fi

if want managed; then
step "managed memory"
# Unified memory between the GPUs: a kernel on the column GPU reads managed memory whose pages live
# on the row GPU — first touch (faults), after SetAccessedBy, after a prefetch, read-mostly — and
# one page's fault; then GPU $src alone (its pages in host memory); a first-touch and prefetch
# sweep; explain's split of a first touch on the pair.
managed=managed-fault,managed-accessed-by,managed-prefetch,managed-read-mostly,managed-fault-latency
$bin --gpu bench --tests $managed --json >"$work/managed.json" 2>"$work/managed.err"
$bin --gpu bench --tests $managed >"$work/managed.txt" 2>&1
$bin --gpu --devices $src bench --tests $managed --json >"$work/managed-one-gpu.json" \
    2>"$work/managed-one-gpu.err"
$bin --gpu --devices $src bench --tests $managed >"$work/managed-one-gpu.txt" 2>&1
$bin --gpu bench --sizes 64KiB..256MiB --tests managed-fault,managed-prefetch --json \
    >"$work/managed-sweep.json" 2>"$work/managed-sweep.err"
for size in 4MiB 64MiB; do
    $bin --gpu explain --memory managed --src $src --dst $dst --size $size --json \
        >"$work/explain-managed-$size.json" 2>"$work/explain-managed-$size.err"
    $bin --gpu explain --memory managed --src $src --dst $dst --size $size \
        >"$work/explain-managed-$size.txt" 2>&1
done
fi

if want engine; then
step engine
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB --json >"$work/engine-sweep.json" 2>"$work/engine-sweep.err"
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB >"$work/engine-sweep.txt" 2>&1
$bin --gpu plan --src $src --dst $dst --size 4KiB --messages 1000 --prove --json >"$work/engine-batch.json" 2>"$work/engine-batch.err"
$bin --gpu plan --src $src --dst $dst --size 4KiB --messages 1000 --prove >"$work/engine-batch.txt" 2>&1
$bin --gpu plan --src $src --dst $dst --size 256MiB --prove --json >"$work/engine-256MiB.json" 2>"$work/engine-256MiB.err"
$bin --gpu plan --src $src --dst $dst --size 1GiB --prove --json >"$work/engine-1GiB.json" 2>"$work/engine-1GiB.err"
$bin --gpu plan --src $src --dst $dst --size 1GiB --prove >"$work/engine-1GiB.txt" 2>&1
$bin --gpu plan --src $src --dst $dst --size 256MiB --prove >"$work/engine-256MiB.txt" 2>&1
fi

if want tune; then
step tune
{ time $bin --gpu tune --out "$work/profile.json" --export-sim "$work/exported-sim.json" >"$work/tune.txt" 2>&1; } 2>"$work/tune.time"
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB --profile "$work/profile.json" --json \
    >"$work/engine-sweep-profile.json" 2>"$work/engine-sweep-profile.err"
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB --profile "$work/profile.json" \
    >"$work/engine-sweep-profile.txt" 2>&1
# The simulator on the exported preset against this machine, test by test, at the GPU bench's sizes
# (each test's plateau).
$bin --sim "$work/exported-sim.json" bench --size plateau --json >"$work/exported-sim-bench.json" \
    2>"$work/exported-sim-bench.err"
if [[ -s "$work/bench.json" ]]; then
    $bin compare "$work/bench.json" "$work/exported-sim-bench.json" >"$work/compare-sim.txt" 2>&1
    $bin compare "$work/bench.json" "$work/exported-sim-bench.json" --json >"$work/compare-sim.json" 2>&1
fi
# …and against each other bench run of this call (BENCH_RUNS), beside the runs' own spread.
for run in $(seq 2 "$bench_runs"); do
    [[ -s "$work/bench-$run.json" ]] || continue
    $bin compare "$work/bench-$run.json" "$work/exported-sim-bench.json" >"$work/compare-sim-$run.txt" 2>&1
    $bin compare "$work/bench.json" "$work/bench-$run.json" >"$work/compare-runs-1-$run.txt" 2>&1
done
fi

if want torch; then
step "torch side by side (pair $src $dst)"
# peerlink's side: the engine sweep at the same pair, planned with this host's profile where tune ran.
sweep="$work/engine-sweep-profile.json"
[[ -s "$sweep" ]] || sweep="$work/engine-sweep.json"
[[ -s "$sweep" ]] ||
    $bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB --json >"$sweep" 2>"$work/engine-sweep.err"
python3 scripts/torch-side-by-side.py --src $src --dst $dst --peerlink "$sweep" \
    --out "$work/side-by-side.json" >"$work/side-by-side.txt" 2>&1
fi

if want concurrent; then
step "concurrent traffic"
# Every GPU sending at once needs two GPUs at least.
if (($(nvidia-smi -L | grep -c '^GPU') >= 2)); then
    for traffic in shift shift:2; do
        for size in 1MiB 256MiB; do
            $bin --gpu plan --concurrent $traffic --size $size --json \
                >"$work/concurrent-$traffic-$size.json" 2>"$work/concurrent-$traffic-$size.err"
            $bin --gpu plan --concurrent $traffic --size $size >"$work/concurrent-$traffic-$size.txt" 2>&1
        done
    done
else
    echo "one GPU: no concurrent traffic to run" >"$work/concurrent.txt"
fi
fi

if want readwrite; then
step "read against write"
# Is ce-read's gap to ce-write the link or the measurement? By size (a fixed cost per copy shrinks
# with it, a lower rate does not), with buffers rotated over 1 GiB (no cache can serve them), with
# four times the warm-up, in the other order (drift), and at 512 MiB with more samples; the matrices'
# two cells say whether one GPU's copy engines pull slower.
rw() { $bin --gpu --devices "${src},${dst}" bench --json "$@"; }
rw --tests ce-write,ce-read,sm-write,sm-read --sizes 64MiB,128MiB,256MiB,512MiB,1GiB \
    >"$work/rw-sweep.json" 2>"$work/rw-sweep.err"
rw --tests ce-write,ce-read --size 64MiB >"$work/rw-64MiB.json" 2>"$work/rw-64MiB.err"
rw --tests ce-read,ce-write --size 64MiB >"$work/rw-64MiB-read-first.json" 2>"$work/rw-read-first.err"
rw --tests ce-write,ce-read --size 64MiB --rotation 1GiB >"$work/rw-64MiB-rotated.json" \
    2>"$work/rw-rotated.err"
rw --tests ce-write,ce-read --size 64MiB --warmup 16 >"$work/rw-64MiB-warm.json" 2>"$work/rw-warm.err"
rw --tests ce-write,ce-read,ce-bidir-write,ce-bidir-read --size 512MiB --samples 9 \
    >"$work/rw-512MiB.json" 2>"$work/rw-512MiB.err"
fi

if want split; then
step "NVLink and the host route at once (issue 11.6)"
# The split against a direct copy (one way, both ways, each route's share alone) and the copies it is
# made of side by side; then the engine's own proofs at the sizes of the issue's goals.
gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture \
    split_over_nvlink_and_the_host_against_direct nvlink_copy_beside_host_copies \
    >"$work/split-gpu-tests.log" 2>&1
echo "gpu tests exit: $?" >>"$work/split-gpu-tests.log"
for size in 256MiB 1GiB; do
    $bin --gpu plan --src $src --dst $dst --size $size --prove >"$work/split-engine-$size.txt" 2>&1
    $bin --gpu plan --concurrent shift --size $size >"$work/split-concurrent-$size.txt" 2>&1
done
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB >"$work/split-engine-sweep.txt" 2>&1
fi

if want split-tuned; then
step "the split planned from a profile that measured the host route beside NVLink (issue 11.6)"
# tune runs splits at 256 MiB and 1 GiB and fits how the host route runs beside the direct copy (its
# table says where each route ended, planned with the estimate and with the fit); the engine's
# proofs then plan from that profile: each route's end (within 3% is balanced), one way and both
# ways (tune also runs both directions' splits at once and fits the host route's fraction both
# ways; plan --concurrent plans each flow both ways), and the engine sweep's regret at every size.
{ time $bin --gpu tune --out "$work/profile-split.json" >"$work/tune-split.txt" 2>&1; } \
    2>"$work/tune-split.time"
gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture a_timed_split_tells_when_each_route_ended \
    >"$work/split-route-ends.log" 2>&1
echo "gpu tests exit: $?" >>"$work/split-route-ends.log"
tuned=(--profile "$work/profile-split.json")
for size in 256MiB 1GiB; do
    $bin --gpu plan --src $src --dst $dst --size $size --prove "${tuned[@]}" \
        >"$work/split-tuned-engine-$size.txt" 2>&1
    $bin --gpu plan --src $src --dst $dst --size $size --prove "${tuned[@]}" --json \
        >"$work/split-tuned-engine-$size.json" 2>"$work/split-tuned-engine-$size.err"
    $bin --gpu plan --concurrent shift --size $size "${tuned[@]}" \
        >"$work/split-tuned-concurrent-$size.txt" 2>&1
    # Both ways priced with the estimated fraction (no profile), beside the tuned one's fit.
    $bin --gpu plan --concurrent shift --size $size >"$work/split-estimate-concurrent-$size.txt" 2>&1
done
$bin --gpu plan --src $src --dst $dst --sizes 4B..1GiB "${tuned[@]}" \
    >"$work/split-tuned-engine-sweep.txt" 2>&1
# The engine's split against direct planned from the same profile (every byte checked; it prints
# where GPU 0 → 1's routes ended).
PEERLINK_TEST_PROFILE="$work/profile-split.json" gpu-carry/gpu-tests --ignored --test-threads=1 \
    --nocapture --exact engine::split_over_nvlink_and_the_host_against_direct \
    >"$work/split-tuned-engine-test.log" 2>&1
echo "gpu tests exit: $?" >>"$work/split-tuned-engine-test.log"
fi

if want workload; then
step "workloads beside NCCL"
# Each workload in both issue modes (host-queued behind gates, and CUDA graphs), 4 B to 1 GiB.
workload() {
    local name=$1
    shift
    { time $bin --gpu workload "$@" --issue both --json >"$work/workload-$name.json" \
        2>"$work/workload-$name.err"; } 2>"$work/workload-$name.time"
}
workload all-reduce-f32 all-reduce --dtype f32
workload all-reduce-bf16 all-reduce --dtype bf16
workload send-recv send-recv --direction all
workload pipeline pipeline
workload halo halo
fi

if want torch-allreduce; then
step "all-reduce through PyTorch (NCCL, SymmetricMemory)"
# One process per GPU; the graph-captured NCCL loop runs in a process of its own, so that a capture
# that fails cannot leave the others' NCCL in a bad state.
for dtype in f32 bf16; do
    timeout 240 python3 scripts/torch-allreduce.py --dtype $dtype \
        --contenders nccl,symm-one-shot,symm-two-shot --out "$work/torch-allreduce-$dtype.json" \
        >"$work/torch-allreduce-$dtype.txt" 2>&1
    timeout 120 python3 scripts/torch-allreduce.py --dtype $dtype --contenders nccl-graph \
        --port 29533 --out "$work/torch-allreduce-graph-$dtype.json" \
        >"$work/torch-allreduce-graph-$dtype.txt" 2>&1
done
fi

if want resident; then
step "resident workers (issue 14)"
# The GPU tests' figures (latency and its parts, host time per submit and per poll, bandwidth by SM
# share, 1000 x 4 KiB in one call, 10^5 random transfers, the cost to compute, the process tests),
# then bench's and the engine's view of the same path.
gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture resident >"$work/resident-tests.log" 2>&1
echo "resident tests exit: $?" >>"$work/resident-tests.log"
$bin --gpu bench --tests resident-latency,resident-write --json >"$work/resident-bench.json" \
    2>"$work/resident-bench.err"
$bin --gpu bench --tests resident-write --sizes 4KiB..64MiB >"$work/resident-sweep.txt" 2>&1
$bin --gpu plan --src $src --dst $dst --sizes 4B..64MiB --resident >"$work/resident-plan-sweep.txt" 2>&1
$bin --gpu plan --src $src --dst $dst --size 4KiB --messages 1000 --resident --prove \
    >"$work/resident-plan-batch.txt" 2>&1
$bin --gpu explain --src $src --dst $dst --size 8B >"$work/resident-explain-8B.txt" 2>&1
fi

if want processes; then
step "across processes (issue 17.2)"
# One process per GPU through peerlink launch: the rank that issues each copy opens the other
# process's buffer (CUDA IPC), every byte checked; then the single-process bench of the same tests
# beside it, and the GPU tests of sharing between processes (IPC, shared host memory, engine
# strategies, a rank killed mid-bench).
crossing=ce-write,ce-read,sm-write,sm-read,staged
{ time $bin launch -n 2 --timeout 300 -- --gpu bench --json --tests $crossing \
    >"$work/processes-bench.json" 2>"$work/processes-bench.err"; } 2>"$work/processes-bench.time"
echo "launch exit: $?" >>"$work/processes-bench.err"
$bin launch -n 2 --timeout 300 -- --gpu bench --tests $crossing >"$work/processes-bench.txt" 2>&1
$bin --gpu --devices 0,1 bench --json --tests $crossing >"$work/processes-alone.json" \
    2>"$work/processes-alone.err"
# workload send-recv across the two processes: the engine pushing into the other process's
# memory beside NCCL through a communicator across processes (ncclCommInitRank), then the same
# sweep in one process.
timeout 570 $bin launch -n 2 --timeout 300 -- --gpu workload send-recv --max-size 256MiB --json \
    >"$work/processes-workload.json" 2>"$work/processes-workload.err"
echo "launch exit: $?" >>"$work/processes-workload.err"
$bin --gpu --devices 0,1 workload send-recv --max-size 256MiB --json \
    >"$work/processes-workload-alone.json" 2>"$work/processes-workload-alone.err"
PEERLINK_BIN=$bin gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture processes \
    >"$work/processes-tests.log" 2>&1
echo "processes tests exit: $?" >>"$work/processes-tests.log"
fi

if want python; then
step "the Python package against PyTorch (issue 18, pair $src $dst)"
# The wheel scripts/gpu-build.sh built, installed beside the image's PyTorch (no network here).
python3 -m pip install --no-index --force-reinstall gpu-carry/peerlink-*.whl \
    >"$work/python-install.txt" 2>&1
timeout 570 python3 python/benchmarks/torch_side_by_side.py --src $src --dst $dst \
    --out "$work/python-side-by-side.json" >"$work/python-side-by-side.txt" 2>&1
echo "python side by side exit: $?" >>"$work/python-side-by-side.txt"
fi

tar czf "$dest/results.tgz" -C "$work" .
cd "$work"
grep -hE "test result|random transfers|gpu tests exit" gpu-tests.log 2>/dev/null
grep -hE "test result|across processes:|processes tests exit" processes-tests.log 2>/dev/null
grep -hE "^(FAIL|WARN|INFO) |fail, .* ok|doctor exit" doctor.txt 2>/dev/null
cat engine-batch.txt engine-256MiB.txt tune.time 2>/dev/null
grep -h "gap:" explain-*.txt 2>/dev/null
tail -n 4 engine-sweep.txt engine-sweep-profile.txt 2>/dev/null
# The tuned split: where each route ended and how far apart, one way and both ways, and the regret.
grep -hE "^(fitted|the routes planned)|ended .* apart|split \(pick\)|aggregate|regret" \
    tune-split.txt split-tuned-*.txt 2>/dev/null
cat ./*.err 2>/dev/null | head -20
