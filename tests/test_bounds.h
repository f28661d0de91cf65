/* tests/test_bounds.h: the model-level error bounds (no test framework: the tools in
 * tests/tools use it too).
 *
 * The bound every model-level comparison of two evaluations of the same math is held
 * to (tests/test_decode.c, test_model.c, test_backward_hidden.c, test_gpu_ops.c, and
 * tests/tools/mpi_layout.c for the layout suites), derived once here so that each
 * test states only its numbers.
 *
 * Error model. u is the unit roundoff of the arithmetic compared (fp32 2^-24, bf16
 * 2^-8). A rounded operation summing n terms (a dot product, a softmax denominator, a
 * norm's sum of squares) returns the exact sum of its terms each perturbed relatively
 * by theta with |theta| <= lambda sqrt(n) u, with probability at least
 * 1 - 2n exp(-lambda^2 (1 - u)^2 / 2), when the roundings are independent and of mean
 * zero (Higham and Mary, "A New Approach to Probabilistic Rounding Error Analysis",
 * SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1), in any summation order: so it holds
 * whatever order a BLAS kernel, a thread count or a block size picks. An elementwise op
 * counts n = 1. Along the dependency chain that ends in a compared value, these
 * relative perturbations add; the chain's term count S = sum of n over the operations
 * on it (tu_chain_terms) bounds them together by lambda sqrt(S) u (the same theorem
 * applied to the chain as one sum; an overcount where the chain is shorter).
 *
 * Condition. How far a relative perturbation of the operations' terms moves the
 * compared value is the condition kappa of the value: the relative change of the
 * value (measured as the comparison measures it, e.g. max |diff| / max |value| of a
 * row) per unit relative perturbation of the terms. Each test evaluates it on its own
 * model, in exact terms of the function and not of rounding: every parameter w is
 * multiplied by (1 + eta xi), xi = +-1 independent, eta = TU_KAPPA_ETA, and kappa =
 * (relative change of the value) / eta. eta = 2^-12 is small enough for the first-order
 * term (kappa moves by under 1% between eta = 2^-10 and 2^-14 on test_decode's models)
 * and large enough that the two evaluations' own rounding (~1e-6 relative) adds under
 * 1% to it. A weight perturbed by eta xi
 * perturbs each product of the GEMMs it enters relatively by eta, as rounding does;
 * the parameter-free operations (scores, softmax, norms) are covered by counting
 * their terms in S.
 *
 * Bound. Each evaluation is within lambda sqrt(S) u kappa of the exact value, two
 * evaluations within twice that of each other: tu_chain_bound. lambda = TU_LAMBDA = 6
 * gives a failure probability below 2 S exp(-18) = 3.1e-8 S per compared value.
 * The bound is a worst case over orders; the measured differences sit far below it
 * (each test says by how much): rounding errors of opposite signs cancel, and most
 * terms are not near the largest. */
#ifndef MT_TESTS_TEST_BOUNDS_H
#define MT_TESTS_TEST_BOUNDS_H

#include <math.h>
#include <stdint.h>

#include "models/config.h"
#include "runtime/rng.h"

#define TU_LAMBDA 6.0
#define TU_KAPPA_ETA 0x1p-12
#define TU_U_F32 0x1p-24
#define TU_U_BF16 0x1p-8

/* Term count S of the longest dependency chain of model c (d_model D, heads H of
 * Dh, kv heads Hk, MLP F, vocabulary V, L layers) over T positions that ends in a
 * logit (backward = 0) or, backward = 1, in a parameter gradient summed over N rows:
 *   forward per layer: input norm D, q/k/v D, QK-norm Dh (if on), RoPE 2, score Dh,
 *     soft-cap 2 (if on), softmax T + 2, P V T, output H Dh, post-attention norm D
 *     (if on), residual 1, norm D, gate / up D, activation 2, down F, post-feedforward
 *     norm D (if on), residual 1;
 *   head: final norm D, logits D, soft-cap 2 (if on);
 *   backward (after the forward): cross-entropy V + 2, dh V, final norm D, per layer
 *     the forward's mirror: down^T D, activation 3, gate / up^T 2F, norm D, residual
 *     1, output^T D, dP Dh, softmax T + 2, dq / dk T, q/k/v^T (H + 2 Hk) Dh, norm D,
 *     residual 1; then the weight gradient's sum over N rows. */
static inline int64_t tu_chain_terms(const mt_model_config *c, int64_t T, int backward, int64_t N) {
    const int64_t D = c->emb_dim, H = c->num_query_heads, Hk = c->num_kv_heads, Dh = c->head_dim;
    const int64_t F = c->mlp_dim, V = c->vocab_size, L = c->num_decoder_layers;
    const int64_t post = (c->use_post_attn_norm ? D : 0) + (c->use_post_ffw_norm ? D : 0);
    const int64_t fwd = D + D + (c->use_qk_norm ? Dh : 0) + 2 + Dh + (c->attn_logits_soft_cap > 0 ? 2 : 0) + T + 2 +
                        T + H * Dh + post + 1 + D + D + 2 + F + 1;
    int64_t S = L * fwd + D + D + (c->final_logits_soft_cap > 0 ? 2 : 0);
    if (backward) {
        const int64_t bwd = D + 3 + 2 * F + D + 1 + D + Dh + T + 2 + T + (H + 2 * Hk) * Dh + D + 1 + post;
        S += V + 2 + V + D + L * bwd + N;
    }
    return S;
}

/* 2 lambda sqrt(S) u kappa: the bound on two evaluations' difference (above). */
static inline double tu_chain_bound(double u, int64_t S, double kappa) {
    return 2.0 * TU_LAMBDA * sqrt((double)S) * u * kappa;
}

/* bf16 rounding sites on the longest chain of model c to a logit (backward = 0) or to
 * a parameter gradient (backward = 1): each op output that the bf16 path rounds once.
 * Forward per layer: the input norm, q / k / v, QK-norm (if on), RoPE, the
 * probabilities (rounded inside attention), the attention output, the output
 * projection, the post-attention norm (if on), the residual, the norm, gate / up, the
 * activation, down, the post-feedforward norm (if on), the residual; the head: the final
 * norm and the logits. The backward mirrors each layer with two more (dS inside
 * attention, the residual stream's gradient sum) and the head's dlogits and dh. */
static inline int64_t tu_bf16_sites(const mt_model_config *c, int backward) {
    const int64_t opt = (c->use_qk_norm ? 1 : 0) + (c->use_post_attn_norm ? 1 : 0) + (c->use_post_ffw_norm ? 1 : 0);
    const int64_t layer = 13 + opt, L = c->num_decoder_layers;
    return L * layer + 2 + (backward ? L * (layer + 2) + 2 : 0);
}

/* x[i] *= 1 + eta xi_i, xi_i = +-1 from Philox stream `seed` at index i (the
 * perturbation of the condition above; the same xi for a given flat index whatever
 * the caller). */
static inline void tu_perturb_values(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 0x4b415050u, (uint64_t)i, r);
        x[i] = (float)(x[i] * (1.0 + ((r[0] & 1u) ? TU_KAPPA_ETA : -TU_KAPPA_ETA)));
    }
}

#endif
