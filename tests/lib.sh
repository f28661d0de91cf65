# tests/lib.sh: set-up shared by the tests/test_*.sh scripts. Sourced, never run:
# tests/CMakeLists.txt registers only test_*.sh, so this file is not a test.
# Use: . "$(dirname "$0")/lib.sh"
#
#   mt_build SCRIPT BUILD_DIR [BIN]
#                           build=BUILD_DIR (usage error naming SCRIPT when absent),
#                           src=the source tree, bin=BUILD_DIR/BIN (default meshtrain);
#                           exit 1 when bin is not executable
#   mt_build_backend SCRIPT BUILD_DIR BACKEND
#                           mt_build with bin meshtrain (BACKEND cpu) or meshtrain-emu
#                           (BACKEND cuda: also exports CUDAEMU_QUIET=1, CUDAEMU_DEVICES=4)
#   mt_need_python3         exit 77 (skipped) when python3 is not on PATH
#   mt_need_hf_venv         venv=$MT_HF_VENV (default $src/.venv-hf), py=its python; exit 77
#                           (skipped) when it cannot import tokenizers
#   mt_need_hf5             py=the venv's python and PYTHONPATH (exported) starting with
#                           $MT_HF5_OVERLAY (default $src/.venv-hf5-overlay): transformers
#                           5.17 with Gemma 4 over the venv's torch (scripts/setup-hf5-overlay.sh);
#                           exit 77 (skipped) when it cannot import Gemma4ForCausalLM
#   mt_need_mpirun          exit 77 (skipped) when mpirun is not on PATH
#   mt_need_tools NAME...   tools=paths of BUILD_DIR/tests/tools/NAME (in order); exit 1
#                           naming the first that is not executable
#   mt_sys_python           py=/usr/bin/python3 (Debian's, with its python3-* packages),
#                           else python3 from PATH
#   mt_tmp                  $tmp: a fresh directory removed on exit (kept when KEEP is
#                           set, for debugging); failures=0
#   fail MSG...             print "FAIL: MSG" and count it in $failures
#   mt_finish MSG           exit 1 printing "N failure(s)" if any failed, else print MSG
#   mt_mpi_env              export the Open MPI settings the MPI tests need: run as root,
#                           oversubscribe the 2 cores, no single-copy (containers),
#                           OMP_NUM_THREADS=1
#   mpi NP CMD...           timeout 300 mpirun --oversubscribe -np NP CMD...
#   mt_tiny_model FILE KIND [LAYERS]
#                           a tiny model YAML (vocab 64, D 32, 4 query / 2 kv heads of 8,
#                           MLP 64, LAYERS layers, default 2): KIND llama (llama2, silu),
#                           gemma (tied embedding, gelu), gemma2 (tied, soft-caps
#                           30 / 50, sliding window 8 every 2nd layer, post-norms) or
#                           gemma4 (global head_dim 16, double-wide MLP, the last 3
#                           layers sharing KV, per-layer inputs of 4, window 4 every
#                           2nd layer; LAYERS 5 in the tests)
#   mt_run_yml [MODEL]      $tmp/cfg/run.yml: model_name MODEL (default tiny),
#                           base_output_directory $tmp/out, dataset_path $tmp/data, then
#                           the lines on stdin; makes $tmp/cfg and $tmp/data; sets cfg to it
#   mt_layout_cfg MODEL     $tmp/data (synthetic shards from tests/tools/mpi_layout data,
#                           $tool must be set) and $tmp/cfg/run.yml (MODEL, length 16,
#                           3 steps, lr 3e-4, adam_eps 1e-5, no warm-up, no eval,
#                           backend $MT_LAYOUT_BACKEND (default cpu), seed 3,
#                           overlap_grad_reduce true: the layout suites run the
#                           overlapped reduce-scatters); sets cfg to it; exits 1 if the shards cannot be written
#   mt_train RUN ARGS...    $bin train $tmp/cfg/run.yml run_name=RUN ARGS..., output in
#                           $tmp/RUN.out and .err; on failure fail (with that output), return 1
#   mt_column RUN FIELD FIRST LAST
#                           "STEP VALUE" for every row of $tmp/out/RUN/metrics.jsonl with
#                           FIRST <= step <= LAST that has FIELD, the value exactly as
#                           printed (so that comparing two columns is bitwise)
#   mt_fp32_bounds NAME K ARGS...
#                           the derived fp32 bounds (tests/test_bounds.h) of the first K
#                           steps of the one-process run of $cfg with ARGS: runs it and
#                           its perturbed twin with $layout_tool (tests/tools/mpi_layout,
#                           or mpi_layout_emu) into $tmp/NAME and $tmp/NAME_kappa, writes
#                           "STEP LOSS_BOUND GRAD_NORM_BOUND" (relative) lines to
#                           $tmp/NAME.bounds; on failure fail, return 1
#   mt_bf16_acc_bounds NAME K ARGS...
#                           mt_fp32_bounds for a run with ARGS and grad_dtype=bfloat16
#                           against the run with ARGS (fp32 accumulators): the reference
#                           from $layout_tool run-acc (each step's micro-batch partial
#                           sums), its perturbed twin, then `bounds $tmp/NAME K bfloat16`
#                           (tests/tools/mpi_layout.c derive_bounds: the accumulator's
#                           roundings) into $tmp/NAME.bounds
#   mt_check_bounds BOUNDS FIELD A B
#                           FIELD (loss or grad_norm) of every step of runs A and B
#                           ($tmp/out/RUN/metrics.jsonl) within BOUNDS' relative bound of
#                           that step; prints the worst ratio; exit status 1 if not
#                           (MT_CHECK_PLANT=x moves B by x bounds: shows the check can fail)
#   mt_shards DIR SEED NAME=NTOKENS...
#                           llm.c token shards (header magic 20240520, version 1, uint16
#                           tokens) of a noisy repeating pattern (learnable) drawn from
#                           Python's random.Random(SEED), one shard per NAME in order

