#!/usr/bin/env bash
# tests/test_mpi_estimate_commands.sh BUILD_DIR: the estimator's commands run as
# written under mpirun (a fresh user's trial: `meshtrain train ... num_devices=2` with
# every ici_* at 1 exited 2, "1 x 1 x 1 x 1 = 1 but the world has 2 ranks").
#  - `estimate num_devices=2` of a tiny model writes lines that start with
#    `mpirun -np 2 <the binary as invoked> train` and carry the mesh of their row (the
#    estimator searches the layouts of 2 devices: the first line has the top row's);
#  - the first line, run as written from the same directory (given --oversubscribe
#    and a short run), trains (exit 0) and prints the banner once (rank 0 only);
#  - under mpirun -np 2, num_devices=8 is refused (exit 2) naming num_devices.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_mpi_estimate_commands.sh "${1:-}"
mt_need_mpirun
mt_sys_python
mt_mpi_env

mt_tmp

mt_tiny_model "$tmp/cfg/models/tiny.yml" llama
mt_run_yml <<YML
tokenizer_path: $tmp/data/tokenizer.vocab
max_target_length: 16
steps: 2
eval_interval: 0
checkpoint_period: 0
log_period: 1
backend: cpu
YML
"$py" - "$tmp/data" <<'PY'
import struct, sys, random
rng = random.Random(1)
toks = [1 + rng.randrange(63) for _ in range(20000)]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
open(sys.argv[1] + "/train_000.bin", "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
PY

cd "$tmp" || exit 1
# A budget that fits batch 1..a few: the estimator's batches stay small enough to train here.
"$bin" estimate "$tmp/cfg/run.yml" num_devices=2 hbm_gib=0.0005 > est.out 2> est.err || fail "estimate: $(cat est.err)"
cat est.out
line="$(grep -m1 '^mpirun -np 2 ' remat_commands_from_estimator.txt)"
case "$line" in
"mpirun -np 2 $bin train "*) ;;
*) fail "no line starting 'mpirun -np 2 $bin train': $(cat remat_commands_from_estimator.txt)" ;;
esac
# the line spells out the top row's layout (columns 3-6 of the table: data fsdp context tensor)
top="$(awk '$1 == "1" && NF > 12 {printf "ici_data_parallelism=%s ici_fsdp_parallelism=%s ici_context_parallelism=%s ici_tensor_parallelism=%s", $3, $4, $5, $6; exit}' est.out)"
[ -n "$top" ] || fail "no top row in the table: $(cat est.out)"
case "$line" in
*"$top"*) ;;
*) fail "line lacks the top row's mesh ($top): $line" ;;
esac
# run it as written (the binary's path is in it), with --oversubscribe (2 cores shared)
run="${line/#mpirun -np 2 /mpirun --oversubscribe -np 2 }"
eval "$run run_name=est" > run.out 2> run.err || fail "the estimator's command failed: $run: $(cat run.out run.err)"
[ "$(grep -c '^meshtrain: model ' run.out)" -eq 1 ] || fail "banner not printed exactly once: $(cat run.out)"
[ "$(grep -c '^meshtrain: outputs in ' run.out)" -eq 1 ] || fail "outputs line not printed exactly once: $(cat run.out)"
grep -q "step 2/2" run.out || fail "the estimator's command did not train 2 steps: $(cat run.out)"

# num_devices must match the world under mpirun too
mpirun --oversubscribe -np 2 "$bin" train "$tmp/cfg/run.yml" run_name=nd num_devices=8 ici_data_parallelism=2 \
    > nd.out 2> nd.err
rc=$?
[ $rc -eq 2 ] || fail "num_devices=8 under -np 2: exit $rc, expected 2: $(cat nd.out nd.err)"
grep -q "num_devices" nd.err || fail "num_devices=8 under -np 2: key not named: $(cat nd.err)"

mt_finish "ok"
