/* train/sample.h: text generation from a checkpoint (`meshtrain sample`).
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
#include "train/vocab.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* A model's vocabulary may exceed its tokenizer's by padding only: `sample` refuses a
 * tokenizer of n ids for a model of vocab_size > n rounded up to a multiple of this
 * (the padding of Megatron-LM's make_vocab_size_divisible_by 128 times tensor
 * parallelism 8; the published pairs are within it: Llama 2 32000/32000, Phi-3
 * 32011/32064, Qwen2 151665/151936, GPT-2 in llm.c 50257/50304). A larger gap means
 * another model's tokenizer: its ids would decode to other text. */
#define MT_SAMPLE_VOCAB_PAD 1024LL

/* Parse the token ids of key `key` from s: decimal integers separated by commas and/or
 * white space ("2,651,3", "2 651 3"; a YAML list "[2, 651, 3]" too), each in [0, 2^31).
 * *ids (n of them, at least one) is the caller's to free. Errors: MT_ERR_INVALID naming
 * the key and the word (not an integer, out of range, no ids) or the value (an empty
 * entry: "1,,2", ",1", "1,"), MT_ERR_OOM. */
mt_status mt_sample_parse_ids(const char *key, const char *s, int32_t **ids, int64_t *n);

/* Load checkpoint_dir (config.json + model.safetensors) and cfg->tokenizer_path,
 * then generate (header comment) after prompt[nprompt] (NULL / 0: the tokenizer's
 * BOS) with cfg->sample_length, temperature, top_k, seed on cfg->backend. Errors:
 * MT_ERR_IO / MT_ERR_FORMAT (checkpoint or tokenizer files), MT_ERR_INVALID (no prompt
 * and a tokenizer without BOS; a prompt id outside the model's vocabulary, naming
 * prompt_ids; top_k above the model's vocab_size, naming top_k; a tokenizer of fewer ids than vocab_size beyond MT_SAMPLE_VOCAB_PAD
 * padding, naming tokenizer_path; sample_length outside [1, MT_SAMPLE_LENGTH_MAX] or, with the prompt,
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
