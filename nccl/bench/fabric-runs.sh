#!/usr/bin/env bash
# The runs of the multi-GPU issues (two H200s: #35; four or eight: #36) on every GPU of the host, in
# parts that each fit one device call; on one H200 they rehearse the same commands with one rank.
#   fabric-runs.sh CARRY OUT PART...
# CARRY holds peerlink, libpeerlink_nccl.so and nccl-tests/ (gpu-carry/nccl/nccl-tests);
# OUT/<part>/ gets one log per run (its command first, its stdout and stderr, its exit status).
# Parts:
#   check     all_reduce_perf -d all/float/bfloat16/half -o all -c 1, 4 B–1 GiB: through the library (SERVE=all) and
#             on NCCL alone, each in NCCL's default mode and with -R 2 (symmetric windows); -d float
#             also captured into graphs (-G 10, plain and -R 2)
#   speed     -d float and -d bfloat16, 4 B–1 GiB, -c 1: NCCL alone and the library (SERVE=all) in
#             each of NCCL's modes (default, -R 2, -G 100, -R 2 -G 100): like with like
#   threads   all_reduce_perf -t N -g 1 (a thread per GPU, each a rank), plain and -R 2 (the library
#             adopts each thread's symmetric windows): -d float -o all -c 1, and the speed sweep
#   train     python/benchmarks/train_job.py under torchrun, DDP and FSDP, without and with the
#             library (NCCL alone twice, for the run-to-run spread), and the losses compared
#   workload  peerlink workload all-reduce f32 and bf16, streams and graphs (--issue both), in one
#             process and under peerlink launch -n N
# Look for "#wrong 0" and "Out of bounds values : 0 OK" in every nccl-tests log, and the library's
# summary ("calls at exit") for what it served.
source "$(dirname "$0")/common.sh" "$1" "$2"
shift 2
repo=$(pwd)
gpus=$(nvidia-smi -L | wc -l)
echo "$gpus GPU(s)" >>$logs/machine.txt

# run LOG COMMAND...: the command, then its output and exit status, into LOG.
run() {
    local log=$1
    shift
    echo "\$ $*" >"$log"
    "$@" >>"$log" 2>&1
    echo "exit status $?" >>"$log"
}

# perf NAME LIBRARY? ARGS...: all_reduce_perf on every GPU in one process (one thread driving
# them all, or one thread per GPU where $layout says "-t N -g 1"), through the library where the
# second word is "lib" (SERVE=all), else on NCCL alone.
layout="-g $gpus"
perf() {
    local name=$1 through=$2
    shift 2
    local preload=()
    [[ $through == lib ]] && preload=(env LD_PRELOAD=$library PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO)
    run "$dir/$name.log" "${preload[@]}" /tmp/nccl-tests/build/all_reduce_perf $layout "$@"
    # Rows whose #wrong (out of place, in place) is not 0.
    local wrong=$(awk '/^ +[0-9]/ { rows++; if ($9 != 0 && $9 != "N/A") bad++; if ($13 != 0 && $13 != "N/A") bad++ }
        END { printf "%d rows, %d with a wrong count", rows, bad }' "$dir/$name.log")
    echo "$name: $wrong; $(tail -n 1 "$dir/$name.log"); $(grep -h 'calls at exit' "$dir/$name.log")"
}

for part in "$@"; do
    dir=$out/$part && mkdir -p "$dir" && cp $logs/machine.txt "$dir/"
    case $part in
    check)
        # -d all -o all stops at f8e4m3 with avg, which NCCL itself refuses ("invalid argument",
        # NCCL alone too): the served types run alone as well, every operation.
        for through in nccl lib; do
            for mode in "" "-R 2"; do
                for type in all float bfloat16 half; do
                    perf "check_${type}_${through}${mode:+_R2}" $through -b 4 -e 1G -f 4 -d $type -o all -c 1 $mode
                done
            done
            # Captured: every timed iteration a replay of a CUDA graph (-G 10), plain and in windows.
            for mode in "-G 10" "-R 2 -G 10"; do
                tag=$(echo "$mode" | tr -d ' -')
                perf "check_float_${through}_${tag}" $through -b 4 -e 1G -f 4 -d float -o all -c 1 $mode
            done
        done
        ;;
    threads)
        # One thread per GPU, each a rank (lone calls through the ranks' shared buffers), and with
        # -R 2 each thread's symmetric windows, which the library adopts and sums in place.
        layout="-t $gpus -g 1"
        for mode in "" "-R 2"; do
            tag=$(echo "$mode" | tr -d ' -')
            for through in nccl lib; do
                perf "threads_check_${through}${tag:+_$tag}" $through -b 4 -e 1G -f 4 -d float -o all -c 1 $mode
                perf "threads_speed_${through}${tag:+_$tag}" $through -b 4 -e 1G -f 2 -d float -o sum -c 1 -w 5 -n 20 $mode
            done
        done
        layout="-g $gpus"
        ;;
    speed)
        for type in float bfloat16; do
            for mode in "" "-R 2" "-G 100" "-R 2 -G 100"; do
                tag=$(echo "$mode" | tr -d ' -')
                for through in nccl lib; do
                    perf "speed_${type}_${through}${tag:+_$tag}" $through -b 4 -e 1G -f 2 -d $type -o sum -c 1 -w 5 -n 20 $mode
                done
            done
        done
        ;;
    train)
        # NCCL alone twice: how far two runs of the same job are apart before the library is in it.
        for mode in ddp fsdp; do
            for run_as in nccl nccl_again lib; do
                preload=()
                [[ $run_as == lib ]] && preload=(env LD_PRELOAD=$library PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO)
                run "$dir/${mode}_$run_as.log" "${preload[@]}" torchrun --nproc-per-node $gpus \
                    "$repo/python/benchmarks/train_job.py" --mode $mode --out "$dir/${mode}_$run_as.json"
            done
            for other in nccl_again lib; do
                python3 "$repo/python/benchmarks/train_job.py" --compare "$dir/${mode}_nccl.json" \
                    "$dir/${mode}_$other.json" >"$dir/${mode}_compare_$other.txt" 2>&1
                echo "$mode, NCCL against ${other/_/ }: $(cat "$dir/${mode}_compare_$other.txt")"
            done
        done
        ;;
    workload)
        for dtype in f32 bf16; do
            run "$dir/one_${dtype}.log" "$carry/peerlink" --gpu workload all-reduce --dtype $dtype \
                --issue both --export-json "$dir/one_${dtype}.json"
            [[ $gpus -gt 1 ]] && run "$dir/launch_${dtype}.log" "$carry/peerlink" launch -n $gpus \
                --timeout 120 -- --gpu workload all-reduce --dtype $dtype --issue both \
                --export-json "$dir/launch_${dtype}.json"
        done
        tail -n 3 "$dir"/*.log
        ;;
    *) echo "fabric-runs: no part $part (check, speed, train, workload)" >&2 ;;
    esac
done
