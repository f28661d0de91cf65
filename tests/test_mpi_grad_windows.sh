#!/usr/bin/env bash
# tests/test_mpi_grad_windows.sh BUILD_DIR: gradient windows, a layer's gradient handed
# over one parameter at a time (models/model.h mt_model_set_grad_sink, parallel/zero1.h
# gradient paths).
#
# 1. Plans (no mpirun; tests/tools/mpi_layout plan prints the gradient bytes G, the
#    sum of the MT_MEM_GRADS entries, and M, the largest of them), each checked to the
#    byte against the formula of parallel/zero1.h, with numel = L x layer + embedding
#    + final norm + head floats, windows W = 4 (weight + embedding + final norm + head),
#    weight the largest layer parameter (the layer gradient window: 64 x 32, gate / up /
#    down), and with more than one rank on a reduce-scattering path Wo = W + 4 weight
#    (the second window: one parameter's reduce-scatter overlaps the next one's
#    backward):
#    - float32, once, K = 4, one process: the model's full buffer, G = 4 numel;
#    - bfloat16, once, K = 4: no numel x fp32 buffer (M < 4 numel), G = 2 numel + W +
#      the fp32 reduce chunk (4 x the largest parameter); with 32 layers (layers
#      dominate) G < 0.6 x the float32 G and the peak is lower;
#    - ZeRO-1 every, K = 4, data 2 and 4 (float32 and bfloat16): G = es x
#      ceil(numel / n) + Wo: the accumulator scales as 1/n, plus the windows;
#    - ZeRO-1 and fsdp with K = 1: G = Wo (the windows are reduce-scattered straight
#      into the fp32 shard, a communication buffer);
#    - vocabulary chunks (num_vocab_chunks = C, models/model.h): the embedding's and
#      lm_head's gradients go to the sink one chunk of Vc = ceil(V / C) rows at a time,
#      so W = 4 (weight + final norm + 2 Vc D); with a vocabulary larger than a layer
#      (vocab_size 1024: V D = 32768 > layer 9280) num_vocab_chunks=auto picks
#      C = ceil(V D / weight) = 16 under fsdp (1 for one process) and the largest window
#      is a layer's: no [V, D] parameter or gradient buffer.
#    - gemma4's per-layer embedding table [V, L P] (models/model_gemma4.c; tiny gemma4
#      V 64, L 5, P 4, tied embedding): with C = 3 its own count is max(C, ceil(V L P /
#      weight)) = 3 (the tiny table is smaller than a layer weight) of Vp = 22 rows, so against
#      C = 1 its windows and the tied embedding's change: ZeRO-1 K = 1 gradient bytes
#      fall by 4 (V - Vp) L P (its gradient a chunk at a time) + 4 (V D - 2 Vc D) (D 32:
#      the whole tied embedding gradient window, live from the loss, gives way to one
#      chunk window in the loss and one in the lookup's backward), fsdp 2 parameter bytes by 4 (V D - 2 Vc D +
#      (V - Vp) L P) (the embedding's lookup and loss chunks, Vc = 22, and the table's).
#      At gemma4-e2b (configs/models, fsdp 8, bf16, batch 1 x 4096) the table, 262144 x
#      8960, comes in ceil(V L P / weight) chunks, weight = the layer gradient window's
#      floats: its largest window no larger than the layer gradient window, and the
#      largest window is no longer the table's (it was its 9.45 GB fp32 gradient window).
# 2. Runs (mpirun, else skipped): windows against the full-buffer path
#    (mpi_layout run-full-grads: the behaviour before windows) on the same layout.
#    Bitwise (tolerance 0) where the sums are the same fp32 operations: one process
#    with bf16 once (the window of each layer is folded into the same accumulator
#    element by element, one rounding per micro-batch, untied and tied), and 2-rank
#    layouts (a sum of two fp32 values does not depend on the order: ZeRO-1 once
#    bf16, every fp32 and bf16, fsdp K = 1, tensor every, tensor + sequence parallel
#    ZeRO-1 with a tied embedding; one process with remat, activation, parameter and
#    optimizer offload). Without ZeRO-1 a
#    bf16 once run all-reduces the accumulator chunk by chunk and stores the sum back
#    in bf16: one more rounding of each element, relative error <= 2^-8 per element
#    (round to nearest with 8 significant bits: unit roundoff 2^-8 = 3.9e-3), so each
#    element of the windowed run is within 2^-8 of the full path's value and the
#    per-tensor relative norm difference within 3.9e-3, on any CPU; it must differ (the
#    rounding happened). fsdp with once and K = 2 now
#    reduce-scatters each micro-batch (no full buffer): against one process within the
#    derived fp32 bounds of tests/test_mpi_layouts.sh (fp32 sums in another order;
#    mpi_layout compare ... derived, with the reference's perturbed run ref_b8_kappa;
#    measured 0.019 of the bound; was 1e-5). Every run's bytes
#    per step equal the formula (parallel/zero1.h). The window runs overlap each
#    parameter's reduce-scatter with the next one's backward (overlap_grad_reduce, on in
#    the layout config of tests/lib.sh); fsdp K = 1 also runs blocking (false), and both give
#    the same gradient file bitwise (the same collectives on the same windows).
set -u
. "$(dirname "$0")/lib.sh"
build="${1:?usage: test_mpi_grad_windows.sh BUILD_DIR}"
tool="$build/tests/tools/mpi_layout"
[ -x "$tool" ] || { echo "no $tool"; exit 1; }
mt_mpi_env

