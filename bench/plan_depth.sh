#!/usr/bin/env bash
# bench/plan_depth.sh BUILD_DIR [LAYERS ...]: wall time of `meshtrain plan` against
# model depth, to watch that planning stays near-linear in the number of plan entries
# (about 11 per layer: runtime/plan.c's greedy-by-size placement, models/model_plan.c's
# entries, the live-by-category sweep and the printout). Not a test: times on shared
# machines are noisy; each depth is run REPEAT times (default 3) and the fastest kept.
#
#   bench/plan_depth.sh build                    # layers 100 1000 4000 16000
#   REPEAT=1 TIMEOUT=600 bench/plan_depth.sh build 64000
#
# Prints one row per depth: layers, plan entries, peak bytes (the arena), seconds
# (or "timeout" after TIMEOUT seconds, default 300). The model is configs/base.yml's
# (llama3-tiny) with base_num_decoder_layers overridden; nothing is allocated.
set -u
build="${1:?usage: plan_depth.sh BUILD_DIR [LAYERS ...]}"
shift
bin="$build/meshtrain"
[ -x "$bin" ] || { echo "plan_depth.sh: no $bin" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
cfg="$here/../configs/base.yml"
repeat="${REPEAT:-3}"
limit="${TIMEOUT:-300}"
[ $# -gt 0 ] || set -- 100 1000 4000 16000
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

printf '%8s %9s %16s %10s\n' layers entries peak_bytes seconds
for layers in "$@"; do
    best=""
    for ((r = 0; r < repeat; r++)); do
        t0=$(date +%s.%N)
        if ! (cd "$tmp" && timeout "$limit" "$bin" plan "$cfg" --json dataset_path=/none \
                base_num_decoder_layers="$layers" > "$tmp/plan.json" 2> "$tmp/err"); then
            best=timeout
            grep -q . "$tmp/err" && { best=error; sed 's/^/  /' "$tmp/err" >&2; }
            break
        fi
        t1=$(date +%s.%N)
        best=$("$py" -c "import sys; t = $t1 - $t0; b = sys.argv[1]; print('%.3f' % (t if not b else min(t, float(b))))" "$best")
    done
    if [ "$best" = timeout ] || [ "$best" = error ]; then
        printf '%8s %9s %16s %10s\n' "$layers" - - "$best"
        continue
    fi
    read -r entries peak < <("$py" -c "import json, sys; j = json.load(open(sys.argv[1])); print(j['entries'], j['peak_bytes'])" "$tmp/plan.json")
    printf '%8s %9s %16s %10s\n' "$layers" "$entries" "$peak" "$best"
done
