/* kernels/cpu/xent.c: softmax cross-entropy on one tile of logit rows and its gradient
 * (ops.h xent_tile), and the same math split around the vocab-parallel all-reduces
 * (ops.h vocab_tile_max, vocab_tile_sumexp, vocab_tile_grad).
 *
 * Per labelled row, three vectorised passes over the V logits (a row of 32k floats stays
 * in L2 across them):
 *   1. optional final soft-cap z = cap tanh(x / cap) (stored in place), and max(z);
 *   2. sum exp(z - max) in fp64 (V reaches 256k terms);
 *   3. overwrite with dscale (softmax - onehot) dz/dx, dz/dx = 1 - (z / cap)^2.
 * Without a soft-cap, pass 2 stores the exponentials and pass 3 only scales them; with
 * one, pass 3 recomputes them because the soft-cap derivative still needs z. Either way
 * each element gets the same value. The row function has an AVX2 clone
 * (MT_CPU_SIMD_CLONES). Rows are split into a fixed number of chunks (independent of the
 * thread count) whose fp64 loss sums are added in chunk order, so the loss is bitwise
 * reproducible; the tile's sum and count are added to the caller's stats[0] and stats[1].
 * The gradient is always computed in place in the fp32 logits row; a separate dlogits
 * (fp32, or bf16: each element rounded once) then receives a copy of the row, and the
 * logits are left as scratch.
 * The vocab-parallel ops run the passes one per op, on a slice of each row, from the
 * same inline pass functions (row_cap_max, row_sumexp, row_grad, label_grad), so on a
 * group of one they give xent_tile's bits. Their rows are independent (OpenMP over
 * rows); vocab_tile_grad adds the row losses in increasing r on one thread. */
#include <math.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vmath.h"

#define MT_XENT_CHUNKS 64

/* Pass 1: z = cap tanh(z / cap) in place when cap > 0; returns max_j z. */
static inline float row_cap_max(float *restrict z, int64_t V, float cap) {
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    float mx = -INFINITY;
    if (cap > 0.0f) {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < V; j++) {
            const float zj = cap * mt_vtanhf(z[j] * inv_cap);
            z[j] = zj;
            mx = zj > mx ? zj : mx;
        }
    } else {
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    }
    return mx;
}

/* Pass 2 (z kept): sum_j exp(z_j - mx), each exp in fp32, the sum in fp64. */
static inline double row_sumexp(const float *restrict z, int64_t V, float mx) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; j++) sum += (double)mt_vexpf(z[j] - mx);
    return sum;
}

/* Pass 3 from the logits (the exps recomputed): z_j = dscale p_j dz_j, p_j = exp(z_j -
 * mx) inv_sum, dz_j = 1 - (z_j inv_cap)^2 when cap > 0 else 1 (not multiplied in). The
 * label's entry is label_grad's. */
static inline void row_grad(float *restrict z, int64_t V, float mx, float inv_sum, float cap, float dscale) {
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    if (cap > 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < V; j++) {
            const float th = z[j] * inv_cap;
            z[j] = dscale * (mt_vexpf(z[j] - mx) * inv_sum) * (1.0f - th * th);
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < V; j++) z[j] = dscale * (mt_vexpf(z[j] - mx) * inv_sum);
    }
}

/* dscale (softmax - 1) dz at the label, zl its (capped) logit, p computed exactly as in
 * row_grad and in xent_row's uncapped pass 3. */
static inline float label_grad(float zl, float mx, float inv_sum, float cap, float dscale) {
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float pl = mt_vexpf(zl - mx) * inv_sum;
    const float th = zl * inv_cap;
    const float dz = cap > 0.0f ? 1.0f - th * th : 1.0f;
    return dscale * (pl - 1.0f) * dz;
}

/* Loss of one row; the row becomes its scaled gradient. NaN for a label outside [0, V). */
MT_CPU_SIMD_CLONES
static double xent_row(float *restrict z, int32_t label, int64_t V, float cap, float dscale) {
    const float mx = row_cap_max(z, V, cap);
    const int bad = label < 0 || (int64_t)label >= V;
    const float zl = bad ? NAN : z[label]; /* read before pass 2 may overwrite it */
    double sum = 0.0;
    if (cap > 0.0f) {
        sum = row_sumexp(z, V, mx);
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++) {
            const float e = mt_vexpf(z[j] - mx);
            z[j] = e;
            sum += (double)e;
        }
    }

    const double loss = (double)mx + log(sum) - (double)zl;
    const float inv_sum = (float)(1.0 / sum);
    if (cap > 0.0f) {
        row_grad(z, V, mx, inv_sum, cap, dscale);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < V; j++) z[j] = dscale * (z[j] * inv_sum); /* z holds exp(z - max) */
    }
    if (!bad) z[label] = label_grad(zl, mx, inv_sum, cap, dscale);
    return loss;
}

mt_status mt_cpu_xent_tile(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                           int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale, double *stats) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("xent_tile", ddt));
    if (ddt == MT_BF16 && dlogits == (void *)logits)
        return mt_set_error(MT_ERR_INVALID, "cpu xent_tile: bfloat16 dlogits must be a buffer apart from logits");
    const int in_place = dlogits == (void *)logits; /* fp32 only */
    double part[MT_XENT_CHUNKS];
    int64_t cnt[MT_XENT_CHUNKS];
    const int64_t nch = R < MT_XENT_CHUNKS ? R : MT_XENT_CHUNKS;