mt_tmp

mt_tiny_model "$tmp/cfg/models/tinyl.yml" llama
mt_tiny_model "$tmp/cfg/models/tinyg.yml" gemma
mt_tiny_model "$tmp/cfg/models/tinyg4.yml" gemma4 5
mt_layout_cfg tinyl
src="$(cd "$(dirname "$0")/.." && pwd)"

# ---- 1. plans ----
layer=$((2 * 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 64 * 32)) # norms, q, k, v, o, gate/up/down
emb=$((64 * 32)) tail=$((32 + 64 * 32)) maxp=$((64 * 32))          # untied: final norm + head
weight=$((64 * 32))                                                 # the largest layer parameter
win=$((4 * (weight + emb + tail)))
wino=$((win + 4 * weight))
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}' <<< "$2"; }
plan() { "$tool" plan "$cfg" per_device_batch_size=2 "$@" 2>&1; }
check() { # check NAME GOT WANT
    printf 'plan %-34s gradient bytes %9s (formula %9s)\n' "$1" "$2" "$3"
    [ "$2" = "$3" ] || fail "plan $1: gradient bytes $2, formula $3"
}
for L in 2 32; do
    numel=$((L * layer + emb + tail))
    p32="$(plan base_num_decoder_layers=$L gradient_accumulation_steps=4)"
    p16="$(plan base_num_decoder_layers=$L gradient_accumulation_steps=4 grad_dtype=bfloat16)"
    check "L$L fp32 once K4 (full buffer)" "$(field grads "$p32")" $((4 * numel))
    check "L$L bf16 once K4" "$(field grads "$p16")" $((2 * numel + win + 4 * maxp))
    [ "$(field maxgrad "$p16")" -lt $((4 * numel)) ] || fail "L$L bf16 once: a numel x fp32 gradient entry ($p16)"
    [ "$(field peak "$p16")" -lt "$(field peak "$p32")" ] || fail "L$L bf16 once: peak not below fp32 ($p16 / $p32)"
    if [ $L -eq 32 ]; then # layers dominate: about half
        r=$(awk -v a="$(field grads "$p16")" -v b="$(field grads "$p32")" 'BEGIN {printf "%.3f", a / b}')
        echo "plan L32: bf16 / fp32 gradient bytes = $r"
        awk -v r="$r" 'BEGIN {exit !(r < 0.6)}' || fail "L32 bf16 gradient bytes $r x fp32, not about half"
    fi
    for n in 2 4; do
        for dt in float32:4 bfloat16:2; do
            d=${dt%:*} es=${dt#*:}
            p="$(plan base_num_decoder_layers=$L gradient_accumulation_steps=4 num_devices=$n ici_data_parallelism=$n \
                shard_optimizer_over_data=true gradient_accumulation_reduce=every grad_dtype=$d)"
            check "L$L dp$n zero1 every K4 $d" "$(field grads "$p")" $((es * ((numel + n - 1) / n) + wino))
            [ "$(field maxgrad "$p")" -lt $((4 * numel)) ] || fail "dp$n every $d: full-size gradient entry ($p)"
        done
    done
    p="$(plan base_num_decoder_layers=$L num_devices=2 ici_data_parallelism=2 shard_optimizer_over_data=true)"
    check "L$L dp2 zero1 K1" "$(field grads "$p")" $wino
    p="$(plan base_num_decoder_layers=$L num_devices=2 ici_fsdp_parallelism=2)"
    check "L$L fsdp2 K1" "$(field grads "$p")" $wino
    p="$(plan base_num_decoder_layers=$L num_devices=2 ici_fsdp_parallelism=2 overlap_grad_reduce=false)"
    check "L$L fsdp2 K1 no overlap" "$(field grads "$p")" $win
    winc=$((4 * (weight + 32 + 2 * 22 * 32))) # C = 3 of V = 64: Vc = 22
    p="$(plan base_num_decoder_layers=$L num_devices=2 ici_fsdp_parallelism=2 num_vocab_chunks=3)"
    check "L$L fsdp2 K1 chunks 3" "$(field grads "$p")" $((winc + 4 * weight))
    p="$(plan base_num_decoder_layers=$L num_devices=2 ici_data_parallelism=2 shard_optimizer_over_data=true \
        num_vocab_chunks=3 overlap_grad_reduce=false)"
    check "L$L dp2 zero1 K1 chunks 3 no overlap" "$(field grads "$p")" $winc
done
# grad_window_chunks=3 (models/model_windows.c mtm_weight_grad): a layer weight's gradient
# in row blocks of ceil(rows / 3): gate / up [64, 32] 22 x 32, down [32, 64] 11 x 64, both
# 704 floats, so each layer gradient window holds 704 floats instead of the weight's 2048
p="$(plan num_devices=2 ici_fsdp_parallelism=2 grad_window_chunks=3)"
check "fsdp2 K1 grad_window_chunks=3 window" "$(field gwlayer "$p")" $((4 * 704))
p="$(plan num_devices=2 ici_fsdp_parallelism=2 vocab_size=1024)"
printf 'plan fsdp2 vocab 1024: %s\n' "$p"
[ "$(field chunks "$p")" = 16 ] || fail "fsdp2 vocab 1024: num_vocab_chunks=auto gave $(field chunks "$p") chunks, not 16"
case "$(field maxwin "$p")" in
params.window.layer* | grads.window.layer*) ;;
*) fail "fsdp2 vocab 1024: the largest window is $(field maxwin "$p"), not a layer's" ;;
esac
p="$(plan vocab_size=1024)"
[ "$(field chunks "$p")" = 1 ] || fail "one process vocab 1024: auto gave $(field chunks "$p") chunks, not 1"
# gemma4's per-layer embedding table in chunks (the header's formulas)
g4=(model_name=tinyg4 num_devices=2)
p1="$(plan "${g4[@]}" ici_data_parallelism=2 shard_optimizer_over_data=true num_vocab_chunks=1)"
p3="$(plan "${g4[@]}" ici_data_parallelism=2 shard_optimizer_over_data=true num_vocab_chunks=3)"
[ "$(field ple_chunks "$p3")" = 3 ] || fail "gemma4 chunks 3: the table in $(field ple_chunks "$p3") chunks, not 3"
[ "$(field ple_chunks "$p1")" = 1 ] || fail "gemma4 chunks 1: the table in $(field ple_chunks "$p1") chunks, not 1"
check "gemma4 dp2 zero1 K1 chunks 1 - 3" $(($(field grads "$p1") - $(field grads "$p3"))) \
    $((4 * (64 - 22) * 20 + 4 * (64 - 2 * 22) * 32))
