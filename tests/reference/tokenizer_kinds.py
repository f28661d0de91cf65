#!/usr/bin/env python3
"""tests/reference/tokenizer_kinds.py: small tokenizers of each kind that `meshtrain
sample` decodes, made here with the Hugging Face `tokenizers` library (and Debian's
`sentencepiece`) from a few sentences, and the check of train/tokenizer.c's decoding
against those libraries' own decode. Used by tests/test_tokenizer_decode.sh and
tests/test_prepare_e2e.sh; runs in .venv-hf (scripts/setup-hf-venv.sh).

  tokenizer_kinds.py make DIR
      DIR/bytelevel.json   byte-level BPE as in Llama 3 (GPT-2's bytes_to_unicode,
                           <|begin_of_text|> added by a TemplateProcessing post-processor)
      DIR/gemma.json       SentencePiece-style BPE as in Gemma / Llama 2: U+2581 for
                           spaces, <0xNN> byte fallback, decoder Replace + ByteFallback +
                           Fuse + Strip
      DIR/wordpiece.json   WordPiece as in BERT (## continuations, cleanup, [CLS] ... [SEP])
      DIR/unigram.json     Unigram with the Metaspace decoder (SentencePiece converted, T5)
      DIR/spm.model, DIR/spm.vocab  a SentencePiece BPE with byte_fallback (spm_train's
                           files; decoded by the sentencepiece library), when importable
  tokenizer_kinds.py tiny FILE VOCAB
      a byte-level-free BPE tokenizer.json of exactly VOCAB ids (<pad> 0, </s> 1, <s> 2,
      <unk> 3; Metaspace; <unused_N> added up to VOCAB), "<s> $A </s>" per document, for
      the end-to-end test's model
  tokenizer_kinds.py check DIR TOOL
      for every tokenizer in DIR: random id lists and encoded sentences, decoded by
      TOOL (tests/tools/tokenizer_decode) and by the library (decode with
      skip_special_tokens=True; sentencepiece's DecodeIds), compared byte for byte;
      exit 1 naming the first difference of each kind.
"""
import json
import os
import random
import subprocess
import sys

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A stitch in time saves nine, doesn't it?",
    "Café au lait costs 3,50 € in Zürich; naïve résumé.",
    "日本語のテキストも少し。 中文也有一点。",
    "Emoji: 🙂🚀 and tabs\tand\nnewlines   with  spaces.",
    "In the beginning God created the heaven and the earth.",
    "hello world hello there world of words",
    "I'm sure you're right: they've said we'd go.",
]


def corpus():
    rng = random.Random(7)
    out = []
    for _ in range(40):
        out.append(" ".join(rng.sample(SENTENCES, 3)))
    return out + SENTENCES


def make(d):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    os.makedirs(d, exist_ok=True)
    text = corpus()
    # byte-level BPE (Llama 3)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])
    t.add_tokens(["<not special>"])
    t.save(os.path.join(d, "bytelevel.json"))
    # SentencePiece-style BPE with byte fallback (Gemma, Llama 2 as converted by transformers)
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    base.pre_tokenizer = pre_tokenizers.Split("\u2581", "merged_with_next")
    base.train_from_iterator([s for s in text if s.isascii()], trainers.BpeTrainer(vocab_size=200, special_tokens=[]))
    trained = json.loads(base.to_str())["model"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for tok in sorted(trained["vocab"], key=trained["vocab"].get):
        if tok not in vocab:
            vocab[tok] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    g = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    g.normalizer = base.normalizer
    g.pre_tokenizer = base.pre_tokenizer
    g.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    g.add_special_tokens(specials)
    g.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    g.save(os.path.join(d, "gemma.json"))
    # WordPiece (BERT)
    w = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    w.normalizer = normalizers.BertNormalizer(lowercase=True)
    w.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    w.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    w.train_from_iterator(text, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    w.post_processor = processors.BertProcessing(("[SEP]", w.token_to_id("[SEP]")), ("[CLS]", w.token_to_id("[CLS]")))
    w.save(os.path.join(d, "wordpiece.json"))
    # Unigram + Metaspace (SentencePiece converted)
    u = Tokenizer(models.Unigram())
    u.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    u.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    u.train_from_iterator(text, trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"],
                                                        unk_token="<unk>"))
    u.save(os.path.join(d, "unigram.json"))
    try:
        import sentencepiece as spm
    except ImportError:
        return 0
    with open(os.path.join(d, "spm.txt"), "w") as fh:
        fh.write("\n".join(text) + "\n")
    spm.SentencePieceTrainer.train(input=os.path.join(d, "spm.txt"), model_prefix=os.path.join(d, "spm"),
                                   vocab_size=350, model_type="bpe", byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False,
                                   bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    return 0


def tiny(path, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    text = ["the cat sat on the mat", "a dog ate the hat", "the man and the cat", "to be or not to be"] * 4
    t.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<s>", "<unk>"]))
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 1)])
    n = t.get_vocab_size(with_added_tokens=True)
    if n < vocab_size:  # Gemma-like <unused_N> fillers up to the model's vocabulary
        t.add_tokens(["<unused_%d>" % i for i in range(vocab_size - n)])
        n = t.get_vocab_size(with_added_tokens=True)
    if n != vocab_size:
        sys.exit("tiny: %d ids, not %d (too few merges to learn from the text)" % (n, vocab_size))
    t.save(path)
    return 0


