#!/usr/bin/env bash
# tests/test_prepare_bad.sh BUILD_DIR: `meshtrain prepare` refuses bad input with exit 2
# and a message naming it: a missing input, a file that is not UTF-8, an unknown
# format, an empty document set, a JSONL line that is not JSON or lacks --field, a
# Parquet file without the column, a missing or malformed tokenizer, a --bos-token
# the tokenizer lacks, a vocabulary over 2^32 ids, shards already in --output, a bad
# --shard-size; a failed run leaves no shard and removes an --output directory it
# created (not one that was there); it writes uint32 shards (magic 20240801 version 7) for a vocabulary
# over 65536 ids; and it reads Parquet (pyarrow) and SentencePiece .model input (BOS per
# document from the model's bos_id). Exit 77 (skipped) without the `tokenizers`
# environment of scripts/setup-hf-venv.sh (MT_HF_VENV).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_prepare_bad.sh "${1:-}"
mt_need_hf_venv
export MESHTRAIN_PYTHON="$py"
mt_tmp
"$py" "$src/tests/reference/tokenizer_kinds.py" tiny "$tmp/tok.json" 64 > /dev/null 2>&1 || fail "no tokenizer"
mkdir -p "$tmp/in" "$tmp/empty"
for i in 1 2 3 4 5 6; do echo "the cat sat on the mat number $i" > "$tmp/in/d$i.txt"; done
printf '\n  \n' > "$tmp/empty/blank.txt"
printf 'ok\xff\xfe\n' > "$tmp/latin.txt"
echo "a,b" > "$tmp/table.csv"
printf '{"text": "the cat"}\n{"body": "no text here"}\n' > "$tmp/nofield.jsonl"
printf '{"text": "the cat"}\n{not json\n' > "$tmp/notjson.jsonl"
printf '{"text": 5}\n' > "$tmp/number.jsonl"
echo "not a tokenizer" > "$tmp/bad-tok.json"

# expect_bad NAME NEEDLE... -- ARGS: prepare ARGS exits 2 and stderr has every NEEDLE
expect_bad() {
    local name="$1"; shift
    local needles=()
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done
    shift
    local pre=0
    [ -e "$tmp/o" ] && pre=1
    "$bin" prepare "$@" > "$tmp/out.txt" 2> "$tmp/err.txt"
    local rc=$?
    if [ $rc -ne 2 ]; then fail "$name: exit $rc, not 2: $(cat "$tmp/out.txt" "$tmp/err.txt")"; return; fi
    for n in "${needles[@]}"; do
        grep -qF -- "$n" "$tmp/err.txt" || fail "$name: the message does not name '$n': $(cat "$tmp/err.txt")"
    done
    [ -z "$(ls "$tmp/o" 2>/dev/null | grep '\.bin$')" ] || fail "$name: shards were written: $(ls "$tmp/o")"
    # an --output directory the failed run created is removed again (one that was there stays)
    [ $pre = 1 ] || [ ! -e "$tmp/o" ] || fail "$name: left the output directory it created: $(ls -a "$tmp/o")"
    [ $pre = 0 ] || [ -d "$tmp/o" ] || fail "$name: removed an output directory that was there before"
    rm -rf "$tmp/o"
}
T=(--tokenizer "$tmp/tok.json" --output "$tmp/o")
expect_bad "missing input" "$tmp/nope.txt" "no such file" -- "${T[@]}" "$tmp/nope.txt"
# a missing input is bad input (exit 2) even where the Python lacks the tokenizer
# package (checked before the tokenizer is loaded): Debian's python3 without tokenizers
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c "import tokenizers" 2> /dev/null; then
    MESHTRAIN_PYTHON=/usr/bin/python3 expect_bad "missing input, no tokenizers package" "$tmp/nope.txt" \
        "no such file" -- "${T[@]}" "$tmp/nope.txt"
