#!/usr/bin/env python3
"""scripts/prepare_data.py: text into llm.c token shards with a model's own tokenizer.

Run as `meshtrain prepare ...` (train/main.c runs this script with the Python of
.venv-hf, made by scripts/setup-hf-venv.sh) or directly with that Python.

  prepare_data.py prepare --tokenizer TOK --output DIR [options] INPUT...
  prepare_data.py encode  --tokenizer TOK --text TEXT      (sample's text prompt)

TOK: a Hugging Face tokenizer.json (or a model directory holding one; encoded with the
`tokenizers` library) or a SentencePiece .model (the `sentencepiece` library).

INPUT: files or directories (searched recursively for the known suffixes), each read
as --format says (auto: by suffix): text (.txt .text .md; one document per file, or
per blank-line paragraph or per line with --text-split), jsonl (.jsonl .ndjson
.json; one document per line, the string in --field, default "text") or parquet
(.parquet; the string column --field, via pyarrow).

Documents: each is encoded as the tokenizer defines: tokenizer.json with
add_special_tokens=True, i.e. its post-processor (Llama 3 adds <|begin_of_text|>,
Gemma <bos>, a "<s> $A </s>" template both); a SentencePiece model prepends bos_id
(when the model has one). --bos-token / --eos-token add a token the tokenizer does
not add itself (e.g. --eos-token '<|end_of_text|>'). Empty documents are skipped.

Split (deterministic): a document goes to val when the first 8 bytes of
BLAKE2b-64(seed as 8 little-endian bytes + the document's UTF-8 bytes), read as a
little-endian integer, are 0 modulo --val-every (default 20: about 1 in 20); so the
split of a document depends on its text and the seed only, not on file order.
--val-every 0 writes no val split. Documents stay in input order within each split.

Output: DIR/<name>_train_NNNNNN.bin and DIR/<name>_val_NNNNNN.bin (llm.c's names and
format, as llm.c's dev/data/data_common.py write_datafile writes it): a 256 x int32
little-endian header [magic, version, token count, 0...] then the tokens: magic
20240520 version 1 with uint16 tokens when the vocabulary fits (<= 65536 ids), else
magic 20240801 version 7 with uint32 tokens (llm.c's Llama 3 shards). Each shard
holds --shard-size tokens (default 10^8, at most 2^31 - 1, the header's int32 count)
except the last of a split; documents run on across shard boundaries as in llm.c.
Files are written under a temporary name and renamed, then DIR/<name>_prepare.json
records the inputs, tokenizer, options and counts. A progress bar goes to stderr
when stderr is a terminal.

Exit codes: 0 done; 2 bad input, naming it (an unreadable or unknown-format file, a
JSONL line that is not JSON or lacks the field, an empty document set, a vocabulary
over 2^32 ids, an unreadable tokenizer, a bad option); 1 anything else (a missing
Python package: run scripts/setup-hf-venv.sh; a write error).
"""
import argparse
import array
import hashlib
import json
import os
import struct
import sys
import time

HEADER_INTS = 256
MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7
SHARD_MAX = 2**31 - 1
SUFFIXES = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
            ".json": "jsonl", ".parquet": "parquet"}


class BadInput(Exception):
    """Bad input: exit 2 with the message."""


PROG = "meshtrain prepare"  # `meshtrain sample` runs the encode subcommand: "meshtrain sample"


def die(code, msg):
    sys.stderr.write("%s: error: %s\n" % (PROG, msg))
    sys.exit(code)


# ---------------------------------------------------------------- tokenizers ----

class Tok:
    """encode(list of str) -> list of list of int (with the document's BOS/EOS);
    vocab_size; token_id(str) -> int or None; kind."""


def need(module, what):
    try:
        return __import__(module)
    except ImportError as e:
        die(1, "the Python package '%s' is needed for %s but cannot be imported by %s (%s): run "
            "scripts/setup-hf-venv.sh, or set MESHTRAIN_PYTHON to a Python that has it"
            % (module, what, sys.executable, e))


