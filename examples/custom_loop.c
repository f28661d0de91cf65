/* examples/custom_loop.c: a research training loop of one's own on top of meshtrain.
 *
 * What a researcher writes when the library's step is not the experiment:
 *   - the loss is their own, on the final hidden states h of ONE forward:
 *       next-token cross-entropy
 *       + lambda * cross-entropy of the token two ahead (multi-token prediction with a
 *         shared head; Gloeckle et al., "Better & Faster Large Language Models via
 *         Multi-token Prediction", 2024)
 *       + beta * slowness, 0.5 * mean over neighbouring positions of ||h_t - h_{t-1}||^2
 *         (a term on the hidden states themselves, which no built-in loss expresses).
 *     The two cross-entropies come from the vocab-tiled loss, which returns their
 *     d/dh and adds their unembedding gradient; the slowness gradient is computed
 *     here; the sum d(loss)/dh goes back through the decoder with
 *     mt_session_backward_hidden;
 *   - the optimizer is their own: SGD with Nesterov momentum and global-norm
 *     clipping, reading every gradient and writing every parameter by its Hugging
 *     Face name;
 *   - evaluation is one forward to the hidden states, then the vocab-tiled loss
 *     called twice on those hidden states (both heads from one forward).
 *
 * Usage: custom_loop CONFIG.yml [key=value ...]   (the config must set dataset_path)
 * Prints one line per step and a summary; exit 0 when the training loss fell, 1 when
 * it did not, 2 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <meshtrain.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        mt_status st_ = (call);                                                      \
        if (st_ != MT_OK) {                                                          \
            fprintf(stderr, "custom_loop: %s: %s\n", #call, mt_last_error());        \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

typedef struct tensor {
    mt_tensor_info info;
    float *w, *g, *mom; /* host copies: parameter, gradient, momentum */
} tensor;

/* labels2[r] = the token two ahead of row r in the same sequence (= labels[r + 1]),
 * -1 where it falls outside the sequence. Returns the labelled rows. */
static int64_t shift_labels(const int32_t *labels, int32_t *labels2, int64_t B, int64_t T) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int64_t r = b * T + t;
            labels2[r] = t + 1 < T ? labels[r + 1] : -1;
            n += labels2[r] >= 0;
        }
    return n;
}

static int64_t count_labelled(const int32_t *labels, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += labels[i] >= 0;
    return c;
}

/* Slowness of h[B*T, D]: 0.5 * mean over (b, t >= 1) of ||h_t - h_{t-1}||^2; adds
 * beta * its gradient into dh. Returns the (unweighted) mean. */
