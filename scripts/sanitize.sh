#!/usr/bin/env bash
# Runs every kernel peerlink launches under compute-sanitizer (issue 13, point 9): memcheck,
# racecheck and synccheck over the GPU tests that exercise them, at small sizes, on one GPU and on
# two. Runs on the GPU host from the repository root, with gpu-carry/ built by scripts/gpu-build.sh
# (no cargo there; the CUDA toolkit's compute-sanitizer attaches to the test binary, which loads
# libcuda at run time).
#
#   scripts/sanitize.sh [OUTPUT]      (default OUTPUT: $OUT, the device tool's output folder)
#
# Writes OUTPUT/verdicts.txt, one line per tool and GPU set ("clean", or what was found), and
# OUTPUT/sanitize.tgz with every log: <tool>-gpus<set>.sanitizer.log (the tool's report) and
# <tool>-gpus<set>.tests.log (the tests' own output). Exit status 0 when every verdict is clean.
#
# Environment:
#   SANITIZE_TESTS  exact test names to run instead of the default list below (space-separated);
#                   a new kernel's GPU test goes into that list, so that it is checked the same way
#   TOOLS           the tools (default: memcheck racecheck synccheck; initcheck also works)
#   GPU_SETS        CUDA_VISIBLE_DEVICES of each run (default: "0 0,1"; a set of one GPU is skipped
#                   by the tests that need two, which then pass without checking)
#   RUN_TIMEOUT     seconds one tool may take over all tests on one GPU set (default 900)
#   COMPUTE_SANITIZER  the sanitizer binary (default: on PATH, else /usr/local/cuda/bin)
#
# Each kernel and the tests that launch it (copy.cu, latency.cu, spin.cu, collective.cu, resident.cu):
#   copy_bytes       sm copies on one GPU and between two, in captured graphs, the engine's
#                    SM strategies
#   copy_batch       batches on one GPU and between two, the engine's prepared batches and graphs
#                    (shared memory and __syncthreads: what racecheck and synccheck look at)
#   spin_until_released   the gate that holds a stream until the host releases it
#   pointer_chase, ping/pong   the latency probes (ping-pong spins on a flag the other GPU sets)
#   all_reduce one-shot, two-shot and one-shot-packets (f32, bf16), called fifty times on the
#                    same flags, packets of changing sizes, replayed from graphs (the ranks spin on each other's flags; __syncthreads)
#   busy             the stand-in compute kernel
#   resident_worker  a resident worker: its dispatcher and copy blocks moving single transfers
#                    and batches, a doorbell behind a held stream and behind a copy-engine copy,
#                    a ring of 32 slots wrapping round
#                    (shared memory, __syncthreads and __syncwarp in both; it spins until stopped)
# The sizes are the contract's: up to 1 MiB per rank, 64 KiB copies, 2000 messages of 97 bytes; the
# engine's test moves 48 MiB once per strategy.
#
# Options, and why:
#   --error-exitcode 86      tells a sanitizer finding apart from a failed test (101) and from a
#                            run cut short by RUN_TIMEOUT (124)
#   --require-cuda-init no   a test that checks nothing on this GPU set (a collective on one GPU)
#                            may never initialise CUDA: not an error
#   memcheck: --leak-check full      device memory still allocated when a context goes is a leak
#             --report-api-errors no the tests provoke failing API calls on purpose (an allocation
#                                    beyond what is free, peer access a pair lacks, polling an
#                                    event that is not done): the kernels are what is checked here
#   racecheck: --racecheck-report analysis  (its default, said out loud) one line per hazard found;
#                            racecheck looks at shared memory only: copy_batch is the kernel that
#                            uses it; the flags the spin kernels poll are global memory, which
#                            racecheck does not track
#   synccheck: defaults; it checks __syncthreads in copy_batch and the all-reduce kernels
#   Not --force-blocking-launches: a blocking launch of a kernel that spins until the host or
#   another GPU releases it (the gate, ping-pong, all-reduce flags) waits for a release that can
#   only come after the launch returns. Every such kernel gives up on its own (a gate after 5 s, a
#   peer after 10 s), so a tool that holds the other side back shows as a failed test with that
#   sentence in the tests' log ("gave up"), listed in the verdict apart from sanitizer findings.
set -uo pipefail

