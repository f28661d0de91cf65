#!/usr/bin/env bash
# docs/estimates/regenerate.sh [MESHTRAIN]: rewrite the committed estimator outputs of
# docs/estimates/ (see README.md there). Run from anywhere; MESHTRAIN defaults to
# build/meshtrain of this checkout. The estimator needs no data and no device.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/build/meshtrain}"
case "$bin" in /*) ;; *) bin="$(pwd)/$bin" ;; esac
[ -x "$bin" ] || { echo "no $bin: build it first (make build)"; exit 1; }
out="$root/docs/estimates"
cd "$root" || exit 1   # the commands files name configs/base.yml relative to the root
rc=0
while read -r name args; do
    [ -n "$name" ] || continue
    rm -f remat_commands_from_estimator.txt "$out/${name}_remat_commands_from_estimator.txt"
    echo "\$ meshtrain estimate configs/base.yml $args" > "$out/$name.txt"
    # shellcheck disable=SC2086
    "$bin" estimate configs/base.yml $args >> "$out/$name.txt" 2>&1
    st=$?
    echo "(exit status $st)" >> "$out/$name.txt"
    if [ -f remat_commands_from_estimator.txt ]; then
        mv remat_commands_from_estimator.txt "$out/${name}_remat_commands_from_estimator.txt"
    fi
    # the commands name the binary that ran; the committed files name the README's
    # build/meshtrain (run from the repository root), not this machine's path
    sed -i "s|$bin |build/meshtrain |g" "$out/$name.txt" "$out/${name}_remat_commands_from_estimator.txt" 2>/dev/null
    [ $st -eq 0 ] || [ $st -eq 2 ] || rc=1
    echo "$name: exit $st"
done <<'JOBS'
llama3.1-405b_1024dev_hbm95 model_name=llama3.1-405b num_devices=1024 hbm_gib=95 max_target_length=2048
gemma2-9b_8dev_hbm141 model_name=gemma2-9b num_devices=8 hbm_gib=141 max_target_length=8192
JOBS
exit $rc