def load_tokenizer(path):
    if os.path.isdir(path):
        cand = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(cand):
            cand = os.path.join(path, "tokenizer.model")
        if not os.path.isfile(cand):
            raise BadInput("tokenizer '%s': a directory without tokenizer.json or tokenizer.model" % path)
        path = cand
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise BadInput("tokenizer '%s': cannot read the file" % path)
    t = Tok()
    t.path = path
    if path.endswith(".model"):
        spm = need("sentencepiece", "a SentencePiece .model")
        sp = spm.SentencePieceProcessor()
        try:
            ok = sp.Load(path)
        except Exception as e:  # noqa: BLE001 (the library raises OSError or RuntimeError)
            raise BadInput("tokenizer '%s': not a SentencePiece model (%s)" % (path, e))
        if not ok:
            raise BadInput("tokenizer '%s': not a SentencePiece model" % path)
        t.kind = "sentencepiece"
        t.vocab_size = sp.GetPieceSize()
        bos = sp.bos_id()

        def enc(texts):
            out = sp.EncodeAsIds(texts) if texts else []
            return [([bos] if bos >= 0 else []) + list(ids) for ids in out]
        t.encode = enc

        def tid(s):
            i = sp.PieceToId(s)
            return i if i != sp.unk_id() or s == sp.IdToPiece(sp.unk_id()) else None
        t.token_id = tid
        t.is_special = lambda i: sp.IsControl(i) or sp.IsUnknown(i)
        return t
    tk = need("tokenizers", "a Hugging Face tokenizer.json (a file not ending in .model is read as one)")
    try:
        tok = tk.Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 (tokenizers raises its own Exception)
        raise BadInput("tokenizer '%s': not a Hugging Face tokenizer.json (%s)" % (path, e))
    t.kind = "tokenizer.json"
    t.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    specials = {i for i, a in tok.get_added_tokens_decoder().items() if a.special}

    def enc_json(texts):
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)] if texts else []
    t.encode = enc_json
    t.token_id = tok.token_to_id
    t.is_special = lambda i: i in specials
    return t


# ---------------------------------------------------------------- inputs ----

def list_inputs(paths, fmt):
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, names in os.walk(p):
                dirs.sort()
                for n in sorted(names):
                    if fmt != "auto" or os.path.splitext(n)[1].lower() in SUFFIXES:
                        found.append(os.path.join(root, n))
            if not found:
                raise BadInput("input directory '%s' holds no file of a known format (%s)"
                               % (p, " ".join(sorted(SUFFIXES))))
            files += found
        elif os.path.exists(p):
            files.append(p)
        else:
            raise BadInput("input '%s': no such file or directory" % p)
    out = []
    for f in files:
        kind = fmt
        if kind == "auto":
            kind = SUFFIXES.get(os.path.splitext(f)[1].lower())
            if kind is None:
                raise BadInput("input '%s': unknown format (suffix not one of %s); give --format text|jsonl|parquet"
                               % (f, " ".join(sorted(SUFFIXES))))
        if not os.access(f, os.R_OK) or not os.path.isfile(f):
            raise BadInput("input '%s': cannot read the file" % f)
        out.append((f, kind))
    return out


def read_text(path):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise BadInput("input '%s': cannot read: %s" % (path, e.strerror))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput("input '%s': not UTF-8 text (byte %d)" % (path, e.start))


def documents(path, kind, args):
    """Yield (document text, bytes consumed so far in this file)."""
    if kind == "text":
        text = read_text(path)
        size = len(text.encode("utf-8"))
        if args.text_split == "file":
            yield text, size
        elif args.text_split == "line":
            for line in text.splitlines():
                yield line, size
        else:
            para = []
            for line in text.splitlines():
                if line.strip():
                    para.append(line)
                elif para:
                    yield "\n".join(para), size
                    para = []
            if para:
                yield "\n".join(para), size
    elif kind == "jsonl":
        try:
            fh = open(path, "rb")
        except OSError as e:
            raise BadInput("input '%s': cannot read: %s" % (path, e.strerror))
        with fh:
            done = 0
            for n, raw in enumerate(fh, 1):
                done += len(raw)
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw)
                except ValueError as e:
                    raise BadInput("input '%s' line %d: not JSON (%s)" % (path, n, e))
                if not isinstance(row, dict) or args.field not in row:
                    raise BadInput("input '%s' line %d: no field '%s' (give the text's key with --field)"
                                   % (path, n, args.field))
                val = row[args.field]
                if not isinstance(val, str):
                    raise BadInput("input '%s' line %d: field '%s' is a %s, not a string"
                                   % (path, n, args.field, type(val).__name__))
                yield val, done
    else:
        pq = need("pyarrow", "Parquet input")
        import pyarrow.parquet  # noqa: F401 (submodule)
        try:
            pf = pq.parquet.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 (pyarrow raises ArrowInvalid, OSError)
            raise BadInput("input '%s': not a readable Parquet file (%s)" % (path, e))
        names = pf.schema_arrow.names
        if args.field not in names:
            raise BadInput("input '%s': no column '%s' (columns: %s; give the text's column with --field)"
                           % (path, args.field, ", ".join(names)))
        size = os.path.getsize(path)
        rows = max(pf.metadata.num_rows, 1)
        seen = 0
        for batch in pf.iter_batches(columns=[args.field], batch_size=1024):
            col = batch.column(0)
            for v in col.to_pylist():
                seen += 1
                if v is None:
                    continue
                if not isinstance(v, str):
                    raise BadInput("input '%s': column '%s' holds %s values, not strings"
                                   % (path, args.field, type(v).__name__))
                yield v, size * seen // rows


