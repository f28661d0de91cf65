#!/usr/bin/env bash
# tests/test_tokenizer_decode.sh BUILD_DIR: train/tokenizer.c decodes as the tokenizer
# libraries themselves do. tests/reference/tokenizer_kinds.py makes a byte-level BPE
# (Llama 3), a SentencePiece-style BPE with byte fallback (Gemma / Llama 2), a
# WordPiece (BERT) and a Unigram + Metaspace tokenizer.json with the Hugging Face
# `tokenizers` library, and a SentencePiece BPE .model/.vocab with `sentencepiece`;
# random id lists and encoded sentences are decoded by tests/tools/tokenizer_decode
# and by the library (decode(ids, skip_special_tokens=True); DecodeIds) and must be
# byte-identical. Also: a tokenizer.json with an unsupported decoder, a file that is
# not JSON, and a missing file are refused with their names.
# Exit 77 (skipped) without scripts/setup-hf-venv.sh's environment (MT_HF_VENV).
set -u
. "$(dirname "$0")/lib.sh"
mt_build test_tokenizer_decode.sh "${1:-}" tests/tools/tokenizer_decode
tool="$bin"
mt_need_hf_venv
mt_tmp

"$py" "$src/tests/reference/tokenizer_kinds.py" make "$tmp/k" > "$tmp/make.log" 2>&1 ||
    { cat "$tmp/make.log"; fail "tokenizer_kinds.py make failed"; mt_finish ""; }
for k in bytelevel.json gemma.json wordpiece.json unigram.json spm.vocab; do
    [ -f "$tmp/k/$k" ] || fail "tokenizer_kinds.py did not make $k"
done
"$py" "$src/tests/reference/tokenizer_kinds.py" check "$tmp/k" "$tool" || fail "decoding differs from the libraries'"

# Refusals name the file and the reason.
"$py" - "$tmp/k/bytelevel.json" "$tmp/ctc.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j["decoder"] = {"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": True}
json.dump(j, open(sys.argv[2], "w"))
PY
out="$("$tool" "$tmp/ctc.json" < /dev/null)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"ctc.json"*"'CTC'"* ]] || fail "a CTC decoder: rc $rc, '$out'"
echo "not json" > "$tmp/bad.json"
out="$("$tool" "$tmp/bad.json" < /dev/null)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"bad.json"*"not JSON"* ]] || fail "a file that is not JSON: rc $rc, '$out'"
out="$("$tool" "$tmp/missing.json" < /dev/null)"; rc=$?
[ $rc -eq 2 ] && [[ "$out" == *"missing.json"* ]] || fail "a missing file: rc $rc, '$out'"
mt_finish "tokenizer decoding: every kind matches its library"