fi
expect_bad "not UTF-8" "$tmp/latin.txt" "not UTF-8" -- "${T[@]}" "$tmp/latin.txt"
expect_bad "unknown format" "$tmp/table.csv" "unknown format" -- "${T[@]}" "$tmp/table.csv"
expect_bad "empty document set" "no documents" "$tmp/empty/blank.txt" -- "${T[@]}" "$tmp/empty"
expect_bad "JSONL without the field" "$tmp/nofield.jsonl" "line 2" "'text'" -- "${T[@]}" "$tmp/nofield.jsonl"
expect_bad "JSONL --field" "'body'" "line 1" -- "${T[@]}" --field body "$tmp/nofield.jsonl"
expect_bad "JSONL not JSON" "$tmp/notjson.jsonl" "line 2" "not JSON" -- "${T[@]}" "$tmp/notjson.jsonl"
expect_bad "JSONL non-string" "$tmp/number.jsonl" "not a string" -- "${T[@]}" "$tmp/number.jsonl"
expect_bad "missing tokenizer" "$tmp/none.json" -- --tokenizer "$tmp/none.json" --output "$tmp/o" "$tmp/in"
expect_bad "malformed tokenizer" "$tmp/bad-tok.json" "tokenizer.json" -- --tokenizer "$tmp/bad-tok.json" --output "$tmp/o" "$tmp/in"
expect_bad "unknown --bos-token" "--bos-token" "<nope>" -- "${T[@]}" --bos-token "<nope>" "$tmp/in"
expect_bad "shard size" "--shard-size" -- "${T[@]}" --shard-size 0 "$tmp/in"
expect_bad "shard size over int32" "--shard-size" -- "${T[@]}" --shard-size 2147483648 "$tmp/in"
expect_bad "no val document" "val split" -- "${T[@]}" --val-every 1000 "$tmp/in/d1.txt"
expect_bad "unknown option" "--frobnicate" "usage: meshtrain prepare [-h] --tokenizer" -- "${T[@]}" --frobnicate "$tmp/in"
grep -qF "{prepare,encode}" "$tmp/err.txt" && fail "unknown option: the internal usage: $(cat "$tmp/err.txt")"
# a failed run into a directory that was there keeps it and what it holds
mkdir -p "$tmp/o" && echo mine > "$tmp/o/notes.txt"
"$bin" prepare "${T[@]}" --val-every 1000 "$tmp/in/d1.txt" > /dev/null 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(ls -A "$tmp/o")" = notes.txt ] ||
    fail "a failed prepare into a directory that was there: exit $rc, left $(ls -A "$tmp/o" 2>&1)"
rm -rf "$tmp/o"
# shards already there
"$bin" prepare "${T[@]}" --val-every 0 "$tmp/in" > /dev/null 2>&1 || fail "prepare of good input failed"
"$bin" prepare "${T[@]}" --val-every 0 "$tmp/in" > /dev/null 2> "$tmp/err.txt"
[ $? -eq 2 ] && grep -qF "already holds" "$tmp/err.txt" || fail "a second prepare into the same --output: $(cat "$tmp/err.txt")"
rm -rf "$tmp/o"