static double slowness(const float *h, float *dh, int64_t B, int64_t T, int64_t D, double beta) {
    const double pairs = (double)(B * (T - 1));
    double sum = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 1; t < T; t++) {
            const float *cur = h + (b * T + t) * D, *prev = cur - D;
            float *dcur = dh + (b * T + t) * D, *dprev = dcur - D;
            for (int64_t d = 0; d < D; d++) {
                const double diff = (double)cur[d] - prev[d];
                sum += 0.5 * diff * diff;
                dcur[d] += (float)(beta * diff / pairs);
                dprev[d] -= (float)(beta * diff / pairs);
            }
        }
    return sum / pairs;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: custom_loop CONFIG.yml [key=value ...]\n");
        return 2;
    }
    const double lambda = 0.3, beta = 0.01, lr = 0.05, momentum = 0.9, clip = 1.0;

    mt_session *s = NULL;
    CHECK(mt_session_create(&s, argv[1], argc - 2, (const char *const *)argv + 2));
    mt_session_info in;
    CHECK(mt_session_get_info(s, &in));
    char buf[64];
    CHECK(mt_session_config_get(s, "steps", buf, sizeof buf));
    const int64_t steps = strtoll(buf, NULL, 10);
    printf("model: %lld layers, d_model %lld, vocab %lld, %lld parameters; batch %lld x %lld\n",
           (long long)in.num_layers, (long long)in.emb_dim, (long long)in.vocab_size, (long long)in.num_params,
           (long long)in.batch, (long long)in.seq);

    /* the optimizer's state: one host copy per named tensor */
    tensor *ts = calloc((size_t)in.num_tensors, sizeof *ts);
    for (int64_t i = 0; i < in.num_tensors; i++) {
        CHECK(mt_session_param_info(s, i, &ts[i].info));
        size_t bytes = (size_t)ts[i].info.numel * sizeof(float);
        ts[i].w = malloc(bytes);
        ts[i].g = malloc(bytes);
        ts[i].mom = calloc(1, bytes);
        if (!ts[i].w || !ts[i].g || !ts[i].mom) return 2;
        CHECK(mt_session_get_param(s, ts[i].info.name, ts[i].w, ts[i].info.numel));
    }

    const int64_t N = in.rows;
    int32_t *tok = malloc((size_t)N * sizeof(int32_t)), *lab = malloc((size_t)N * sizeof(int32_t));
    int32_t *lab2 = malloc((size_t)N * sizeof(int32_t));
    int32_t *etok = malloc((size_t)N * sizeof(int32_t)), *elab = malloc((size_t)N * sizeof(int32_t));
    int32_t *elab2 = malloc((size_t)N * sizeof(int32_t));
    const size_t hbytes = (size_t)(N * in.emb_dim) * sizeof(float);
    float *hidden = malloc(hbytes), *dh = malloc(hbytes), *dh2 = malloc(hbytes);
    if (!tok || !lab || !lab2 || !etok || !elab || !elab2 || !hidden || !dh || !dh2) return 2;

    /* a fixed batch for evaluation: the first one of the train split */
    CHECK(mt_session_next_batch(s, etok, elab));
    shift_labels(elab, elab2, in.batch, in.seq);

    double first_loss = NAN, loss = NAN;
    for (int64_t step = 1; step <= steps; step++) {
        CHECK(mt_session_next_batch(s, tok, lab));
        const int64_t n1 = count_labelled(lab, N), n2 = shift_labels(lab, lab2, in.batch, in.seq);
        /* loss = mean CE(next) + lambda * mean CE(two ahead) + beta * slowness(h) */
        double s1 = 0.0, s2 = 0.0;
        int64_t c1 = 0, c2 = 0;
        CHECK(mt_session_zero_grads(s));
        CHECK(mt_session_forward(s, tok, hidden));
        CHECK(mt_session_tiled_loss(s, hidden, lab, N, (float)(1.0 / (double)n1), dh, 1, &s1, &c1));
        CHECK(mt_session_tiled_loss(s, hidden, lab2, N, (float)(lambda / (double)n2), dh2, 1, &s2, &c2));
        for (int64_t i = 0; i < N * in.emb_dim; i++) dh[i] += dh2[i];
        const double slow = slowness(hidden, dh, in.batch, in.seq, in.emb_dim, beta);
        CHECK(mt_session_backward_hidden(s, dh)); /* d(loss)/dh through the decoder */
        loss = s1 / (double)c1 + lambda * s2 / (double)c2 + beta * slow;
        if (step == 1) first_loss = loss;

        /* own optimizer: global-norm clip, then SGD with Nesterov momentum */
        double sq = 0.0;
        for (int64_t i = 0; i < in.num_tensors; i++) {
            CHECK(mt_session_get_grad(s, ts[i].info.name, ts[i].g, ts[i].info.numel));
            for (int64_t j = 0; j < ts[i].info.numel; j++) sq += (double)ts[i].g[j] * ts[i].g[j];
        }
        const double norm = sqrt(sq), scale = norm > clip ? clip / norm : 1.0;
        for (int64_t i = 0; i < in.num_tensors; i++) {
            tensor *t = &ts[i];
            for (int64_t j = 0; j < t->info.numel; j++) {
                const double g = scale * t->g[j];
                t->mom[j] = (float)(momentum * t->mom[j] + g);
                t->w[j] -= (float)(lr * (g + momentum * t->mom[j]));
            }
            CHECK(mt_session_set_param(s, t->info.name, t->w, t->info.numel));
        }
        printf("step %3lld  loss %.4f  (next %.4f, two-ahead %.4f, slowness %.4f)  grad_norm %.3f\n",
               (long long)step, loss, s1 / (double)c1, s2 / (double)c2, slow, norm);
    }

    /* evaluation: one forward, both heads' losses from the same hidden states */
    double e1 = 0.0, e2 = 0.0;
    int64_t k1 = 0, k2 = 0;
    CHECK(mt_session_forward(s, etok, hidden));
    CHECK(mt_session_tiled_loss(s, hidden, elab, N, 1.0f, NULL, 0, &e1, &k1));
    CHECK(mt_session_tiled_loss(s, hidden, elab2, N, 1.0f, NULL, 0, &e2, &k2));
    printf("eval batch: next-token loss %.4f over %lld tokens, two-ahead loss %.4f over %lld tokens\n",
           e1 / (double)k1, (long long)k1, e2 / (double)k2, (long long)k2);
    printf("training loss %.4f -> %.4f\n", first_loss, loss);
    const int fell = loss < first_loss;

    for (int64_t i = 0; i < in.num_tensors; i++) {
        free(ts[i].w);
        free(ts[i].g);
        free(ts[i].mom);
    }
    free(ts);
    free(tok);
    free(lab);
    free(lab2);
    free(etok);
    free(elab);
    free(elab2);
    free(hidden);
    free(dh);
    free(dh2);
    mt_session_free(s);
    return fell ? 0 : 1;
}