mt_build() {
    build="${2:-}"
    [ -n "$build" ] || { echo "usage: $1 BUILD_DIR" >&2; exit 1; }
    src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    bin="$build/${3:-meshtrain}"
    [ -x "$bin" ] || { echo "no $bin"; exit 1; }
}

mt_need_python3() { command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }; }

mt_build_backend() {
    if [ "$3" = cuda ]; then
        mt_build "$1" "$2" meshtrain-emu
        export CUDAEMU_QUIET=1 CUDAEMU_DEVICES=4
    else
        mt_build "$1" "$2"
    fi
}

mt_need_hf_venv() {
    venv="${MT_HF_VENV:-$src/.venv-hf}"
    py="$venv/bin/python"
    if ! "$py" -c "import tokenizers" 2>/dev/null; then
        echo "skip: no tokenizers in $venv (run scripts/setup-hf-venv.sh)"
        exit 77
    fi
}

mt_need_hf5() {
    local venv5="${MT_HF_VENV:-$src/.venv-hf}" overlay="${MT_HF5_OVERLAY:-$src/.venv-hf5-overlay}"
    py="$venv5/bin/python"
    export PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$py" -c "from transformers import Gemma4ForCausalLM" 2>/dev/null; then
        echo "skip: no transformers 5 with Gemma 4 at $overlay over $venv5 (run scripts/setup-hf5-overlay.sh)"
        exit 77
    fi
}

mt_need_mpirun() { command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }; }

mt_need_tools() {
    local t
    tools=()
    for t in "$@"; do
        tools+=("$build/tests/tools/$t")
        [ -x "$build/tests/tools/$t" ] || { echo "no $build/tests/tools/$t"; exit 1; }
    done
}

mt_sys_python() { py=/usr/bin/python3; [ -x "$py" ] || py=python3; }

mt_tmp() {
    tmp="$(mktemp -d)"
    trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
    failures=0
}

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mt_finish() {
    if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
    echo "$1"
}

