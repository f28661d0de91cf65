#!/usr/bin/env bash
# bench/estimate_time.sh BUILD_DIR: wall time of `meshtrain estimate` on the issue's
# largest search, llama3.1-405b on 1024 devices (mesh, batch and remat policy searched),
# at hbm_gib=95 (docs/estimates/) and at a budget with room to walk (the full-remat plan
# of batch 1 plus 4 x what batch 2 adds). Target: each search under 2 seconds. Not a
# test: times on shared machines are noisy, so each search runs REPEAT times (default
# 3) and the fastest is kept; the load average is printed with the times.
set -u
build="${1:?usage: estimate_time.sh BUILD_DIR}"
bin="$(cd "$build" 2>/dev/null && pwd)/meshtrain"
[ -x "$bin" ] || { echo "estimate_time.sh: no $bin" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
cfg="$here/../configs/base.yml"
big="dataset_path=/none model_name=llama3.1-405b num_devices=1024 max_target_length=2048"
pk() { "$bin" plan "$cfg" $big remat_policy=full per_device_batch_size=$1 --json |
       python3 -c "import json, sys; print(json.load(sys.stdin)['peak_bytes'])"; }
gib=$((1024 * 1024 * 1024))
p1=$(pk 1) p2=$(pk 2)
roomy=$(( (p1 + 4 * (p2 - p1) + gib - 1) / gib ))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for hbm in 95 $roomy; do
    best=
    for _ in $(seq "${REPEAT:-3}"); do
        s=$(date +%s.%N)
        "$bin" estimate "$cfg" $big hbm_gib=$hbm > out 2>&1
        rc=$?
        e=$(date +%s.%N)
        t=$(python3 -c "print('%.3f' % ($e - $s))")
        if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $t < $best else 1)"; then best=$t; fi
    done
    ok=$(python3 -c "print('under' if $best < 2.0 else 'OVER')")
    echo "llama3.1-405b x 1024 hbm_gib=$hbm: exit $rc, fastest of ${REPEAT:-3} $best s ($ok the 2 s target); $(grep -o 'plans evaluated [0-9]* in [0-9.]* s' out)"
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
