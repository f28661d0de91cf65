#!/usr/bin/env bash
# One training step of a llama-shaped model (d_model 512, 8 layers, 8 heads, seq 512,
# batch 8, vocab 32000): meshtrain (CPU backend, float32, vocab-tiled loss) against
# PyTorch on the same number of threads, every configuration run once per round and the
# rounds alternated in one run, so machine noise hits all of them:
#   meshtrain fp32, meshtrain bf16    ${STEP_BENCH:-./build/bench/step_bench} (bf16: dtype=bfloat16's
#                                     step, fp32 master weights and moments)
#   torch1.13 fp32 eager              Debian's python3-torch (bench/torch_step.py as before)
#   torchX fp32 eager                 the newest PyTorch the project installs from PyPI
#   torchX fp32 eager sdpa            (.venv-hf, scripts/setup-hf-venv.sh; PT_VENV= another),
#   torchX bf16 autocast sdpa         with F.scaled_dot_product_attention, bf16 autocast and
#   torchX fp32 compile sdpa          torch.compile (skipped with COMPILE=0, or when it fails:
#   torchX bf16 autocast compile sdpa the row then says so)
# Prints each run's JSON line, then a table: median step, peak RSS, meshtrain fp32's and
# bf16's step and fp32's RSS as ratios of each configuration's, the load average before
# and after, the CPU model and the GEMM kernels. Needs `make build` first.
# Usage: bench/cpu_vs_torch.sh [threads] [rounds] [steps]   (defaults 2 1 2; STEP_BENCH=, OP_BENCH=
# another build's programs)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}; rounds=${2:-1}; steps=${3:-2}
shape=${SHAPE:-"512 8 8 8 1376 512 8 32000"}  # SHAPE= a smaller one for a quick try
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
venv=${PT_VENV:-.venv-hf}
out=$(mktemp -d)
configs=("meshtrain|fp32" "meshtrain|bf16" "deb|fp32")
if [ -x "$venv/bin/python" ]; then
  configs+=("venv|fp32" "venv|fp32,sdpa" "venv|bf16,sdpa")
  [ "${COMPILE:-1}" = 1 ] && configs+=("venv|fp32,sdpa,compile" "venv|bf16,sdpa,compile")
else
  echo "cpu_vs_torch: no $venv (scripts/setup-hf-venv.sh): PyPI torch rows skipped" >&2
fi
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for i in "${!configs[@]}"; do
    impl=${configs[$i]%%|*}; mode=${configs[$i]#*|}; f="$out/c${i}_r$r.json"
    case $impl in
      meshtrain) ${STEP_BENCH:-./build/bench/step_bench} $shape "$threads" "$steps" 8 \
                   "$([ "$mode" = bf16 ] && echo bfloat16 || echo float32)" > "$f" ;;
      deb) /usr/bin/python3 bench/torch_step.py $shape "$threads" "$steps" "$mode" > "$f" ;;
      venv) "$venv/bin/python" bench/torch_step.py $shape "$threads" "$steps" "$mode" > "$f" 2> "$out/c${i}_r$r.err" \
              || { echo "{\"failed\": true}" > "$f"; tail -3 "$out/c${i}_r$r.err" >&2; } ;;
    esac
    echo "$impl $mode: $(cat "$f")"
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
blas=$(${OP_BENCH:-./build/bench/op_bench} 64 1 4 4 128 16 1 256 1 1 1 2>/dev/null | grep -o 'GEMM float32: .*' || echo "GEMM ?")
/usr/bin/python3 - "$out" "$rounds" "$load0" "$load1" "$cpu" "$blas" "${configs[@]}" <<'PY'
import json, statistics, sys
d, n, load0, load1, cpu, blas = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
configs = sys.argv[7:]
rows = []
for i, c in enumerate(configs):
    impl, mode = c.split("|")
    steps, rss, ver, failed = [], 0.0, "", False
    for r in range(1, n + 1):
        j = json.load(open(f"{d}/c{i}_r{r}.json"))
        if j.get("failed"):
            failed = True
            continue
        steps += j["step_ms"]; rss = max(rss, j["peak_rss_mib"]); ver = j.get("torch", "")
    name = f"meshtrain {mode}" if impl == "meshtrain" else f"torch {ver or '?'} " + mode.replace(",", " ")
    rows.append((name, statistics.median(steps) if steps else None, rss, failed))
mt, mb = rows[0], rows[1]
print(f"CPU: {cpu}; {blas}; load average before {load0}, after {load1}")
print(f"{'config':40s} {'step ms':>9s} {'RSS MiB':>8s} {'mt32/this':>10s} {'mt16/this':>10s} {'mt32/this RSS':>13s}")
for name, ms, rss, failed in rows:
    if ms is None:
        print(f"{name:40s} {'failed' if failed else 'n/a':>9s}")
        continue
    r16 = f"{mb[1] / ms:10.3f}" if mb[1] else f"{'n/a':>10s}"
    print(f"{name:40s} {ms:9.0f} {rss:8.0f} {mt[1] / ms:10.3f} {r16} {mt[2] / rss:13.3f}")
PY