mt_mpi_env() {
    # MT_CPU_POISON: the CPU backend fills every allocation with NaN bytes (kernels/cpu/
    # cpu_backend.c), as the CUDA emulator does device memory, so that a buffer read before
    # it is written shows (fresh pages read as zeros: a row range past a slice's end did)
    export MT_CPU_POISON=1
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
}

mpi() { local np=$1; shift; timeout 300 mpirun --oversubscribe -np "$np" "$@"; }

# mt_rank_wrapper PATH: write PATH, a wrapper `PATH RCDIR CMD...` that runs CMD and
# writes its exit status into RCDIR/<world rank> (mpirun's own status is only the
# first failing rank's); mpirun's SIGTERM to the other ranks is left to CMD.
mt_rank_wrapper() {
    cat > "$1" <<'SH'
#!/bin/sh
d=$1; shift
trap : TERM
"$@"
rc=$?
echo "$rc" > "$d/${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-x}}"
exit $rc
SH
    chmod +x "$1"
}

mt_tiny_model() {
    local file=$1 kind=$2 layers=${3:-2}
    mkdir -p "$(dirname "$file")"
    case "$kind" in
        llama) printf 'decoder_block: llama2\n' ;;
        gemma) printf 'decoder_block: gemma\n' ;;
        gemma2) printf 'decoder_block: gemma2\n' ;;
        gemma4) printf 'decoder_block: gemma4\n' ;;
        *) echo "mt_tiny_model: unknown kind $kind" >&2; return 1 ;;
    esac > "$file"
    cat >> "$file" <<YML
vocab_size: 64
base_emb_dim: 32
base_num_query_heads: 4
base_num_kv_heads: 2
head_dim: 8
base_mlp_dim: 64
base_num_decoder_layers: $layers
YML
    case "$kind" in
        llama) printf 'mlp_activations: ["silu", "linear"]\n' ;;
        gemma) printf 'mlp_activations: ["gelu", "linear"]\nlogits_via_embedding: true\n' ;;
        gemma2) printf '%s\n' 'mlp_activations: ["gelu", "linear"]' 'logits_via_embedding: true' \
            'final_logits_soft_cap: 30.0' 'attn_logits_soft_cap: 50.0' 'sliding_window_size: 8' \
            'sliding_window_pattern: 2' 'use_post_attn_norm: true' 'use_post_ffw_norm: true' ;;
        gemma4) printf '%s\n' 'global_head_dim: 16' 'use_double_wide_mlp: true' 'num_kv_shared_layers: 3' \
            'per_layer_input_dim: 4' 'sliding_window_size: 4' 'sliding_window_pattern: 2' ;;
    esac >> "$file"
    [ "$kind" = gemma4 ] || printf 'rope_max_timescale: 10000\n' >> "$file" # gemma4: its own RoPE defaults
}

mt_run_yml() {
    mkdir -p "$tmp/cfg" "$tmp/data"
    { printf 'model_name: %s\nbase_output_directory: %s\ndataset_path: %s\n' "${1:-tiny}" "$tmp/out" "$tmp/data"
      cat; } > "$tmp/cfg/run.yml"
    cfg="$tmp/cfg/run.yml"
}

mt_layout_cfg() {
    "$tool" data "$tmp/data" || { echo "cannot write shards"; exit 1; }
    mkdir -p "$tmp/cfg"
    cat > "$tmp/cfg/run.yml" <<YML
model_name: $1
dataset_path: $tmp/data
max_target_length: 16
steps: 3
learning_rate: 0.0003
adam_eps: 1e-05
warmup_steps_fraction: 0
eval_interval: 0
backend: ${MT_LAYOUT_BACKEND:-cpu}
seed: 3
overlap_grad_reduce: true
YML
    cfg="$tmp/cfg/run.yml"
}

