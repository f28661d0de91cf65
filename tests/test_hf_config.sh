#!/usr/bin/env bash
# tests/test_hf_config.sh BUILD_DIR: every config.json of tests/fuzz_corpus/hf_config
# (written by transformers 4.57.6, by meshtrain, and variants: gemma3 nested under
# text_config, rope_parameters, a gemma3 whose layers are all sliding — the input the
# fuzzer found the writer/reader disagreeing on) is read by mt_hf_config_read, and
# what mt_hf_config_write makes of it reads back as the same model
# (tests/tools/hf_config_check). The well-formed seeds must all be accepted.
set -u
BUILD=${1:?usage: test_hf_config.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
TOOL="$BUILD/tests/tools/hf_config_check"
[ -x "$TOOL" ] || { echo "FAIL: $TOOL not built"; exit 1; }
out=$("$TOOL" "$SRC"/tests/fuzz_corpus/hf_config/*.json)
rc=$?
echo "$out" | sed "s|$SRC/||"
if echo "$out" | grep -q "^refused"; then
    echo "FAIL: a seed config was refused"
    exit 1
fi
exit $rc