p1="$(plan "${g4[@]}" ici_fsdp_parallelism=2 num_vocab_chunks=1)"
p3="$(plan "${g4[@]}" ici_fsdp_parallelism=2 num_vocab_chunks=3)"
d=$(($(field params "$p1") - $(field params "$p3"))) want=$((4 * (64 * 32 - 2 * 22 * 32 + 42 * 20)))
printf 'plan %-34s parameter bytes %9s (formula %9s)\n' "gemma4 fsdp2 chunks 1 - 3" $d $want
[ $d = $want ] || fail "gemma4 fsdp2 chunks 1 - 3: parameter bytes $d, formula $want"
p="$("$tool" plan "$src/configs/base.yml" model_name=gemma4-e2b dataset_path=/none num_devices=8 \
    ici_fsdp_parallelism=8 dtype=bfloat16 max_target_length=4096 per_device_batch_size=1 2>&1)"
printf 'plan gemma4-e2b fsdp8: %s\n' "$p"
weight=$(($(field gwlayer "$p") / 4)) wide=$((262144 * 35 * 256))
want=$(((wide + weight - 1) / weight))
[ "$(field ple_chunks "$p")" = $want ] || fail "gemma4-e2b: the table in $(field ple_chunks "$p") chunks, not $want"
rows=$(((262144 + want - 1) / want))
check "gemma4-e2b fsdp8 table window" "$(field maxple "$p")" $((4 * rows * 35 * 256))
[ "$(field maxple "$p")" -le "$(field gwlayer "$p")" ] || fail "gemma4-e2b: a table window above a layer's ($p)"
case "$(field maxwin "$p")" in
*per_layer*) fail "gemma4-e2b: the largest window is still the per-layer table's, $(field maxwin "$p")" ;;
esac