mt_shards() {
    local dir=$1 seed=$2; shift 2
    mkdir -p "$dir"
    python3 - "$dir" "$seed" "$@" <<'PY'
import random, struct, sys
d = sys.argv[1]
rng = random.Random(int(sys.argv[2]))
def tokens(n):
    out = []
    while len(out) < n:
        out.append(1)
        for i in range(rng.randrange(5, 30)):
            out.append(3 + (i * 7 + rng.randrange(3)) % 61)
    return out[:n]
def shard(path, toks):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open(path, "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
for spec in sys.argv[3:]:
    name, n = spec.split("=")
    shard(d + "/" + name, tokens(int(n)))
PY
}

mt_train() {
    local name="$1"; shift
    if ! "$bin" train "$tmp/cfg/run.yml" run_name="$name" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; then
        fail "run $name failed: $(cat "$tmp/$name.out" "$tmp/$name.err")"
        return 1
    fi
}

mt_column() {
    python3 - "$tmp/out/$1/metrics.jsonl" "$2" "$3" "$4" <<'PY'
import json, re, sys
path, field, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for line in open(path):
    row = json.loads(line)
    if first <= row["step"] <= last and field in row:
        print(row["step"], re.search(r'"%s": ([^,}]*)' % field, line).group(1))
PY
}

mt_fp32_bounds() {
    local name=$1 k=$2; shift 2
    "$layout_tool" run "$tmp/$name" "$cfg" steps="$k" "$@" > "$tmp/$name.log" 2>&1 &&
        "$layout_tool" run-kappa "$tmp/${name}_kappa" "$cfg" steps="$k" "$@" > "$tmp/${name}_kappa.log" 2>&1 &&
        "$layout_tool" bounds "$tmp/$name" "$k" > "$tmp/$name.bounds" 2> "$tmp/$name.bounds.err" ||
        { fail "bounds $name: $(tail -3 "$tmp/$name.log" "$tmp/${name}_kappa.log" "$tmp/$name.bounds.err" 2>/dev/null)"
          return 1; }
}

mt_bf16_acc_bounds() {
    local name=$1 k=$2; shift 2
    "$layout_tool" run-acc "$tmp/$name" "$cfg" steps="$k" "$@" > "$tmp/$name.log" 2>&1 &&
        "$layout_tool" run-kappa "$tmp/${name}_kappa" "$cfg" steps="$k" "$@" > "$tmp/${name}_kappa.log" 2>&1 &&
        "$layout_tool" bounds "$tmp/$name" "$k" bfloat16 > "$tmp/$name.bounds" 2> "$tmp/$name.bounds.err" ||
        { fail "bounds $name: $(tail -3 "$tmp/$name.log" "$tmp/${name}_kappa.log" "$tmp/$name.bounds.err" 2>/dev/null)"
          return 1; }
}

mt_check_bounds() {
    python3 - "$1" "$2" "$tmp/out/$3/metrics.jsonl" "$tmp/out/$4/metrics.jsonl" <<'PY'
import json, sys
bounds = {int(s): (float(l), float(g)) for s, l, g in (line.split() for line in open(sys.argv[1]))}
field = sys.argv[2]
col = 0 if field == "loss" else 1
rows = [{r["step"]: r[field] for r in map(json.loads, open(p)) if field in r} for p in sys.argv[3:5]]
assert rows[0].keys() == rows[1].keys() and set(rows[0]) <= set(bounds), (rows, bounds)
plant = float(__import__("os").environ.get("MT_CHECK_PLANT", "0"))  # B moved by this many bounds
for s in rows[1]:
    rows[1][s] += plant * bounds[s][col] * abs(rows[0][s])
ratio = max(abs(rows[1][s] - rows[0][s]) / abs(rows[0][s]) / bounds[s][col] for s in rows[0])
print(f"{sys.argv[4].split('/')[-2]} vs {sys.argv[3].split('/')[-2]}: {field} of {len(rows[0])} steps, "
      f"worst ratio to the derived bound {ratio:.3g} (bounds {min(b[col] for b in bounds.values()):.1e} to "
      f"{max(b[col] for b in bounds.values()):.1e})")
sys.exit(0 if ratio <= 1 else 1)
PY
}
