#!/usr/bin/env bash
# tests/test_fuzz.sh BUILD_DIR: build the libFuzzer targets (fuzz/build.sh, clang with
# AddressSanitizer + UndefinedBehaviorSanitizer) and run each for a bounded time
# (MT_FUZZ_SECONDS, default 30) on a copy of its seed corpus tests/fuzz_corpus/<name>/
# with the dictionary fuzz/<name>.dict:
#   fuzz_safetensors -> models/safetensors.c (header validation, reads, conversions)
#   fuzz_hf_config   -> models/checkpoint.c mt_hf_config_read (+ write/read back)
# Fails when a target crashes, leaks, trips a sanitizer or an invariant (the crash
# input is kept as BUILD_DIR/fuzz/crash-*); first every seed is replayed, so a seed
# added as a regression input is checked every run. Exit 77 (skipped) when clang or
# libFuzzer is not installed.
set -u
BUILD=${1:?usage: test_fuzz.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_EACH=${MT_FUZZ_SECONDS:-30}
OUT="$BUILD/fuzz"

bash "$SRC/fuzz/build.sh" "$BUILD" "$OUT" > "$BUILD/fuzz-build.log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
    echo "skip: $(tail -n 1 "$BUILD/fuzz-build.log")"
    exit 77
elif [ "$rc" -ne 0 ]; then
    cat "$BUILD/fuzz-build.log"
    echo "FAIL: fuzz/build.sh failed"
    exit 1
fi
WORK=$(mktemp -d /tmp/mt_fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export TMPDIR="$WORK" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1

status=0
for pair in fuzz_safetensors:safetensors fuzz_hf_config:hf_config; do
    bin="$OUT/${pair%%:*}" seeds="$SRC/tests/fuzz_corpus/${pair##*:}"
    corpus="$WORK/corpus_${pair##*:}"
    mkdir -p "$corpus"
    cp "$seeds"/* "$corpus"/
    # Replay the seeds alone first (regression inputs), then fuzz.
    if ! "$bin" -runs=0 "$seeds" > "$WORK/replay.log" 2>&1; then
        tail -n 40 "$WORK/replay.log"
        echo "FAIL: ${pair%%:*} fails on a seed of $seeds"
        status=1
        continue
    fi
    if "$bin" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
            -dict="$SRC/fuzz/${pair##*:}.dict" -artifact_prefix="$OUT/" -print_final_stats=1 \
            "$corpus" > "$WORK/fuzz.log" 2>&1; then
        echo "ok   ${pair%%:*}: $(grep -E '^stat::number_of_executed_units' "$WORK/fuzz.log" | awk '{print $2}') runs in ${SECONDS_EACH}s, no crash"
    else
        tail -n 60 "$WORK/fuzz.log"
        echo "FAIL: ${pair%%:*} found a crash (input kept under $OUT/)"
        status=1
    fi
done
exit $status