def check(d, tool):
    failures = 0
    rng = random.Random(11)
    kinds = [n for n in ("bytelevel.json", "gemma.json", "wordpiece.json", "unigram.json", "spm.vocab")
             if os.path.exists(os.path.join(d, n))]
    for name in kinds:
        path = os.path.join(d, name)
        if name.endswith(".json"):
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(path)
            size = tok.get_vocab_size(with_added_tokens=True)
            encode = lambda s: tok.encode(s).ids  # noqa: E731
            ref = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
            nul = tok.token_to_id("<0x00>")
        else:
            import sentencepiece as spm
            sp = spm.SentencePieceProcessor(model_file=path[:-len(".vocab")] + ".model")
            size = sp.GetPieceSize()
            encode = lambda s: [sp.bos_id()] + sp.EncodeAsIds(s)  # noqa: E731
            ref = lambda ids: sp.DecodeIds(ids)  # noqa: E731
            nul = sp.PieceToId("<0x00>")
        cases = [encode(s) for s in SENTENCES]
        for _ in range(300):
            ids = [rng.randrange(size) for _ in range(rng.randrange(0, 16))]
            cases.append([i for i in ids if i != nul])  # a NUL byte ends a C string: left out
        for _ in range(100):  # runs of byte tokens and pieces, mixed
            ids = [rng.randrange(min(size, 300)) for _ in range(rng.randrange(1, 12))]
            cases.append([i for i in ids if i != nul])
        cases = [c for c in cases if "\x00" not in ref(c)]  # a NUL byte ends a C string: left out
        inp = "".join(" ".join(map(str, c)) + "\n" for c in cases)
        out = subprocess.run([tool, path], input=inp, capture_output=True, text=True)
        lines = out.stdout.splitlines()
        if out.returncode != 0 or not lines or lines[0].startswith("ERROR"):
            print("FAIL: %s: %s did not load it: %s %s" % (name, tool, out.stdout[:300], out.stderr[:300]))
            failures += 1
            continue
        bad = 0
        for ids, got in zip(cases, lines[1:]):
            want = ref(ids).encode("utf-8").hex()
            if got != want:
                if bad == 0:
                    print("FAIL: %s: ids %s: meshtrain decodes %r, the library %r" % (
                        name, ids, bytes.fromhex(got).decode("utf-8", "replace") if not got.startswith("ERROR")
                        else got, ref(ids)))
                bad += 1
        if len(lines) - 1 != len(cases):
            print("FAIL: %s: %d outputs for %d inputs" % (name, len(lines) - 1, len(cases)))
            bad += 1
        if bad:
            failures += 1
            print("FAIL: %s: %d of %d id lists decode differently" % (name, bad, len(cases)))
        else:
            print("ok: %s (%s): %d id lists decode as the library does; %s" % (name, size, len(cases), lines[0]))
    return 1 if failures else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "make":
        return make(argv[2])
    if len(argv) == 4 and argv[1] == "tiny":
        return tiny(argv[2], int(argv[3]))
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