# ---- 2. runs ----
command -v mpirun >/dev/null || { echo "mpirun not found: runs skipped"; [ $failures -eq 0 ] && exit 77; exit 1; }

# run NP NAME full|win ARGS...: 3 steps; bytes per step checked against the formula
run() {
    local np=$1 name=$2 how=$3; shift 3
    local cmd=run
    [ "$how" = full ] && cmd=run-full-grads
    if ! mpi "$np" "$tool" $cmd "$tmp/$name" "$cfg" "$@" > "$tmp/$name.log" 2>&1; then
        fail "$name: $(tail -5 "$tmp/$name.log")"; return 1
    fi
    for ((r = 0; r < np; r++)); do
        while read -r m fo; do [ "$m" = "$fo" ] || fail "$name rank $r: measured $m bytes, formula $fo"; done \
            < "$tmp/$name/bytes.$r.txt"
    done
}
# same NAME TOL NP ARGS...: windows against the full-buffer path on the same layout
same() {
    local name=$1 tol=$2 np=$3; shift 3
    run "$np" "${name}_full" full "$@" || return
    run "$np" "${name}_win" win "$@" || return
    if "$tool" compare "$tmp/${name}_full" "$tmp/${name}_win" "$tol" > "$tmp/$name.cmp" 2>&1; then
        sed "s/^/$name (tol $tol): /" "$tmp/$name.cmp" | grep -v "^.*: loss:"
    else
        fail "$name: windows vs full buffer beyond $tol"; cat "$tmp/$name.cmp"
    fi
}

ga4="per_device_batch_size=1 gradient_accumulation_steps=4"
same bf16_once_1proc 0 1 $ga4 grad_dtype=bfloat16
same bf16_once_1proc_tied_tiles4 0 1 $ga4 grad_dtype=bfloat16 model_name=tinyg num_vocab_tiling=4
same dp2_zero1_bf16_once 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true grad_dtype=bfloat16
same dp2_zero1_every_fp32 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every
same dp2_zero1_every_bf16_tied 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every grad_dtype=bfloat16 model_name=tinyg
same dp2_zero1_k1 0 2 per_device_batch_size=2 ici_data_parallelism=2 shard_optimizer_over_data=true
same fsdp2_k1 0 2 per_device_batch_size=2 ici_fsdp_parallelism=2 base_num_decoder_layers=3
same fsdp2_k1_blocking 0 2 per_device_batch_size=2 ici_fsdp_parallelism=2 base_num_decoder_layers=3 \
    overlap_grad_reduce=false
cmp -s "$tmp/fsdp2_k1_win/grad.bin" "$tmp/fsdp2_k1_blocking_win/grad.bin" ||
    fail "fsdp2 K1: the overlapped reduce-scatters' gradient differs from the blocking ones' (must be bitwise)"
same tp2_every_bf16 0 2 per_device_batch_size=2 gradient_accumulation_steps=2 ici_tensor_parallelism=2 \
    shard_optimizer_over_data=true gradient_accumulation_reduce=every grad_dtype=bfloat16
same tp2_sp_zero1_k1_gemma_tied 0 2 per_device_batch_size=2 ici_tensor_parallelism=2 tensor_sequence_parallelism=true \
    shard_optimizer_over_data=true model_name=tinyg num_vocab_tiling=4
same bf16_once_1proc_remat_param_offload 0 1 $ga4 grad_dtype=bfloat16 remat_policy=minimal_offloaded \
    parameter_memory_host_offload=true optimizer_memory_host_offload=true
# vocabulary chunks (3 of V = 64): the chunks' gradient windows against the full buffer
# taken in the same chunks (the same GEMMs onto zeros, then the same sums of two values)
same dp2_zero1_every_fp32_chunks3 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every num_vocab_chunks=3
same fsdp2_k1_chunks3 0 2 per_device_batch_size=2 ici_fsdp_parallelism=2 base_num_decoder_layers=3 num_vocab_chunks=3
same dp2_zero1_every_bf16_tied_chunks3 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every grad_dtype=bfloat16 model_name=tinyg num_vocab_chunks=3
same bf16_once_1proc_param_offload_chunks3 0 1 $ga4 grad_dtype=bfloat16 parameter_memory_host_offload=true \
    num_vocab_chunks=3
