/* train/tokenizer.h: decoding token ids to text with a model's own tokenizer, for
 * `meshtrain sample` (encoding text is scripts/prepare_data.py's job: the Hugging Face
 * `tokenizers` library or `sentencepiece`).
 *
 * Two kinds of file:
 *  - a Hugging Face tokenizer.json (or a directory holding one): the id -> token table
 *    from model.vocab (an object token -> id for BPE / WordPiece / WordLevel, an array
 *    of [piece, score] for Unigram) and added_tokens, then the file's decoder, as the
 *    `tokenizers` library (huggingface/tokenizers, tokenizers/src/decoders/ (one .rs per decoder)) runs
 *    it for Tokenizer.decode(ids, skip_special_tokens=True): added tokens marked
 *    special are dropped, unknown ids are skipped, and the token strings go through
 *    the decoder chain, then are concatenated (no decoder: joined with ' '). Decoders:
 *    ByteLevel (GPT-2's bytes_to_unicode mapping reversed, as in Llama 3; the bytes
 *    decoded as UTF-8 with U+FFFD for each maximal invalid subpart), ByteFallback
 *    (<0xNN> pieces; a run of them that is not valid UTF-8 gives one U+FFFD per byte),
 *    Fuse, Replace (string pattern), Strip, Metaspace (U+2581 as ' ', as in
 *    Gemma / SentencePiece-converted files), WordPiece (## continuations, cleanup),
 *    BPEDecoder (end-of-word suffix) and Sequence of these. Other decoders (CTC, a
 *    Replace with a regex) are MT_ERR_UNSUPPORTED at load.
 *  - a SentencePiece .vocab (train/sample.h mt_vocab: piece<TAB>score lines), decoded
 *    as sentencepiece's DecodeIds does: U+2581 as ' ', the dummy prefix dropped, <s>
 *    </s> <pad> skipped, <unk> as " \u2047 ", <0xNN> byte pieces (byte_fallback) as
 *    bytes with U+FFFD for each byte that starts no valid UTF-8 sequence.
 *  A decoded text ends at its first NUL byte (a <0x00> piece): it is a C string.
 *
 * BOS (the first token of a generation without a prompt): tokenizer.json's
 * post-processor (TemplateProcessing's leading special token, Bert/Roberta's cls, in
 * a Sequence too), else an added special token named <s>, <bos>, <|begin_of_text|> or
 * <|startoftext|>; .vocab: "<s>". Stop tokens: every added special token
 * (tokenizer.json), "</s>" (.vocab). */
#ifndef MT_TRAIN_TOKENIZER_H
#define MT_TRAIN_TOKENIZER_H

#include <stdint.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tokenizer mt_tokenizer;

/* Load path: a tokenizer.json, a directory holding tokenizer.json, or a .vocab file.
 * Errors: MT_ERR_IO (cannot read, naming the path), MT_ERR_FORMAT (not JSON, no
 * model.vocab, a malformed entry: named), MT_ERR_UNSUPPORTED (a decoder type this
 * module does not run, named), MT_ERR_OOM. */
mt_status mt_tokenizer_load(mt_tokenizer **out, const char *path);
void mt_tokenizer_free(mt_tokenizer *t);

/* Number of ids (1 + the largest id); the BOS id or -1; whether id ends a generation. */
int64_t mt_tokenizer_size(const mt_tokenizer *t);
int64_t mt_tokenizer_bos(const mt_tokenizer *t);
int mt_tokenizer_is_stop(const mt_tokenizer *t, int64_t id);
/* "tokenizer.json" or "sentencepiece"; the file the prompt encoder takes (the
 * tokenizer.json itself; for a .vocab its sibling .model, which may not exist). */
const char *mt_tokenizer_kind(const mt_tokenizer *t);
const char *mt_tokenizer_encoder_path(const mt_tokenizer *t);

/* Decode ids[n] to a NUL-terminated UTF-8 string the caller frees (header comment).
 * Errors: MT_ERR_OOM. */
mt_status mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, int64_t n, char **text);

#ifdef __cplusplus
}
#endif
#endif