# ---------------------------------------------------------------- shards ----

class ShardWriter:
    """Writes <dir>/<name>_<split>_NNNNNN.bin shards of shard_size tokens."""

    def __init__(self, outdir, name, split, shard_size, wide):
        self.outdir, self.name, self.split, self.shard_size, self.wide = outdir, name, split, shard_size, wide
        self.buf, self.index, self.tokens, self.written = [], 0, 0, []

    def add(self, ids):
        self.buf.extend(ids)
        self.tokens += len(ids)
        while len(self.buf) >= self.shard_size:
            self.flush(self.buf[:self.shard_size])
            del self.buf[:self.shard_size]

    def flush(self, toks):
        path = os.path.join(self.outdir, "%s_%s_%06d.bin" % (self.name, self.split, self.index))
        tmp = path + ".tmp"
        hdr = [0] * HEADER_INTS
        hdr[0], hdr[1], hdr[2] = (MAGIC_U32, VERSION_U32, len(toks)) if self.wide else \
            (MAGIC_U16, VERSION_U16, len(toks))
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<256i", *hdr))
            arr = array.array("I" if self.wide else "H", toks)
            if sys.byteorder != "little":
                arr.byteswap()
            fh.write(arr.tobytes())
        os.replace(tmp, path)
        self.written.append(os.path.basename(path))
        self.index += 1

    def close(self):
        if self.buf:
            self.flush(self.buf)
            self.buf = []


class Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, total):
        self.total, self.on, self.last, self.t0 = max(total, 1), sys.stderr.isatty(), 0.0, time.time()

    def show(self, done, docs, tokens, force=False):
        if not self.on:
            return
        now = time.time()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(30 * frac)
        sys.stderr.write("\rprepare [%-30s] %5.1f%% %.1f/%.1f MB | %d docs | %d tokens | %.0fs"
                         % (bar, 100 * frac, done / 1e6, self.total / 1e6, docs, tokens, now - self.t0))
        sys.stderr.flush()

    def end(self):
        if self.on:
            sys.stderr.write("\n")