# gemma4's per-layer embedding table in the same 3 chunks: each chunk's gradient window
# reduce-scattered (or, one process with bf16 accumulation, folded into the accumulator)
# on its own against the full buffer's rows (the same lookups' sums); the last also
# copies each chunk of the bf16 compute copy's table rows from the host pool. With a
# bf16 accumulator (a rounding per hand-over) the tied embedding's gradient stays one
# whole window (mt_grad_sync_exact_shares 0), so those rows stay bitwise
# gemma4's embedding is tied: with fp32 accumulation (parallel/zero1.h
# mt_grad_sync_exact_shares) its rows reach the sink in two shares, the loss's in the loss
# phase and the lookup's after the embedding's backward (models/model.h
# mt_grad_sink_fn add), reduced apart and summed after: the same fp32 terms summed in
# another order than the full buffer's (h + e_r summed per rank, then over ranks), so
# within the derived fp32 bounds of such a reordering (compare derived=BASE: the
# condition of a one-process fp32 run of the same batch and its perturbed twin), not
# bitwise: the gradients must differ (the shares happened)
base() {
    local name=$1; shift
    run 1 "$name" win "$@" || return
    "$tool" run-kappa "$tmp/${name}_kappa" "$cfg" "$@" > "$tmp/${name}_kappa.log" 2>&1 ||
        fail "$name perturbed: $(tail -3 "$tmp/${name}_kappa.log")"
}
near() {
    local name=$1 b=$2 np=$3; shift 3
    run "$np" "${name}_full" full "$@" || return
    run "$np" "${name}_win" win "$@" || return
    if "$tool" compare "$tmp/${name}_full" "$tmp/${name}_win" derived="$tmp/$b" > "$tmp/$name.cmp" 2>&1; then
        grep "^worst ratio" "$tmp/$name.cmp" | sed "s/^/$name (derived): /"
    else
        fail "$name: windows vs full buffer beyond the derived bounds"; cat "$tmp/$name.cmp"
    fi
    cmp -s "$tmp/${name}_full/grad.bin" "$tmp/${name}_win/grad.bin" &&
        fail "$name: bitwise the full buffer: the tied embedding's two shares did not happen"
}
base base_g4_b8 per_device_batch_size=8 num_vocab_chunks=3 model_name=tinyg4
base base_g4_b4 per_device_batch_size=4 num_vocab_chunks=3 model_name=tinyg4
near dp2_zero1_every_fp32_chunks3_gemma4 base_g4_b8 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every num_vocab_chunks=3 model_name=tinyg4
near fsdp2_k1_chunks3_gemma4 base_g4_b4 2 per_device_batch_size=2 ici_fsdp_parallelism=2 num_vocab_chunks=3 \
    model_name=tinyg4
same dp2_zero1_every_bf16_chunks3_gemma4 0 2 $ga4 ici_data_parallelism=2 shard_optimizer_over_data=true \
    gradient_accumulation_reduce=every grad_dtype=bfloat16 num_vocab_chunks=3 model_name=tinyg4
same bf16_once_1proc_param_offload_chunks3_gemma4 0 1 $ga4 grad_dtype=bfloat16 dtype=bfloat16 \
    parameter_memory_host_offload=true num_vocab_chunks=3 model_name=tinyg4
same dp2_bf16_once_store_back 3.9e-3 2 $ga4 ici_data_parallelism=2 grad_dtype=bfloat16
grep -q "grad.bin: .* worst relative error 0.000e+00" "$tmp/dp2_bf16_once_store_back.cmp" &&
    fail "dp2 bf16 once: identical to the full path, the store-back rounding did not happen"

# fsdp, once, K = 2: reduce-scattered each micro-batch now; against one process
run 1 ref_b8 win per_device_batch_size=8
"$tool" run-kappa "$tmp/ref_b8_kappa" "$cfg" per_device_batch_size=8 > "$tmp/ref_b8_kappa.log" 2>&1 ||
    fail "ref_b8 perturbed: $(tail -3 "$tmp/ref_b8_kappa.log")"
run 2 fsdp2_once_k2 win per_device_batch_size=2 gradient_accumulation_steps=2 ici_fsdp_parallelism=2
"$tool" compare "$tmp/ref_b8" "$tmp/fsdp2_once_k2" derived > "$tmp/fsdp.cmp" 2>&1 ||
    { fail "fsdp2 once K2"; cat "$tmp/fsdp.cmp"; }
sed "s/^/fsdp2_once_k2 vs one process: /" "$tmp/fsdp.cmp"

mt_finish "gradient windows: plans and runs agree"
