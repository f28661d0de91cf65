/* train/sample.h: SentencePiece vocabulary decoding and text generation from a
 * checkpoint (`meshtrain sample`).
 *
 * Vocabulary: a SentencePiece .vocab file, one "piece<TAB>score" line per id (id =
 * 0-based line number), as written by spm_train. Decoding concatenates pieces, maps
 * U+2581 (LOWER ONE EIGHTH BLOCK, SentencePiece's space marker) to ' ', drops the
 * single leading space SentencePiece's dummy prefix adds, and skips the control
 * pieces <s>, </s>, <unk> and <pad>.
 *
 * `sample` decodes with train/tokenizer.h (a Hugging Face tokenizer.json or this .vocab).
 *
 * Generation: start from the prompt (token ids; none = the tokenizer's BOS, for a
 * .vocab the id whose piece is "<s>"); at each position feed the
 * last token to a decode model with a KV cache of sample_length + 1 positions
 * (mt_model_decode_step, models/model.h: only the new row runs through the layers,
 * attending over the cached keys and values; its logits equal that row of
 * mt_model_logits on the whole prefix up to fp32 summation order), then pick the next
 * token: argmax when temperature == 0, else sample from
 * softmax(logits / temperature) restricted to the top_k largest logits (top_k 0 = all)
 * by inverse CDF with a uniform from Philox(seed, stream "SAMP", position). Stops after
 * sample_length tokens after the prompt or at a stop token (mt_tokenizer_is_stop: EOS
 * "</s>" of a .vocab, any added special token of a tokenizer.json). Ids at or above the
 * tokenizer's size are never sampled. */
#ifndef MT_TRAIN_SAMPLE_H
#define MT_TRAIN_SAMPLE_H

#include <stdint.h>
#include "runtime/status.h"
#include "train/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_vocab mt_vocab;

/* Load a .vocab file. Errors: MT_ERR_IO (cannot read, naming the path),
 * MT_ERR_FORMAT (a line without a TAB, naming the line; an empty file), MT_ERR_OOM. */
mt_status mt_vocab_load(mt_vocab **out, const char *path);
void mt_vocab_free(mt_vocab *v);

/* Number of pieces; piece of id (NULL when out of range); id of a piece or -1. */
int64_t mt_vocab_size(const mt_vocab *v);
const char *mt_vocab_piece(const mt_vocab *v, int64_t id);
int64_t mt_vocab_find(const mt_vocab *v, const char *piece);

/* Decode ids[n] to a NUL-terminated UTF-8 string the caller frees (see the header
 * comment; ids outside the vocabulary are skipped). Errors: MT_ERR_OOM. */
mt_status mt_vocab_decode(const mt_vocab *v, const int32_t *ids, int64_t n, char **text);

/* Pick the next token from logits[V] (host): argmax when temperature == 0, else a
 * top_k-restricted softmax sample with uniform u in [0, 1). Only ids < V are
 * considered. Ties go to the lower id. Pure function of its arguments. */
int64_t mt_sample_pick(const float *logits, int64_t V, double temperature, int64_t top_k, double u);

typedef struct mt_sample_result {
    int32_t *ids;  /* the prompt (or BOS), then the generated ids (n in all) */
    int64_t n;
    char *text;    /* decoded text of ids */
} mt_sample_result;

/* Largest sample_length: the decode model's sample_length + 1 positions stay below
 * 2^31 (mt_model_create's sequence limit). */
#define MT_SAMPLE_LENGTH_MAX 2147483646LL

/* Parse the token ids of key `key` from s: decimal integers separated by commas and/or
 * white space ("2,651,3", "2 651 3"), each in [0, 2^31). *ids (n of them, at least
 * one) is the caller's to free. Errors: MT_ERR_INVALID naming the key and the word
 * (not an integer, out of range, no ids), MT_ERR_OOM. */
mt_status mt_sample_parse_ids(const char *key, const char *s, int32_t **ids, int64_t *n);

/* Load checkpoint_dir (config.json + model.safetensors) and cfg->tokenizer_path,
 * then generate (header comment) after prompt[nprompt] (NULL / 0: the tokenizer's
 * BOS) with cfg->sample_length, temperature, top_k, seed on cfg->backend. Errors:
 * MT_ERR_IO / MT_ERR_FORMAT (checkpoint or tokenizer files), MT_ERR_INVALID (no prompt
 * and a tokenizer without BOS; a prompt id outside the model's vocabulary, naming
 * prompt_ids; sample_length outside [1, MT_SAMPLE_LENGTH_MAX] or, with the prompt,
 * past the limit, naming the key), MT_ERR_UNSUPPORTED (backend, a tokenizer.json
 * decoder), MT_ERR_OOM (the decode model's memory, whose KV cache grows with
 * sample_length: the message names the key and the bytes). */
mt_status mt_sample_generate(const mt_train_config *cfg, const char *checkpoint_dir, const int32_t *prompt,
                             int64_t nprompt, mt_sample_result *out);
void mt_sample_result_free(mt_sample_result *r);

#ifdef __cplusplus
}
#endif
#endif
