#!/usr/bin/env bash
# One training step of a llama-shaped model (d_model 512, 8 layers, 8 heads, seq 512,
# batch 8, vocab 32000), meshtrain (CPU backend, float32, vocab-tiled loss) against
# PyTorch eager (Debian's python3-torch, float32, full logits) on the same number of
# threads, alternated in one run so machine noise hits both (STEP_BENCH= another
# build's bench/step_bench to compare builds). Prints both JSON lines,
# the step-time ratio per pair and both peak RSS. Needs `make build` first.
# Usage: bench/cpu_vs_torch.sh [threads] [pairs] [steps]   (defaults 2 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}; pairs=${2:-1}; steps=${3:-2}
shape="512 8 8 8 1376 512 8 32000"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
out=$(mktemp -d)
for p in $(seq 1 "$pairs"); do
  ${STEP_BENCH:-./build/bench/step_bench} $shape "$threads" "$steps" 8 | tee "$out/mt_$p.json"
  /usr/bin/python3 bench/torch_step.py $shape "$threads" "$steps" | tee "$out/pt_$p.json"
done
/usr/bin/python3 - "$out" "$pairs" <<'PY'
import json, sys, statistics
d, n = sys.argv[1], int(sys.argv[2])
ratios, mts, pts = [], [], []
for p in range(1, n + 1):
    mt = json.load(open(f"{d}/mt_{p}.json")); pt = json.load(open(f"{d}/pt_{p}.json"))
    a, b = statistics.median(mt["step_ms"]), statistics.median(pt["step_ms"])
    ratios.append(a / b); mts += mt["step_ms"]; pts += pt["step_ms"]
    print(f"pair {p}: meshtrain {a:.0f} ms, pytorch {b:.0f} ms, ratio {a / b:.3f}; "
          f"peak RSS meshtrain {mt['peak_rss_mib']:.0f} MiB (planned arena {mt['planned_peak_mib']:.0f} MiB), "
          f"pytorch {pt['peak_rss_mib']:.0f} MiB")
if n > 1:
    print(f"all {n} pairs: median ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
          f"median step over all steps: meshtrain {statistics.median(mts):.0f} ms, pytorch {statistics.median(pts):.0f} ms, "
          f"ratio {statistics.median(mts) / statistics.median(pts):.3f}")
PY