# a vocabulary over 2^32 ids: no tokenizer file can hold one (the libraries use 32-bit
# ids), so the check runs on the script with its tokenizer loader replaced
"$py" - "$src/scripts/prepare_data.py" "$tmp" <<'PY' 2> "$tmp/err.txt"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("prepare_data", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def huge(path):
    t = m.Tok(); t.path, t.kind, t.vocab_size = path, "tokenizer.json", 2**32 + 1
    return t
m.load_tokenizer = huge
try:
    m.main(["--tokenizer", "huge.json", "--output", sys.argv[2] + "/o", sys.argv[2] + "/in"])
except SystemExit as e:
    sys.exit(e.code)
sys.exit(0)
PY
rc=$?
[ $rc -eq 2 ] && grep -qF "huge.json" "$tmp/err.txt" && grep -qF "over 2^32" "$tmp/err.txt" ||
    fail "a vocabulary over 2^32: exit $rc, $(cat "$tmp/err.txt")"

# Parquet (pyarrow): read, and a missing column refused
if "$py" -c "import pyarrow" 2>/dev/null; then
    "$py" -c 'import sys, pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({"content": ["the cat sat %d" % i for i in range(20)], "n": list(range(20))}), sys.argv[1])' "$tmp/t.parquet"
    expect_bad "Parquet without the column" "$tmp/t.parquet" "'text'" "content" -- "${T[@]}" "$tmp/t.parquet"
    "$bin" prepare "${T[@]}" --field content --val-every 4 "$tmp/t.parquet" > "$tmp/out.txt" 2>&1 ||
        fail "Parquet prepare failed: $(cat "$tmp/out.txt")"
    grep -q "train: [0-9]* documents" "$tmp/out.txt" || fail "Parquet prepare: $(cat "$tmp/out.txt")"
    "$py" -c 'import json, sys; s = json.load(open(sys.argv[1])); assert sum(s["documents"].values()) == 20, s' \
        "$tmp/o/o_prepare.json" || fail "Parquet prepare did not read 20 documents"
    rm -rf "$tmp/o"
else
    fail "no pyarrow in $venv: scripts/setup-hf-venv.sh installs it"
fi

# SentencePiece .model: BOS (bos_id) per document, uint16
if "$py" -c "import sentencepiece" 2>/dev/null; then
    "$py" "$src/tests/reference/tokenizer_kinds.py" make "$tmp/k" > /dev/null 2>&1
    "$bin" prepare --tokenizer "$tmp/k/spm.model" --output "$tmp/o" --val-every 0 "$tmp/in" > "$tmp/out.txt" 2>&1 ||
        fail "prepare with a .model failed: $(cat "$tmp/out.txt")"
    "$py" - "$tmp" <<'PY' || fail "the .model shard is not BOS + sentencepiece's ids per document"
import glob, struct, sys
import sentencepiece as spm
t = sys.argv[1]
sp = spm.SentencePieceProcessor(model_file=t + "/k/spm.model")
want = []
for p in sorted(glob.glob(t + "/in/*.txt")):
    want += [sp.bos_id()] + sp.EncodeAsIds(open(p).read())
raw = open(t + "/o/o_train_000000.bin", "rb").read()
hdr = struct.unpack("<3i", raw[:12])
assert hdr == (20240520, 1, len(want)), hdr
assert list(struct.unpack("<%dH" % hdr[2], raw[1024:])) == want
PY
    rm -rf "$tmp/o"
fi
# a vocabulary over 65536 ids: uint32 tokens, llm.c's magic 20240801 version 7
"$py" - "$tmp/big.json" <<'PY'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
vocab = {"[UNK]": 0, **{"w%d" % i: i + 1 for i in range(70000)}, "the": 70001, "cat": 70002}
t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.save(sys.argv[1])
PY
echo "the cat w5 w69999 the" > "$tmp/big.txt"
"$bin" prepare --tokenizer "$tmp/big.json" --output "$tmp/o" --val-every 0 "$tmp/big.txt" > "$tmp/out.txt" 2>&1 ||
    fail "prepare with a 70003-id vocabulary failed: $(cat "$tmp/out.txt")"
"$py" -c 'import struct, sys
raw = open(sys.argv[1], "rb").read()
assert struct.unpack("<3i", raw[:12]) == (20240801, 7, 5), struct.unpack("<3i", raw[:12])
assert list(struct.unpack("<5I", raw[1024:])) == [70001, 70002, 6, 70000, 70001], struct.unpack("<5I", raw[1024:])' \
    "$tmp/o/o_train_000000.bin" || fail "a 70003-id vocabulary did not give uint32 shards (magic 20240801, version 7)"
rm -rf "$tmp/o"
mt_finish "prepare: bad input exits 2 naming it; Parquet and .model input read"