dest=${1:-${OUT:?give an output folder}}
mkdir -p "$dest"
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
tools=${TOOLS:-memcheck racecheck synccheck}
gpu_sets=${GPU_SETS:-0 0,1}
run_timeout=${RUN_TIMEOUT:-900}
tests_binary=gpu-carry/gpu-tests
default_tests=(
    cuda_contract::sm_copies_move_exactly_their_range
    cuda_contract::peer_copies_move_bytes_pushed_and_pulled
    cuda_contract::copy_batch_moves_every_message
    cuda_contract::batches_move_messages_between_gpus
    cuda_contract::a_captured_graph_replays_its_work_and_the_capture_runs_none
    cuda_contract::a_gate_keeps_work_back_until_its_release
    cuda_contract::a_pointer_chase_ends_where_a_host_walk_does
    cuda_contract::a_ping_pong_leaves_both_flags_at_the_round_count
    cuda_contract::all_reduce_sums_every_input_into_every_output
    cuda_contract::fifty_all_reduces_in_a_row_on_the_same_flags_each_sum_their_own_inputs
    cuda_contract::a_captured_all_reduce_replays_on_every_rank_and_the_capture_runs_none
    cuda_contract::packet_all_reduces_of_changing_sizes_read_only_their_own_packets
    cuda_contract::busy_keeps_its_stream_for_at_least_its_duration
    cuda_contract::resident_transfers_move_exactly_their_range
    cuda_contract::a_batch_moves_every_message_as_one_ticket
    cuda_contract::a_doorbell_holds_a_transfer_until_its_stream_gets_there
    cuda_contract::a_full_ring_holds_submitters_back_and_wraps_round
    resident::resident_doorbells_rung_behind_a_copy_engine_copy
    engine::batches_and_prepared_batches_deliver_every_message
    engine::every_usable_strategy_moves_every_byte
)
if [[ -n "${SANITIZE_TESTS:-}" ]]; then
    read -r -a tests <<<"$SANITIZE_TESTS"
else
    tests=("${default_tests[@]}")
fi

if [[ ! -x "$tests_binary" ]]; then
    echo "sanitize: $tests_binary is missing: run scripts/gpu-build.sh first" >&2
    exit 2
fi
if [[ ! -x "$sanitizer" ]]; then
    echo "sanitize: no compute-sanitizer at $sanitizer (set COMPUTE_SANITIZER)" >&2
    exit 2
fi

work=$(mktemp -d)
verdicts="$work/verdicts.txt"
{
    echo "# compute-sanitizer over peerlink's GPU tests, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# $("$sanitizer" --version 2>&1 | grep -i version | head -n 1)"
    echo "# $(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tr '\n' ';')"
    echo "# tests: ${tests[*]}"
} >"$verdicts"

options() {
    case $1 in
    memcheck) echo "--leak-check full --report-api-errors no" ;;
    racecheck) echo "--racecheck-report analysis" ;;
    *) echo "" ;;
    esac
}

all_clean=1
for gpus in $gpu_sets; do
    for tool in $tools; do
        name="$tool-gpus${gpus//,/+}"
        sanitizer_log="$work/$name.sanitizer.log"
        tests_log="$work/$name.tests.log"
        echo "== $tool on GPUs $gpus" >&2
        # shellcheck disable=SC2046 # the tool's options are words
        CUDA_VISIBLE_DEVICES=$gpus timeout "$run_timeout" "$sanitizer" --tool "$tool" \
            --error-exitcode 86 --require-cuda-init no --log-file "$sanitizer_log" $(options "$tool") \
            "$tests_binary" --ignored --exact --test-threads=1 --nocapture "${tests[@]}" \
            >"$tests_log" 2>&1
        status=$?
        # What the tool found: memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck
        # with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
        summary=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$sanitizer_log" 2>/dev/null | tail -n 1 |
            sed 's/^=* *//')
        passed=$(sed -n 's/^test result: .*\. \([0-9]*\) passed.*/\1/p' "$tests_log" | tail -n 1)
        failed=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$tests_log" | tr '\n' ' ')
        gave_up=$(grep -c "gave up" "$tests_log")
        if grep -q "Device not supported" "$sanitizer_log" "$tests_log" 2>/dev/null; then
            verdict="not run: compute-sanitizer does not support this machine's GPUs (a gVisor machine?)"
        elif ((status == 0)) && [[ "${passed:-0}" == "${#tests[@]}" ]]; then
            verdict="clean: ${summary:-no summary}; ${passed} of ${#tests[@]} tests passed"
        else
            case $status in
            86) why="FINDINGS" ;;
            124) why="CUT SHORT after ${run_timeout} s" ;;
            0) why="INCOMPLETE (a test name matched nothing?)" ;;
            *) why="TESTS FAILED (exit $status)" ;;
            esac
            verdict="$why: ${summary:-no summary}; ${passed:-0} of ${#tests[@]} tests passed"
            [[ -n "$failed" ]] && verdict+="; failed: $failed"
            ((gave_up > 0)) && verdict+="; a spin kernel gave up waiting ($gave_up lines, see the tests' log)"
        fi
        [[ "$verdict" == clean:* ]] || all_clean=0
        echo "$tool on GPUs $gpus: $verdict" | tee -a "$verdicts" >&2
    done
done

cp "$verdicts" "$dest/verdicts.txt"
tar czf "$dest/sanitize.tgz" -C "$work" .
((all_clean)) && exit 0 || exit 1
