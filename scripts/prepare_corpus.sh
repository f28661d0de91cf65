#!/usr/bin/env bash
# Build the bundled corpus: the King James Bible (Debian bible-kjv-text, read with
# the `bible` program of bible-kjv) and Ambrose Bierce's The Devil's Dictionary
# (Debian dict-devil, unpacked from its .deb: installing it would pull in a dictd
# server we do not need) -> SentencePiece BPE tokenizer (vocab 8192,
# trained offline with Debian's spm_train) -> llm.c token shards.
#
#   scripts/prepare_corpus.sh [OUTDIR]      (default: data/kjv under the repo root)
#
# Writes OUTDIR/{train_000.bin,val_000.bin,tokenizer.model,tokenizer.vocab}.
# Deterministic: two runs give byte-identical files. See docs/corpus.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
outdir="${1:-$root/data/kjv}"
py=/usr/bin/python3
vocab_size=8192

die() { echo "prepare_corpus: $*" >&2; exit 1; }
command -v bible >/dev/null || die "'bible' not found (package bible-kjv); run scripts/install-deps.sh"
[ -r /usr/lib/bible.data ] || die "/usr/lib/bible.data missing (package bible-kjv-text)"
command -v spm_train >/dev/null || die "'spm_train' not found (package sentencepiece)"
"$py" -c 'import numpy, sentencepiece' 2>/dev/null ||
    die "$py lacks numpy or sentencepiece (packages python3-numpy python3-sentencepiece)"

start=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Text: one verse per line, "Ge1:1 In the beginning ..." (-f: references, no wrapping).
#    -p /usr/lib: read the packaged text, never a bible.data in the current directory.
(cd "$work" && bible -f -p /usr/lib Gen1:1-Rev22:21 > kjv_raw.txt)
[ "$(wc -l < "$work/kjv_raw.txt")" -eq 31102 ] ||
    die "bible printed $(wc -l < "$work/kjv_raw.txt") verses, expected 31102"
# The Devil's Dictionary: the installed copy if there is one, else the package
# unpacked into the work dir (apt-get download + dpkg -x; nothing is installed).
devil_dz=/usr/share/dictd/devil.dict.dz devil_index=/usr/share/dictd/devil.index
if [ ! -r "$devil_dz" ] || [ ! -r "$devil_index" ]; then
    # A fresh machine may have no package lists yet: update once (root) and retry.
    (cd "$work" && apt-get download dict-devil > apt.log 2>&1) ||
        { [ "$(id -u)" -eq 0 ] && apt-get update -qq > /dev/null 2>&1 &&
          (cd "$work" && apt-get download dict-devil > apt.log 2>&1); } ||
        { cat "$work/apt.log" >&2; die "could not download package dict-devil"; }
    dpkg -x "$work"/dict-devil_*.deb "$work/devil"
    devil_dz="$work/devil/usr/share/dictd/devil.dict.dz"
    devil_index="$work/devil/usr/share/dictd/devil.index"
fi
"$py" "$root/scripts/kjv_corpus.py" split "$work/kjv_raw.txt" "$devil_dz" "$devil_index" "$work/train.txt"

# 2. Tokenizer, trained on the train split only. Reproducible: one thread, all
#    sentences loaded in file order (input_sentence_size=0, no shuffling), fixed seed.
#    Ids: <unk>=0 <s>=1 (BOS, starts every chapter) </s>=2 (EOS, unused in the shards).
#    byte_fallback off: decoding concatenates pieces and maps U+2581 to a space.
#    Relative paths: the model records its trainer_spec, which must not name $work.
if ! (cd "$work" && spm_train --input=train.txt --model_prefix=tokenizer \
        --model_type=bpe --vocab_size=$vocab_size --character_coverage=1.0 \
        --byte_fallback=false --normalization_rule_name=identity \
        --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
        --num_threads=1 --input_sentence_size=0 --shuffle_input_sentence=false \
        --random_seed=1234 > spm_train.log 2>&1); then
    tail -n 20 "$work/spm_train.log" >&2
    die "spm_train failed"
fi

# 3. Shards: [BOS] + document tokens per document, every 20th document to val.
"$py" "$root/scripts/kjv_corpus.py" shards "$work/kjv_raw.txt" "$devil_dz" "$devil_index" \
    "$work/tokenizer.model" "$work"

# 4. Install: all four files, then nothing is half-written.
mkdir -p "$outdir"
for f in tokenizer.model tokenizer.vocab val_000.bin train_000.bin; do
    cp "$work/$f" "$outdir/$f.tmp"
    mv -f "$outdir/$f.tmp" "$outdir/$f"
done
echo "corpus: wrote $outdir in $(( $(date +%s) - start )) s"
