/* kernels/cpu/xent.c: softmax cross-entropy on one tile of logit rows and its gradient.
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
 * logits are left as scratch. */
#include <math.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vmath.h"

#define MT_XENT_CHUNKS 64

/* Loss of one row; the row becomes its scaled gradient. NaN for a label outside [0, V). */
MT_CPU_SIMD_CLONES
static double xent_row(float *restrict z, int32_t label, int64_t V, float cap, float dscale) {
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
    const int bad = label < 0 || (int64_t)label >= V;
    const float zl = bad ? NAN : z[label]; /* read before pass 2 may overwrite it */
    double sum = 0.0;
    if (cap > 0.0f) {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++) sum += (double)mt_vexpf(z[j] - mx);
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
#pragma omp simd
        for (int64_t j = 0; j < V; j++) {
            const float th = z[j] * inv_cap;
            z[j] = dscale * (mt_vexpf(z[j] - mx) * inv_sum) * (1.0f - th * th);
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < V; j++) z[j] = dscale * (z[j] * inv_sum); /* z holds exp(z - max) */
    }
    if (!bad) {
        /* softmax - onehot at the label, from p computed exactly as in the loop above */
        const float pl = mt_vexpf(zl - mx) * inv_sum;
        const float th = zl * inv_cap;
        const float dz = cap > 0.0f ? 1.0f - th * th : 1.0f;
        z[label] = dscale * (pl - 1.0f) * dz;
    }
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
