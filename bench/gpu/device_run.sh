#!/usr/bin/env bash
# The one command to run on the GPU machine: bash device_run.sh PACK.tar.gz
#
# Stages, each under its own `timeout`, each writing its files under $OUT as it goes (one
# flushed line per kernel), so a stage that hangs or is killed loses nothing already written:
#   env-before   nvidia-smi (clocks, driver), torch, CUDA and compute-sanitizer versions
#   dry-run      every library loads and asks for its own cubin (no launch)
#   smoke        one data-parallel kernel per schedule source: the first real cubin load and
#                launch, checked; on failure, `diagnose` (CUDA_LAUNCH_BLOCKING=1, faulthandler,
#                libraries, cubin digests) and stop
#   sweep        every kernel checked and timed, data-parallel and Stream-K interleaved per
#                shape, until SWEEP_BUDGET seconds are spent (RESUME_FROM=results.jsonl of
#                an earlier call: only the kernels it has no record of)
#   sanitize     memcheck, racecheck, synccheck, initcheck on the marked kernels (or the
#                SANITIZE_ONLY=NAMES ones; SANITIZE_TOOLS=... picks the tools), bounded
#   initcheck    (INITCHECK_ONLY=NAMES) initcheck alone on the named kernels, bounded
#   profile      (PROFILE_ONLY=NAMES) Nsight Compute on the named kernels, bounded
#   env-after    the clocks again
# The stage limits below sum to the worst case of the whole command (bench/README.md).
#
# ARCHIVE=PATH.tar.gz: keep a copy of the whole $OUT folder in that one archive, rewritten
# after every stage and every ARCHIVE_EVERY seconds in between (a temporary file, then a
# rename: never half written). The device tool brings back at most 8 files from its $OUT and
# a run writes about 15, so there the call is
#   ARCHIVE=$OUT/gpu-out.tar.gz OUT=/tmp/gpu-out bash bench/gpu/device_run.sh PACK.tar.gz
# and a command killed at its limit still returns everything up to the last rewrite.
set -u

PACK_TGZ=${1:?usage: bash device_run.sh PACK.tar.gz}
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-$(mktemp -d /tmp/sk-pack.XXXXXX)}
PYTHON=${PYTHON:-python3}
# Each stage's limit in seconds; `timeout` adds up to KILL_S to a stage that ignores SIGTERM.
UNPACK_S=${UNPACK_S:-15}
ENV_S=${ENV_S:-20}
DRY_RUN_S=${DRY_RUN_S:-40}
SMOKE_S=${SMOKE_S:-60}
DIAGNOSE_S=${DIAGNOSE_S:-45}
SWEEP_BUDGET=${SWEEP_BUDGET:-160}
SWEEP_S=${SWEEP_S:-$((SWEEP_BUDGET + 30))}
SANITIZE_BUDGET=${SANITIZE_BUDGET:-90}
SANITIZE_S=${SANITIZE_S:-$((SANITIZE_BUDGET + 10))}
SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck,racecheck,synccheck,initcheck}
SANITIZE_ONLY=${SANITIZE_ONLY:-}
TOOL_TIMEOUT=${TOOL_TIMEOUT:-60}
INITCHECK_ONLY=${INITCHECK_ONLY:-}
INITCHECK_BUDGET=${INITCHECK_BUDGET:-150}
PROFILE_ONLY=${PROFILE_ONLY:-}
PROFILE_BUDGET=${PROFILE_BUDGET:-120}
KILL_S=5
ARCHIVE=${ARCHIVE:-}
ARCHIVE_EVERY=${ARCHIVE_EVERY:-15}
KERNEL_TIMEOUT=${KERNEL_TIMEOUT:-30}

mkdir -p "$OUT" "$WORK"
LOG="$OUT/stages.log"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

# stage NAME LIMIT_S COMMAND...: the command's output to $OUT/NAME.log; its exit status.
stage() {
    local name=$1 limit=$2
    shift 2
    say "stage $name (limit ${limit}s): $*"
    timeout --kill-after="$KILL_S" "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    say "stage $name exit $rc$([ $rc -eq 124 ] && echo ' (time limit)')"
    archive
    return $rc
}

# The folder $OUT into $ARCHIVE, atomically; nothing without ARCHIVE.
archive() {
    [ -n "$ARCHIVE" ] || return 0
    tar -czf "$ARCHIVE.part" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null &&
        mv -f "$ARCHIVE.part" "$ARCHIVE"
}

