#!/usr/bin/python3
"""Turn `bible -f` output (one "Ref Text" verse per line) and Ambrose Bierce's
The Devil's Dictionary (1911, public domain; Debian package dict-devil, dictd format)
into the bundled corpus.

Run with Debian's /usr/bin/python3 (python3-numpy, python3-sentencepiece).
Called by scripts/prepare_corpus.sh; see docs/corpus.md.

  kjv_corpus.py split RAW DEVIL_DICT_DZ DEVIL_INDEX TRAIN_TXT
      Write the train documents' lines (verses; dictionary paragraphs), one per
      line, without references (the input of spm_train).
  kjv_corpus.py shards RAW DEVIL_DICT_DZ DEVIL_INDEX TOKENIZER_MODEL OUTDIR
      Encode every document as [BOS] + its lines' tokens and write
      OUTDIR/train_000.bin and OUTDIR/val_000.bin (llm.c shards).

A document is one Bible chapter (1189 of them) or one dictionary entry (about 1000),
Bible first. Every 20th document of each source (index % 20 == 19) is held out as
validation, about 5%, spread over both texts so that train and val have the same
mix of styles. The KJV alone is 4,137,847 bytes, just under 4 MiB; the dictionary
adds about 0.37 MB of public-domain prose so the corpus clears 4 MiB.
Everything is deterministic: no randomness, no dict-order dependence.
"""
import os
import re
import sys

import numpy as np

SHARD_MAGIC = 20240520   # llm.c token shard, version 1 = uint16 tokens
SHARD_VERSION = 1
HEADER_INTS = 256
VAL_EVERY = 20           # every VAL_EVERY-th chapter goes to val

# "Ge1:1 In the beginning ...", "1Sm3:10 ...", "SSol2:1 ..."
VERSE_RE = re.compile(r"^([0-9]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$")


def read_chapters(raw_path):
    """List of (book, chapter, [verse text, ...]) in canonical order."""
    chapters = []
    key = None
    with open(raw_path, encoding="ascii") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            m = VERSE_RE.match(line)
            if m is None:
                sys.exit(f"kjv_corpus: {raw_path}:{lineno}: not a verse line: {line[:60]!r}")
            book, chap, text = m.group(1), int(m.group(2)), m.group(4).strip()
            if (book, chap) != key:
                key = (book, chap)
                chapters.append((book, chap, []))
            chapters[-1][2].append(" ".join(text.split()))
    if len(chapters) < 1000:
        sys.exit(f"kjv_corpus: only {len(chapters)} chapters in {raw_path}; expected 1189")
    return chapters


DICTD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def dictd_number(text):
    """dictd index numbers are base-64 digits, most significant first."""
    n = 0
    for ch in text:
        n = n * 64 + DICTD_B64.index(ch)
    return n


def read_devil(dict_dz, index_path):
    """List of ("devil", headword, [paragraph, ...]) from the dictd files, in index
    order, skipping the 00database* metadata entries. A paragraph is a run of
    non-blank lines joined with single spaces."""
    import gzip
    with gzip.open(dict_dz, "rb") as f:   # dictzip is gzip-compatible
        data = f.read()
    docs = []
    with open(index_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                sys.exit(f"kjv_corpus: {index_path}:{lineno}: not a dictd index line")
            head, off, size = parts[0], dictd_number(parts[1]), dictd_number(parts[2])
            if head.startswith("00database"):
                continue
            if off + size > len(data):
                sys.exit(f"kjv_corpus: {index_path}:{lineno}: entry {head!r} beyond {dict_dz}")
            body = data[off:off + size].decode("latin-1")
            paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
            paras = [p.encode("ascii", "ignore").decode() for p in paras if p.strip()]
            if paras:
                docs.append(("devil", head, paras))
    if len(docs) < 500:
        sys.exit(f"kjv_corpus: only {len(docs)} entries in {dict_dz}; expected about 1000")
    return docs


def read_documents(raw_path, dict_dz, index_path):
    """Bible chapters then dictionary entries, each (source, name, [line, ...]), with
    a per-source index used for the train/val split."""
    out = []
    for i, doc in enumerate(read_chapters(raw_path)):
        out.append((i, doc[2]))
    for i, doc in enumerate(read_devil(dict_dz, index_path)):
        out.append((i, doc[2]))
    return out


def is_val(index):
    return index % VAL_EVERY == VAL_EVERY - 1


def cmd_split(raw_path, dict_dz, index_path, out_txt):
    docs = read_documents(raw_path, dict_dz, index_path)
    nbytes = 0
    with open(out_txt, "w", encoding="ascii", newline="\n") as f:
        for i, lines in docs:
            if is_val(i):
                continue
            for v in lines:
                f.write(v + "\n")
                nbytes += len(v) + 1
    all_bytes = sum(len(v) + 1 for _, vs in docs for v in vs)
    print(f"corpus: {len(docs)} documents, {sum(len(d[1]) for d in docs)} lines, "
          f"{all_bytes} bytes of text ({nbytes} in train)")
    if all_bytes < 4 * 1024 * 1024:
        sys.exit(f"kjv_corpus: only {all_bytes} bytes of text; the corpus must exceed 4 MiB")


def write_shard(path, tokens):
    """llm.c shard: 256 x int32 header [magic, version, count, 0...] then uint16 tokens."""
    toks = np.asarray(tokens, dtype=np.int64)
    if toks.size and (toks.min() < 0 or toks.max() > 0xFFFF):
        sys.exit(f"kjv_corpus: token id out of uint16 range in {path}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, toks.size
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())
    os.replace(tmp, path)
    expect = HEADER_INTS * 4 + 2 * toks.size
    if os.path.getsize(path) != expect:
        sys.exit(f"kjv_corpus: {path} has size {os.path.getsize(path)}, expected {expect}")


def cmd_shards(raw_path, dict_dz, index_path, model_path, outdir):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    bos = sp.bos_id()
    if bos < 0:
        sys.exit("kjv_corpus: tokenizer has no BOS piece")
    split = {"train": [], "val": []}
    docs = {"train": 0, "val": 0}
    for i, verses in read_documents(raw_path, dict_dz, index_path):
        name = "val" if is_val(i) else "train"
        split[name].append(bos)
        for ids in sp.encode(verses, out_type=int):
            split[name].extend(ids)
        docs[name] += 1
    for name in ("train", "val"):
        write_shard(os.path.join(outdir, f"{name}_000.bin"), split[name])
    total = len(split["train"]) + len(split["val"])
    print(f"tokens: train {len(split['train'])} ({docs['train']} documents), "
          f"val {len(split['val'])} ({docs['val']} documents), total {total}; "
          f"vocab {sp.get_piece_size()}, unk {sp.unk_id()}, bos {bos}, eos {sp.eos_id()}")


def main(argv):
    if len(argv) == 6 and argv[1] == "split":
        cmd_split(*argv[2:6])
    elif len(argv) == 7 and argv[1] == "shards":
        cmd_shards(*argv[2:7])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
