/* train/metrics.h: per-step metrics, FLOP accounting and metrics.jsonl.
 *
 * metrics.jsonl (docs/resume.md) holds one JSON object per line:
 *   train step:  {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s",
 *                 "step_ms", "mfu"}
 *   evaluation:  "val_loss" and "val_tokens" added to the row of the step it follows;
 *                the evaluation before training is the row {"step": 0, "val_loss", ...}.
 * Each row is a cJSON object (train/json.h: keys in this order, `"key": value` layout).
 * Doubles are printed with %.17g, so a value reads back bitwise (resume checks compare
 * the text); a NaN or infinite value is null, since JSON has neither (mfu without a
 * peak, a val_loss over no tokens).
 * "mfu" is null when no peak FLOP/s is known for the backend: the CPU
 * backend prints null (a nominal CPU peak would make the number meaningless across
 * machines); the peak is the backend's capability (kernels/backend.h caps.peak_flops). */
#ifndef MT_TRAIN_METRICS_H
#define MT_TRAIN_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "models/config.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_step_metrics {
    int64_t step;         /* optimizer steps done (1-based after a step; 0 before training) */
    int has_train;        /* the train fields below are set */
    double loss;          /* token-mean cross-entropy of the step (nats) */
    double lr;            /* learning rate used by the update */
    double grad_norm;     /* global gradient norm before clipping */
    int64_t tokens;       /* labelled tokens in the step (all micro-batches) */
    double tokens_per_s;  /* tokens / step wall time */
    double step_ms;       /* step wall time, milliseconds */
    double mfu;           /* model FLOP utilisation in [0, 1], or NaN when unknown (null) */
    double eta_s;         /* estimated seconds to the end of the run (console only) */
    int has_eval;         /* the eval fields below are set */
    double val_loss;      /* token-mean validation loss */
    int64_t val_tokens;   /* labelled validation tokens */
    int64_t total_steps;  /* steps of the run (console only) */
} mt_step_metrics;

/* Model FLOPs of training per token, the one formula of the trainer's mfu and the
 * estimator's step model (train/estimate.h):
 *   6 (N - N_emb) + 6 V D + 12 L H Dh T
 * N = mt_model_num_parameters, N_emb = the embedding and lm_head tables (V D when
 * logits_via_embedding ties them, else 2 V D), V vocab_size, D emb_dim, L layers, H
 * query heads, Dh head_dim, T = seq tokens per sequence. Every weight matmul is 2
 * FLOPs per weight and token forward and 4 backward (PaLM appendix B, Chowdhery et al.
 * 2022, arXiv:2204.02311); the logits matmul h W^T is counted once, 6 V D, whether or
 * not its weight is the embedding's, and the embedding lookup not at all: MaxText's
 * src/MaxText/maxtext_utils.py calculate_tflops_training_per_device ("embedding_flops"
 * = 2 B T D V, times 3). Attention 12 L H Dh T: PaLM's, causal masking and sliding
 * windows not discounted (MaxText halves it for the causal mask since 2025). Norm
 * scales count as weights (6 per element: < 0.01% of N). gemma4 (decoder_block
 * gemma4) is counted as MaxText counts Gemma 4 small
 * (src/maxtext/utils/maxtext_utils.py calculate_gemma4_small_tflops_training_per_device,
 * divided by the batch's tokens): 3 x (attention + matmul weights), per layer l of head
 * dim Dh_l and MLP width F_l (the wide MLP on KV-sharing layers):
 *   attention: global layers 2 T H Dh_l (causal: half of 4 T H Dh_l), local layers
 *     4 (T w - w^2 / 2) / T H Dh_l, w = min(sliding_window_size, T) (causal and windowed);
 *   q and o projections 4 D H Dh_l; k and v projections 4 D Hkv Dh_l, only on layers
 *     that own their K/V (not the KV-sharing ones); MLP 6 D F_l (gate, up, down);
 *   per-layer inputs 2 D L P (the global projection) + L 4 D P (each layer's gate and
 *     projection), P = per_layer_input_dim; the logits matmul 2 D V;
 * norms, the embedding lookups and the per-layer embedding table not counted.
 * Units: FLOPs per token. */
double mt_flops_per_token(const mt_model_config *c, int64_t seq);

/* mfu = flops_per_token * tokens_per_s / peak, or NaN when peak <= 0. */
double mt_mfu(double flops_per_token, double tokens_per_s, double peak_flops);

/* Format one metrics.jsonl line (without the newline) into buf.
 * Returns the length, or -1 if it did not fit in n bytes or memory ran out. */
int mt_metrics_format_json(const mt_step_metrics *m, char *buf, size_t n);

typedef struct mt_metrics_writer mt_metrics_writer;

/* Open `path` for writing (truncate) or appending (append != 0). Errors: MT_ERR_IO
 * naming the path, MT_ERR_OOM. */
mt_status mt_metrics_open(mt_metrics_writer **out, const char *path, int append);

/* Check metrics file `path` before a resume rewrites it: every line ends in a newline
 * and is a row (a JSON object in the layout above, starting {"step": N, N >= 0), but the
 * last, which may lack its newline: a row cut short by a crash while it was written
 * (the writer appends line and newline at once). *torn_line = that line's number (1-based)
 * or 0. A missing file is fine (0). Reads only. Errors: MT_ERR_INVALID naming the file,
 * the line and what is wrong with it (an edit, another program's bytes: which step it
 * held cannot be told, so it is neither kept nor dropped silently), MT_ERR_IO (cannot
 * read). */
mt_status mt_metrics_check(const char *path, int64_t *torn_line);

/* Open `path` of a run resumed at step `step` for appending: an existing file is first
 * checked (mt_metrics_check: a corrupt row fails with the file unchanged), then
 * rewritten atomically (path.tmp, fsync, rename) keeping only its rows with N <= step,
 * so rows of steps the resumed run repeats are not duplicated and a row cut short by a
 * crash does not have the next row glued to it; that torn last line is dropped with a
 * warning (MT_LOG_W) naming the file and the line. A missing file is created. Errors:
 * those of mt_metrics_check, MT_ERR_IO (cannot open), MT_ERR_RUNTIME (a write of the
 * rewrite fails: disk full), MT_ERR_OOM. */
mt_status mt_metrics_open_resume(mt_metrics_writer **out, const char *path, int64_t step);

/* Append one line and flush it. Errors: MT_ERR_RUNTIME (the write failed: disk full,
 * I/O error) naming the file. */
mt_status mt_metrics_write(mt_metrics_writer *w, const mt_step_metrics *m);

/* Close; NULL is fine. */
void mt_metrics_close(mt_metrics_writer *w);

#ifdef __cplusplus
}
#endif
#endif