environment() {
    {
        echo "## nvidia-smi"
        nvidia-smi 2>&1
        echo "## nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE"
        nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE 2>&1
        echo "## compute-sanitizer --version"
        compute-sanitizer --version 2>&1
        echo "## python"
        "$PYTHON" --version 2>&1
    }
    "$PYTHON" "$PACK/run.py" env --out "$1"
}

if [ -n "$ARCHIVE" ]; then
    mkdir -p "$(dirname "$ARCHIVE")"
    # Between stages too: a stage killed at the command's limit keeps what it had flushed.
    # The loop ends with this script ($$ is its PID in the subshell too), even where a SIGKILL
    # skips the EXIT trap: it outlived its test run once, archiving every 15 s for an hour.
    ( while sleep "$ARCHIVE_EVERY" && kill -0 "$$" 2>/dev/null; do archive; done ) &
    ARCHIVER=$!
    trap 'kill $ARCHIVER 2>/dev/null; archive' EXIT
fi
say "device_run.sh: pack $PACK_TGZ, out $OUT, work $WORK"
stage unpack "$UNPACK_S" tar -xzf "$PACK_TGZ" -C "$WORK" || { say "cannot unpack"; exit 2; }
PACK=$(dirname "$(find "$WORK" -maxdepth 2 -name manifest.json | head -1)")
[ -f "$PACK/run.py" ] || { say "no run.py in the pack"; exit 2; }
export -f environment
export PACK PYTHON

stage env-before "$ENV_S" bash -c 'environment "$0"' "$OUT/env-before.json"
stage dry-run "$DRY_RUN_S" "$PYTHON" "$PACK/run.py" dry-run --out "$OUT/dry-run.json"
if ! stage smoke "$SMOKE_S" "$PYTHON" "$PACK/run.py" smoke --out "$OUT/smoke.jsonl" \
        --kernel-timeout "$KERNEL_TIMEOUT"; then
    stage diagnose "$DIAGNOSE_S" env CUDA_LAUNCH_BLOCKING=1 \
        "$PYTHON" -X faulthandler "$PACK/run.py" diagnose --out "$OUT/diagnose.jsonl"
    stage env-after "$ENV_S" bash -c 'environment "$0"' "$OUT/env-after.json"
    say "smoke failed: stopped after the diagnosis (diagnose.log, diagnose.jsonl)"
    exit 1
fi
if [ -n "${RESUME_FROM:-}" ] && [ -f "$RESUME_FROM" ]; then
    cp "$RESUME_FROM" "$OUT/results.jsonl"
    say "resuming the sweep from $RESUME_FROM"
fi
stage sweep "$SWEEP_S" "$PYTHON" "$PACK/run.py" sweep --out "$OUT/results.jsonl" \
    --budget "$SWEEP_BUDGET" --kernel-timeout "$KERNEL_TIMEOUT" --skip-done
sweep_rc=$?
stage sanitize "$SANITIZE_S" "$PYTHON" "$PACK/run.py" sanitize --out "$OUT/sanitizer.jsonl" \
    --budget "$SANITIZE_BUDGET" --tools "$SANITIZE_TOOLS" --tool-timeout "$TOOL_TIMEOUT" \
    ${SANITIZE_ONLY:+--only "$SANITIZE_ONLY"}
sanitize_rc=$?
if [ -n "$INITCHECK_ONLY" ]; then
    stage initcheck $((INITCHECK_BUDGET + 10)) "$PYTHON" "$PACK/run.py" sanitize \
        --out "$OUT/initcheck.jsonl" --only "$INITCHECK_ONLY" --tools initcheck \
        --budget "$INITCHECK_BUDGET" --tool-timeout "$INITCHECK_BUDGET" || sanitize_rc=1
fi
if [ -n "$PROFILE_ONLY" ]; then
    stage profile $((PROFILE_BUDGET + 10)) "$PYTHON" "$PACK/run.py" profile \
        --out "$OUT/profile.jsonl" --only "$PROFILE_ONLY" --budget "$PROFILE_BUDGET"
fi
stage env-after "$ENV_S" bash -c 'environment "$0"' "$OUT/env-after.json"
cp "$PACK/manifest.json" "$OUT/manifest.json"
say "done: sweep exit $sweep_rc, sanitize exit $sanitize_rc"
[ $sweep_rc -eq 0 ] && [ $sanitize_rc -eq 0 ]
