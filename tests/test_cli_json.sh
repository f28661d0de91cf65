#!/usr/bin/env bash
# tests/test_cli_json.sh BUILD_DIR: the JSON meshtrain writes (train/json.h: cJSON
# objects, strings escaped, NaN or infinite numbers null) stays valid JSON whatever the
# strings in it, in the layout scripts read (one line, `"key": value`, keys in order):
#  - a CONFIG directory, model file / model_name, base_output_directory and run_name
#    each holding a double quote and a backslash: `plan --json` and `estimate --json`
#    parse with Python's json, model_name reads back as written, each estimate command
#    holds the CONFIG path (single-quoted for the shell);
#  - metrics.jsonl of a run into such a directory: every row parses, its keys in the
#    documented order (train/metrics.h), loss / lr / grad_norm / val_loss printed with
#    %.17g (bitwise round trip; cJSON's own %1.15g would drop bits), and mfu, NaN on the
#    CPU backend (no peak FLOP/s), written as null.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_json.sh "${1:-}"
mt_need_python3
mt_tmp
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
cd "$tmp" # estimate writes ./remat_commands_from_estimator.txt

odd='q"b\s'                       # a double quote and a backslash
cdir="$tmp/cfg $odd"              # the CONFIG directory, its models/ beside it
mt_tiny_model "$cdir/models/tiny$odd.yml" llama || exit 1
mt_shards "$tmp/data" 1 train_000.bin=400 val_000.bin=200
# YAML double-quoted strings as Python's json writes them (\" and \\ escapes)
python3 - "$cdir/run.yml" "tiny$odd" "$tmp/out$odd" "$tmp/data" <<'PY'
import json, sys
path, name, out, data = sys.argv[1:]
keys = {"model_name": name, "base_output_directory": out, "dataset_path": data}
with open(path, "w") as f:
    f.writelines("%s: %s\n" % (k, json.dumps(v)) for k, v in keys.items())
    f.write("per_device_batch_size: 2\nmax_target_length: 16\nsteps: 3\nlearning_rate: 0.01\n"
            "warmup_steps_fraction: 0\neval_interval: 3\neval_steps: 1\ncheckpoint_period: 0\n"
            "log_period: 1\nbackend: cpu\nseed: 5\n")
PY

# --- plan --json and estimate --json ---
"$bin" plan "$cdir/run.yml" --json > plan.json 2> err || fail "plan --json: $(cat err)"
"$bin" estimate "$cdir/run.yml" hbm_gib=0.01 --json > est.json 2> err || fail "estimate --json: $(cat err)"
python3 - "tiny$odd" "$cdir/run.yml" <<'PY' || fail "plan / estimate --json: $(cat plan.json est.json)"
import json, sys
name, cfg = sys.argv[1], sys.argv[2]
for f in ("plan.json", "est.json"):
    text = open(f).read()
    assert text.count("\n") == 1 and text.endswith("}\n"), (f, "not one line")
    d = json.loads(text)
    assert d["model_name"] == name, (f, d["model_name"])
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    assert text.startswith('{"model_name": "' + escaped + '", '), text[:60]
p = json.load(open("plan.json"))
assert list(p)[:5] == ["model_name", "num_params", "per_device_batch_size", "max_target_length",
                       "gradient_accumulation_steps"], list(p)
assert p["mesh"] == {"data": 1, "fsdp": 1, "context": 1, "tensor": 1}, p["mesh"]
e = json.load(open("est.json"))
assert e["rows"], "no estimate rows"
quoted = "'" + cfg + "'"  # no ' in it: one pair of single quotes
for r in e["rows"]:
    assert " train " + quoted + " " in r["command"], r["command"]
assert e["step_model"]["applies_to_backend"] is False
PY

# --- train: metrics.jsonl under out$odd/run$odd/ ---
"$bin" train "$cdir/run.yml" run_name="run$odd" > train.out 2> train.err || fail "train: $(cat train.out train.err)"
metrics="$tmp/out$odd/run$odd/metrics.jsonl"
python3 - "$metrics" <<'PY' || fail "metrics.jsonl: $(cat "$metrics")"
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
rows = [json.loads(l) for l in lines]
train = ["step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms", "mfu"]
assert [list(r) for r in rows] == [["step", "val_loss", "val_tokens"], train, train,
                                   train + ["val_loss", "val_tokens"]], [list(r) for r in rows]
for line, r in zip(lines, rows):
    assert line.startswith('{"step": %d' % r["step"]), line
    for k in ("loss", "lr", "grad_norm", "val_loss"):
        if k in r:
            text = re.search(r'"%s": ([^,}]*)' % k, line).group(1)
            assert "%.17g" % float(text) == text, (k, text)
    if "mfu" in r:
        assert r["mfu"] is None and '"mfu": null' in line, line
PY
grep -q '"mfu": null}' "$metrics" || fail "no '\"mfu\": null}' in metrics.jsonl"

mt_finish "ok: plan/estimate --json and metrics.jsonl with quotes and backslashes, mfu null"