def is_val(text, seed, every):
    if every <= 0:
        return False
    h = hashlib.blake2b(struct.pack("<q", seed) + text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little") % every == 0


def cmd_prepare(args):
    if args.shard_size < 1 or args.shard_size > SHARD_MAX:
        raise BadInput("--shard-size %d: out of range [1, %d] (the header counts tokens in an int32)"
                       % (args.shard_size, SHARD_MAX))
    if args.val_every < 0:
        raise BadInput("--val-every %d: must be >= 0 (0 = no val split)" % args.val_every)
    if args.batch_docs < 1:
        raise BadInput("--batch-docs must be >= 1")
    for path in args.inputs:  # bad input (exit 2) before a missing Python package (exit 1)
        if not os.path.exists(path):
            raise BadInput("input '%s': no such file or directory" % path)
    tok = load_tokenizer(args.tokenizer)
    if tok.vocab_size > 2**32:
        raise BadInput("tokenizer '%s': vocabulary of %d ids is over 2^32, more than uint32 shards hold"
                       % (tok.path, tok.vocab_size))
    if tok.vocab_size < 1:
        raise BadInput("tokenizer '%s': empty vocabulary" % tok.path)
    extra = []
    for opt, tokname in (("--bos-token", args.bos_token), ("--eos-token", args.eos_token)):
        if tokname is None:
            extra.append(None)
            continue
        i = tok.token_id(tokname)
        if i is None:
            raise BadInput("%s '%s': not a token of %s" % (opt, tokname, tok.path))
        extra.append(i)
    bos_extra, eos_extra = extra
    inputs = list_inputs(args.inputs, args.format)
    name = args.name or os.path.basename(os.path.normpath(args.output)) or "data"
    if "/" in name or not name:
        raise BadInput("--name '%s': must be a file name prefix" % name)
    created = not os.path.isdir(args.output)  # removed again if this run fails
    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError as e:
        raise BadInput("--output '%s': cannot create the directory: %s" % (args.output, e.strerror))
    if not os.access(args.output, os.W_OK):
        raise BadInput("--output '%s': directory not writable" % args.output)
    old = [n for n in os.listdir(args.output)
           if n.startswith(name + "_train_") or n.startswith(name + "_val_")]
    if old:
        raise BadInput("--output '%s' already holds %s shards (%s ...): remove them or choose another --name"
                       % (args.output, name, sorted(old)[0]))
    writers = {}
    try:
        wide = tok.vocab_size > 65536
        writers["train"] = ShardWriter(args.output, name, "train", args.shard_size, wide)
        if args.val_every > 0:
            writers["val"] = ShardWriter(args.output, name, "val", args.shard_size, wide)
        ndocs = {"train": 0, "val": 0}
        skipped = 0
        total = sum(os.path.getsize(f) for f, _ in inputs)
        prog = Progress(total)
        base = 0
        pending = []

        def run(batch):
            for (split, _), ids in zip(batch, tok.encode([t for _, t in batch])):
                if bos_extra is not None and (not ids or ids[0] != bos_extra):
                    ids = [bos_extra] + ids
                if eos_extra is not None and (not ids or ids[-1] != eos_extra):
                    ids = ids + [eos_extra]
                bad = [i for i in ids if i < 0 or i >= tok.vocab_size]
                if bad:
                    raise BadInput("tokenizer '%s' produced id %d outside its vocabulary of %d"
                                   % (tok.path, bad[0], tok.vocab_size))
                writers[split].add(ids)
                ndocs[split] += 1

        for path, kind in inputs:
            for text, done in documents(path, kind, args):
                if not text.strip():
                    skipped += 1
                    continue
                split = "val" if is_val(text, args.seed, args.val_every) else "train"
                pending.append((split, text))
                if len(pending) >= args.batch_docs:
                    run(pending)
                    pending = []
                prog.show(base + done, ndocs["train"] + ndocs["val"] + len(pending),
                          writers["train"].tokens + writers.get("val", writers["train"]).tokens)
            base += os.path.getsize(path)
        run(pending)
        prog.show(total, ndocs["train"] + ndocs["val"], sum(w.tokens for w in writers.values()), force=True)
        prog.end()
        if ndocs["train"] + ndocs["val"] == 0:
            raise BadInput("no documents: the inputs (%s) hold no non-empty document%s"
                           % (", ".join(f for f, _ in inputs), " (%d empty ones skipped)" % skipped if skipped else ""))
        if ndocs["train"] == 0:
            raise BadInput("every one of the %d documents fell into the val split: add documents or raise --val-every"
                           % ndocs["val"])
        if args.val_every > 0 and ndocs["val"] == 0:
            raise BadInput("no document of the %d fell into the val split (about 1 in --val-every %d, by hash): "
                           "add documents, lower --val-every, or give --val-every 0 for no val split"
                           % (ndocs["train"], args.val_every))
        for w in writers.values():
            w.close()
        summary = {
            "tokenizer": os.path.abspath(tok.path), "tokenizer_kind": tok.kind, "vocab_size": tok.vocab_size,
            "token_bytes": 4 if wide else 2, "inputs": [os.path.abspath(f) for f, _ in inputs],
            "seed": args.seed, "val_every": args.val_every, "shard_size": args.shard_size,
            "documents": ndocs, "empty_documents_skipped": skipped,
            "tokens": {s: w.tokens for s, w in writers.items()}, "shards": {s: w.written for s, w in writers.items()},
        }
        with open(os.path.join(args.output, name + "_prepare.json.tmp"), "w") as fh:
            json.dump(summary, fh, indent=1)
            fh.write("\n")
        os.replace(os.path.join(args.output, name + "_prepare.json.tmp"), os.path.join(args.output, name + "_prepare.json"))
    except BaseException:  # bad input found while writing, an I/O error, ^C: remove what this run wrote
        for w in writers.values():
            for f in w.written + ["%s_%s_%06d.bin.tmp" % (name, w.split, w.index)]:
                try:
                    os.remove(os.path.join(args.output, f))
                except OSError:
                    pass
        for f in (name + "_prepare.json.tmp",):
            try:
                os.remove(os.path.join(args.output, f))
            except OSError:
                pass
        if created:
            try:
                os.rmdir(args.output)  # only when empty: nothing of anyone else's goes
            except OSError:
                pass
        raise
    for s, w in writers.items():
        print("prepare: %s: %d documents, %d tokens in %d shard(s) %s_%s_*.bin (%s tokens)"
              % (s, ndocs[s], w.tokens, len(w.written), name, s, "uint32" if wide else "uint16"))
    print("prepare: wrote %s (dataset_path=%s)" % (os.path.join(args.output, name + "_prepare.json"), args.output))
    return 0


def cmd_encode(args):
    """Print the ids of --text as `sample` starts from it: the tokenizer's leading special
    tokens (BOS) and the text, without trailing special tokens (an EOS would end it)."""
    tok = load_tokenizer(args.tokenizer)
    ids = tok.encode([args.text])[0]
    while ids and len(ids) > 1 and tok.is_special(ids[-1]):
        ids.pop()
    print(" ".join(str(i) for i in ids))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="meshtrain prepare",
                                 description="Text, JSONL or Parquet into llm.c train/val token shards with a Hugging "
                                 "Face tokenizer.json or a SentencePiece .model (scripts/prepare_data.py).")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("prepare", help="write shards", prog="meshtrain prepare",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n", 3)[3])  # from "TOK:": the usage above names this file
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or directories")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, a directory holding it, or a SentencePiece .model")
    p.add_argument("--output", required=True, help="output directory (dataset_path)")
    p.add_argument("--name", default=None, help="shard name prefix (default: the output directory's name)")
    p.add_argument("--format", choices=["auto", "text", "jsonl", "parquet"], default="auto",
                   help="input format (default auto: by file suffix)")
    p.add_argument("--field", default="text", help="JSONL key / Parquet column of the text (default text)")
    p.add_argument("--text-split", choices=["file", "paragraph", "line"], default="file",
                   help="documents of a text file: the whole file (default), blank-line paragraphs, or lines")
    p.add_argument("--val-every", type=int, default=20,
                   help="about 1 document in N goes to val, chosen by a seeded hash of its text (default 20; 0 = none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/val split (default 0)")
    p.add_argument("--shard-size", type=int, default=100_000_000, help="tokens per shard (default 10^8)")
    p.add_argument("--bos-token", default=None, help="prepend this token to each document unless it starts with it")
    p.add_argument("--eos-token", default=None, help="append this token to each document unless it ends with it")
    p.add_argument("--batch-docs", type=int, default=1000, help="documents encoded per batch (default 1000)")
    e = sub.add_parser("encode", help="print the ids of a text prompt", prog="prepare_data.py encode")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--text", required=True)
    # `meshtrain prepare ARGS` is `prepare_data.py prepare ARGS`; each subcommand parses its
    # own arguments, so an unknown option is reported with that subcommand's usage
    try:
        if argv and argv[0] in ("-h", "--help"):
            args = ap.parse_args(argv)
        elif argv and argv[0] == "encode":
            args = e.parse_args(argv[1:])
            args.cmd = "encode"
        else:
            args = p.parse_args(argv[1:] if argv and argv[0] == "prepare" else argv)
            args.cmd = "prepare"
    except SystemExit as e:
        sys.exit(2 if e.code else 0)
    global PROG
    if args.cmd == "encode":
        PROG = "meshtrain sample: encoding the prompt"
    try:
        return cmd_prepare(args) if args.cmd == "prepare" else cmd_encode(args)
    except BadInput as e:
        die(2, str(e))
    except OSError as e:
        die(1, "%s: %s" % (getattr(e, "filename", "") or "I/O", e.strerror or e))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
