#!/usr/bin/env bash
# tests/test_cli_hf_bad.sh BUILD_DIR: `meshtrain train ... load_parameters_path=DIR`
# with a damaged Hugging Face directory exits 2, with a "meshtrain: error:" line that
# names the file and (where the damage is in one tensor) the tensor, and writes
# nothing (no run directory). Damage (tests/reference/hf_tiny_dir.py corrupt): a
# truncated file, a header length beyond the file, overlapping data offsets, offsets
# beyond the file, an unknown dtype, a NaN and an Inf in one weight; plus a missing
# shard named by the index, a tensor missing, and a shape mismatch (named with both
# shapes); a config.json describing another model (window, soft-cap, eps, RoPE base,
# attention scale; a command-line model key; another family without model_name).
# Standard-library python3 only.
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_cli_hf_bad.sh "${1:-}"
tiny="$src/tests/reference/hf_tiny_dir.py"
mt_need_python3

mt_tmp

mkdir -p "$tmp/cfg/models" "$tmp/data"
python3 "$tiny" yml > "$tmp/cfg/models/tiny-gemma2.yml"
python3 "$tiny" write "$tmp/good" bf16 1
cat > "$tmp/cfg/run.yml" <<YML
model_name: tiny-gemma2
base_output_directory: $tmp/out
dataset_path: $tmp/data
per_device_batch_size: 2
max_target_length: 8
steps: 1
eval_interval: 0
checkpoint_period: 1
YML
python3 - "$tmp/data" <<'PY'
import struct, sys
d = sys.argv[1]
toks = [3 + (i * 7) % 60 for i in range(400)]
for name in ("train_000.bin", "val_000.bin"):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    open(f"{d}/{name}", "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
PY

# The good directory loads (so each failure below is the damage's doing).
if ! "$bin" train "$tmp/cfg/run.yml" run_name=good load_parameters_path="$tmp/good" > "$tmp/good.out" 2>&1; then
    fail "the undamaged directory does not load: $(cat "$tmp/good.out")"
fi

# expect_bad DESCRIPTION DIR PATTERN...: exit 2, a meshtrain error line, every PATTERN
# in stderr, no run directory.
expect_bad() {
    local desc="$1" dir="$2"; shift 2
    "$bin" train "$tmp/cfg/run.yml" run_name=bad load_parameters_path="$dir" > "$tmp/bad.out" 2> "$tmp/bad.err"
    local rc=$?
    if [ "$rc" -ne 2 ]; then
        fail "$desc: exit code $rc, expected 2 (stderr: $(cat "$tmp/bad.err"))"
    else
        grep -q "^meshtrain: error: " "$tmp/bad.err" || fail "$desc: no 'meshtrain: error:' line: $(cat "$tmp/bad.err")"
        for p in "$@"; do
            [ -z "$p" ] && continue
            grep -qF -- "$p" "$tmp/bad.err" || fail "$desc: stderr does not mention '$p': $(cat "$tmp/bad.err")"
        done
    fi
    [ -n "${MT_SHOW_ERRORS:-}" ] && echo "$desc: $(cat "$tmp/bad.err")"
    [ ! -e "$tmp/out/bad" ] || fail "$desc: wrote $tmp/out/bad"
    rm -rf "$tmp/out/bad"
}

for kind in truncated header_long overlap out_of_range unknown_dtype nan inf; do
    d="$tmp/$kind"
    cp -r "$tmp/good" "$d"
    tensor="$(python3 "$tiny" corrupt "$d" "$kind")" || { fail "$kind: could not damage the file"; continue; }
    expect_bad "$kind" "$d" "$d/model.safetensors" "$tensor"
done

# Sharded directory whose index names a shard that is not there.
python3 "$tiny" write "$tmp/noshard" bf16 2
rm "$tmp/noshard/model-00002-of-00002.safetensors"
expect_bad "missing shard" "$tmp/noshard" "model-00002-of-00002.safetensors"

# A tensor missing, and a shape mismatch: rewrite the header without / with a changed
# entry (the data section is kept consistent by dropping or keeping the bytes).
python3 - "$tmp" <<'PY'
import json, os, shutil, struct, sys
tmp = sys.argv[1]
def load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]
def save(path, header, body):
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + body)
for kind in ("missing", "shape"):
    d = f"{tmp}/{kind}"
    shutil.copytree(f"{tmp}/good", d)
    header, body = load(f"{d}/model.safetensors")
    name = "model.norm.weight"  # the last tensor in the file
    if kind == "missing":
        b, e = header.pop(name)["data_offsets"]
        assert e == len(body)
        body = body[:b]
    else:
        header[name]["shape"] = [2, header[name]["shape"][0] // 2]
    save(f"{d}/model.safetensors", header, body)
PY
expect_bad "missing tensor" "$tmp/missing" "model.norm.weight" "missing"
expect_bad "shape mismatch" "$tmp/shape" "model.norm.weight" "[2, 16]" "[32]"

# The directory's config.json describes another model than the run's (same shapes):
# every model-defining field is compared, naming the MaxText key, the HF field and both
# values; without model_name, a config.json of another family names model_name.
python3 - "$tmp" <<'PY'
import json, shutil, sys
tmp = sys.argv[1]
for kind, key, value in (("window", "sliding_window", 32), ("softcap", "final_logit_softcapping", 20.0),
                         ("eps", "rms_norm_eps", 1e-5), ("theta", "rope_theta", 500000.0),
                         ("scalar", "query_pre_attn_scalar", 16)):
    d = f"{tmp}/cfg_{kind}"
    shutil.copytree(f"{tmp}/good", d)
    c = json.load(open(f"{d}/config.json"))
    c[key] = value
    json.dump(c, open(f"{d}/config.json", "w"))
PY
expect_bad "config.json sliding_window" "$tmp/cfg_window" "sliding_window_size = 32" "'sliding_window'" \
    "sliding_window_size = 4" "load_parameters_path"
expect_bad "config.json final_logit_softcapping" "$tmp/cfg_softcap" "final_logits_soft_cap = 2e+01" "final_logit_softcapping"
expect_bad "config.json rms_norm_eps" "$tmp/cfg_eps" "normalization_layer_epsilon" "rms_norm_eps"
expect_bad "config.json rope_theta" "$tmp/cfg_theta" "rope_max_timescale = 5e+05" "rope_theta"
expect_bad "config.json query_pre_attn_scalar" "$tmp/cfg_scalar" "query_pre_attn_scalar = 16" "query_pre_attn_scalar = 8"
# the run's side differing (a command-line model key) is refused the same way
"$bin" train "$tmp/cfg/run.yml" run_name=bad load_parameters_path="$tmp/good" sliding_window_size=4096 \
    > "$tmp/bad.out" 2> "$tmp/bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -qF "sliding_window_size = 4096" "$tmp/bad.err" ||
    fail "sliding_window_size=4096 against the directory's 4: exit $rc: $(cat "$tmp/bad.err")"
[ ! -e "$tmp/out/bad" ] || fail "sliding_window_size=4096: wrote $tmp/out/bad"
rm -rf "$tmp/out/bad"
grep -v '^model_name:' "$tmp/cfg/run.yml" > "$tmp/cfg/noname.yml"
"$bin" train "$tmp/cfg/noname.yml" run_name=bad load_parameters_path="$tmp/good" > "$tmp/bad.out" 2> "$tmp/bad.err"
rc=$?
[ "$rc" -eq 2 ] && grep -qF "model_name" "$tmp/bad.err" && grep -qF "gemma2" "$tmp/bad.err" ||
    fail "a gemma2 directory without model_name: exit $rc: $(cat "$tmp/bad.err")"
rm -rf "$tmp/out/bad"

mt_finish "ok: damaged Hugging Face directories are refused with exit 2, naming file and tensor"
