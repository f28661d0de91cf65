/* examples/probe_activations.c: watch one layer's activations while training.
 *
 * The library's own step trains the model (mt_session_step). Every PROBE_EVERY steps
 * the probe runs a forward on a fixed probe batch and reads two tensors that the
 * forward saved for the backward, by their memory-plan names (MaxText's remat names):
 *   layers.<L>.decoder_layer_input  [rows, d_model]  the residual stream entering layer L
 *   layers.<L>.mlpwi_0              [rows, mlp_dim]  the MLP gate pre-activation
 * and prints, per probe, the residual stream's RMS and the gate's mean, standard
 * deviation and the fraction of "off" gate units (pre-activation < -3, where SiLU
 * and GELU pass less than 0.15 of their input) - a typical dead-unit diagnostic.
 *
 * Usage: probe_activations CONFIG.yml [key=value ...]
 *        environment PROBE_LAYER (default: the middle layer), PROBE_EVERY (default 5)
 * Exit 0 when every probe read finite activations, 1 otherwise, 2 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <meshtrain.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        mt_status st_ = (call);                                                       \
        if (st_ != MT_OK) {                                                           \
            fprintf(stderr, "probe_activations: %s: %s\n", #call, mt_last_error());   \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

typedef struct stats {
    double mean, std, rms, frac_below;
    int finite;
} stats;

static stats describe(const float *x, int64_t n, float below) {
    stats s = {0, 0, 0, 0, 1};
    double sum = 0.0, sq = 0.0;
    int64_t nb = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) s.finite = 0;
        sum += x[i];
        sq += (double)x[i] * x[i];
        nb += x[i] < below;
    }
    s.mean = sum / (double)n;
    s.rms = sqrt(sq / (double)n);
    s.std = sqrt(fmax(0.0, sq / (double)n - s.mean * s.mean));
    s.frac_below = (double)nb / (double)n;
    return s;
}

static void probe(mt_session *s, int64_t step, int64_t layer, const int32_t *tok, float *hidden, float *resid,
                  float *gate, int64_t nresid, int64_t ngate, int *all_finite) {
    char name_in[64], name_gate[64];
    snprintf(name_in, sizeof name_in, "layers.%lld.decoder_layer_input", (long long)layer);
    snprintf(name_gate, sizeof name_gate, "layers.%lld.mlpwi_0", (long long)layer);
    CHECK(mt_session_forward(s, tok, hidden));
    CHECK(mt_session_activation(s, name_in, resid, nresid, NULL));
    CHECK(mt_session_activation(s, name_gate, gate, ngate, NULL));
    stats r = describe(resid, nresid, 0.0f), g = describe(gate, ngate, -3.0f);
    *all_finite &= r.finite && g.finite;
    printf("probe step %3lld  layer %lld  residual rms %.4f  gate mean %+.4f std %.4f off %.2f%%\n",
           (long long)step, (long long)layer, r.rms, g.mean, g.std, 100.0 * g.frac_below);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: probe_activations CONFIG.yml [key=value ...]\n");
        return 2;
    }
    mt_session *s = NULL;
    CHECK(mt_session_create(&s, argv[1], argc - 2, (const char *const *)argv + 2));
    mt_session_info in;
    CHECK(mt_session_get_info(s, &in));
    const char *env_layer = getenv("PROBE_LAYER"), *env_every = getenv("PROBE_EVERY");
    const int64_t layer = env_layer ? strtoll(env_layer, NULL, 10) : in.num_layers / 2;
    const int64_t every = env_every ? strtoll(env_every, NULL, 10) : 5;
    if (layer < 0 || layer >= in.num_layers || every < 1) {
        fprintf(stderr, "probe_activations: PROBE_LAYER must be in [0, %lld), PROBE_EVERY >= 1\n",
                (long long)in.num_layers);
        return 2;
    }
    char buf[64];
    CHECK(mt_session_config_get(s, "steps", buf, sizeof buf));
    const int64_t steps = strtoll(buf, NULL, 10);

    /* sizes of the probed tensors, asked from the session */
    char name_gate[64];
    snprintf(name_gate, sizeof name_gate, "layers.%lld.mlpwi_0", (long long)layer);
    int64_t ngate = 0;
    CHECK(mt_session_activation(s, name_gate, NULL, 0, &ngate));
    const int64_t nresid = in.rows * in.emb_dim;
    int32_t *tok = malloc((size_t)in.rows * sizeof(int32_t)), *lab = malloc((size_t)in.rows * sizeof(int32_t));
    float *hidden = malloc((size_t)nresid * sizeof(float)), *resid = malloc((size_t)nresid * sizeof(float));
    float *gate = malloc((size_t)ngate * sizeof(float));
    if (!tok || !lab || !hidden || !resid || !gate) return 2;
    CHECK(mt_session_next_batch(s, tok, lab)); /* the fixed probe batch */

    int all_finite = 1;
    probe(s, 0, layer, tok, hidden, resid, gate, nresid, ngate, &all_finite);
    for (int64_t i = 0; i < steps; i++) {
        mt_step_result r;
        CHECK(mt_session_step(s, &r));
        printf("step %3lld  loss %.4f  %.0f tokens/s\n", (long long)r.step, r.loss, r.tokens_per_s);
        if (r.step % every == 0 || r.step == steps)
            probe(s, r.step, layer, tok, hidden, resid, gate, nresid, ngate, &all_finite);
    }
    free(tok);
    free(lab);
    free(hidden);
    free(resid);
    free(gate);
    mt_session_free(s);
    return all_finite ? 0 : 1;
}