#pragma omp parallel for schedule(dynamic, 1) if (R * V >= 32768)
    for (int64_t c = 0; c < nch; c++) {
        double s = 0.0;
        int64_t k = 0;
        for (int64_t r = R * c / nch; r < R * (c + 1) / nch; r++) {
            float *row = logits + r * V;
            if (labels[r] == ignore_index) {
                if (in_place)
                    for (int64_t j = 0; j < V; j++) row[j] = 0.0f;
                else
                    mt_cpu_fill(dlogits, r * V, 0.0f, V, ddt);
                continue;
            }
            s += xent_row(row, labels[r], V, softcap, dscale);
            k++;
            if (!in_place) mt_cpu_store(dlogits, r * V, row, V, ddt);
        }
        part[c] = s;
        cnt[c] = k;
    }
    double total = 0.0;
    int64_t n = 0;
    for (int64_t c = 0; c < nch; c++) {
        total += part[c];
        n += cnt[c];
    }
    stats[0] += total;
    stats[1] += (double)n;
    return MT_OK;
}

/* ---- vocab-parallel phases (ops.h vocab_tile_*) ---- */

/* The rows of a tile run in parallel when the tile is large enough to pay for it. */
#define MT_VOCAB_PAR_MIN 32768

static mt_status vocab_check(const char *op, int64_t R, int64_t Vl) {
    if (R < 0 || Vl < 1)
        return mt_set_error(MT_ERR_INVALID, "cpu %s: R = %lld, Vl = %lld (need R >= 0, Vl >= 1)", op, (long long)R,
                            (long long)Vl);
    return MT_OK;
}

/* The label's column in the slice [v0, v0 + Vl), or -1 when another rank owns it (or the
 * row is ignored). */
static inline int64_t vocab_col(int32_t label, int64_t v0, int64_t Vl, int32_t ignore) {
    return label != ignore && label >= v0 && label < v0 + Vl ? label - v0 : -1;
}

MT_CPU_SIMD_CLONES
static float vocab_max_row(float *restrict z, int64_t Vl, float cap) { return row_cap_max(z, Vl, cap); }

MT_CPU_SIMD_CLONES
static double vocab_sumexp_row(const float *restrict z, int64_t Vl, float mx) { return row_sumexp(z, Vl, mx); }

MT_CPU_SIMD_CLONES
static void vocab_grad_row(float *restrict z, int64_t Vl, int64_t col, float mx, double s, float cap, float dscale) {
    const float inv_sum = (float)(1.0 / s);
    const float zl = col >= 0 ? z[col] : 0.0f; /* read before row_grad overwrites it */
    row_grad(z, Vl, mx, inv_sum, cap, dscale);
    if (col >= 0) z[col] = label_grad(zl, mx, inv_sum, cap, dscale);
}

mt_status mt_cpu_vocab_tile_max(mt_backend *be, float *z, int64_t R, int64_t Vl, float softcap, float *mx,
                                 int accumulate) {
    (void)be;
    MT_TRY(vocab_check("vocab_tile_max", R, Vl));
#pragma omp parallel for schedule(static) if (R * Vl >= MT_VOCAB_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float m = vocab_max_row(z + r * Vl, Vl, softcap);
        mx[r] = accumulate && mx[r] >= m ? mx[r] : m;
    }
    return MT_OK;
}

mt_status mt_cpu_vocab_tile_sumexp(mt_backend *be, const float *z, int64_t R, int64_t Vl, const float *mx,
                                   const int32_t *labels, int64_t v0, int32_t ignore_index, double *sz,
                                   int accumulate) {
    (void)be;
    MT_TRY(vocab_check("vocab_tile_sumexp", R, Vl));
#pragma omp parallel for schedule(static) if (R * Vl >= MT_VOCAB_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const int64_t col = vocab_col(labels[r], v0, Vl, ignore_index);
        const int ignored = labels[r] == ignore_index;
        const double s = ignored ? 0.0 : vocab_sumexp_row(z + r * Vl, Vl, mx[r]);
        const double zl = col >= 0 ? (double)z[r * Vl + col] : 0.0;
        sz[2 * r] = accumulate ? sz[2 * r] + s : s;
        sz[2 * r + 1] = accumulate ? sz[2 * r + 1] + zl : zl;
    }
    return MT_OK;
}

mt_status mt_cpu_vocab_tile_grad(mt_backend *be, float *z, int64_t R, int64_t Vl, const float *mx, const double *sz,
                                 const int32_t *labels, int64_t v0, int32_t ignore_index, float softcap, float dscale,
                                 int write_grad, double *stats) {
    (void)be;
    MT_TRY(vocab_check("vocab_tile_grad", R, Vl));
    double total = 0.0;
    int64_t n = 0;
    for (int64_t r = 0; r < R; r++) { /* xent_row's loss from the group's max, sum and label logit */
        if (labels[r] == ignore_index) continue;
        total += (double)mx[r] + log(sz[2 * r]) - sz[2 * r + 1];
        n++;
    }
    stats[0] += total;
    stats[1] += (double)n;
    if (!write_grad) return MT_OK;
#pragma omp parallel for schedule(static) if (R * Vl >= MT_VOCAB_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        float *row = z + r * Vl;
        if (labels[r] == ignore_index) {
            for (int64_t j = 0; j < Vl; j++) row[j] = 0.0f;
            continue;
        }
        vocab_grad_row(row, Vl, vocab_col(labels[r], v0, Vl, ignore_index), mx[r], sz[2 * r], softcap, dscale);
    }
    return MT_OK;
}
