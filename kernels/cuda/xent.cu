/* kernels/cuda/xent.cu: softmax cross-entropy on one vocabulary tile (ops.h xent_tile),
 * and the same math split around the vocab-parallel all-reduces (ops.h vocab_tile_max,
 * vocab_tile_sumexp, vocab_tile_grad).
 *
 * One block per row (MT_XENT_THREADS threads striding over V), three passes over the
 * row like kernels/cpu/xent.c: (1) optional final soft-cap z = cap tanh(x / cap), kept
 * in logits (scratch from here on), and the row max; (2) sum exp(z - max) in fp64 (V
 * reaches 256k); (3) the scaled gradient dscale (softmax - onehot) dz/dx, written to
 * dlogits (float, which may be logits itself, or bfloat16 rounded once). Each thread
 * revisits only the elements it wrote, so the passes need no barrier between them beyond
 * the reductions.
 * The loss never leaves the device: each row's loss goes to a per-row fp64 slot with a
 * valid flag (scratch), then one block adds the labelled rows in increasing r and adds
 * that sum and the count to stats[0] and stats[1] (ops.h: "+=", no synchronisation;
 * the caller copies stats to the host once when it needs the loss). The row slots are
 * staged through shared memory by all threads and summed by thread 0 in row order, so
 * the fp64 sum has the fixed order ops.h states.
 * The vocab-parallel ops are the three passes as three kernels (one block per row of
 * vocab_threads(Vl) threads: a single warp for a slice of at most 32 logits), sharing
 * the pass functions below with xent_kernel; vocab_tile_grad's row losses need only
 * mx and sz, so the stats kernel computes them itself (no per-row scratch), and the
 * gradient kernel runs only when asked for. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_XENT_THREADS 512
#define MT_XENT_SUM_THREADS 256

/* Pass 1, this thread's share of a row: z = cap tanh(z inv_cap) in place when cap > 0;
 * returns the max of its elements (the caller reduces over the block). */
__device__ __forceinline__ float xent_cap_max(float *z, int64_t V, float cap, float inv_cap) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float zj = z[j];
        if (cap > 0.0f) {
            zj = cap * tanhf(zj * inv_cap);
            z[j] = zj;
        }
        mx = fmaxf(mx, zj);
    }
    return mx;
}

/* Pass 2, this thread's share: sum of exp(z - mx) (fp32 exps) in fp64, increasing j. */
__device__ __forceinline__ double xent_sumexp(const float *z, int64_t V, float mx) {
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(z[j] - mx);
    return sum;
}

/* Pass 3, one element: dscale (p - [label]) dz with p = exp(z - mx) inv_sum. */
__device__ __forceinline__ float xent_grad(float zj, float mx, float inv_sum, float cap, float inv_cap, float dscale,
                                           bool is_label) {
    const float th = zj * inv_cap;
    const float dz = cap > 0.0f ? 1.0f - th * th : 1.0f;
    const float p = expf(zj - mx) * inv_sum;
    return dscale * (is_label ? p - 1.0f : p) * dz;
}

template <typename TD>
__global__ void xent_kernel(float *logits, TD *dlogits, const int32_t *labels, int64_t V, float cap, int32_t ignore,
                            float dscale, double *row_loss, int32_t *row_valid) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    __shared__ float s_zl;
    const int64_t r = blockIdx.x;
    float *z = logits + r * V;
    TD *g = dlogits + r * V;
    const int32_t label = labels[r];
    if (label == ignore) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mt_st(g, j, 0.0f);
        if (threadIdx.x == 0) {
            row_loss[r] = 0.0;
            row_valid[r] = 0;
        }
        return;
    }
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    /* the block max's barriers also publish the capped z[label] */
    const float mx = mt_block_max(xent_cap_max(z, V, cap, inv_cap), shf);
    const int bad = label < 0 || (int64_t)label >= V;
    if (threadIdx.x == 0) s_zl = bad ? NAN : z[label];
    const double sum = mt_block_sum(xent_sumexp(z, V, mx), shd); /* barrier: s_zl visible, every z[label] read done */
    const float zl = s_zl;
    const float inv_sum = (float)(1.0 / sum);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        mt_st(g, j, xent_grad(z[j], mx, inv_sum, cap, inv_cap, dscale, j == label));
    if (threadIdx.x == 0) {
        row_loss[r] = (double)mx + log(sum) - (double)zl;
        row_valid[r] = 1;
    }
}

/* Where the stats kernel gets row r's loss and whether it counts (returns 1 if so). */
struct xent_row_slots { /* xent_kernel's per-row scratch */
    const double *loss;
    const int32_t *valid;
    __device__ int operator()(int64_t r, double *l) const {
        *l = loss[r];
        return valid[r];
    }
};
struct vocab_row_loss { /* vocab_tile_grad: computed from the group's max, sum and label logit */
    const float *mx;
    const double *sz;
    const int32_t *labels;
    int32_t ignore;
    __device__ int operator()(int64_t r, double *l) const {
        if (labels[r] == ignore) {
            *l = 0.0;
            return 0;
        }
        *l = (double)mx[r] + log(sz[2 * r]) - sz[2 * r + 1];
        return 1;
    }
};

/* stats[0] += sum of the counted rows' losses in increasing r (fp64), stats[1] += their
 * count. One block: the threads stage MT_XENT_SUM_THREADS rows at a time in shared
 * memory (coalesced loads), thread 0 adds them in order. */
template <typename Rows>
__global__ void xent_stats_kernel(double *stats, Rows rows, int64_t R) {
    __shared__ double sl[MT_XENT_SUM_THREADS];
    __shared__ int32_t sv[MT_XENT_SUM_THREADS];
    double s = 0.0;
    int64_t c = 0;
    for (int64_t r0 = 0; r0 < R; r0 += MT_XENT_SUM_THREADS) {
        const int64_t r = r0 + threadIdx.x;
        double l = 0.0;
        const int32_t v = r < R ? rows(r, &l) : 0;
        sl[threadIdx.x] = l;
        sv[threadIdx.x] = v;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0; i < MT_XENT_SUM_THREADS; i++)
                if (sv[i]) {
                    s += sl[i];
                    c++;
                }
        __syncthreads(); /* the slots are read before the next rows overwrite them */
    }
    if (threadIdx.x == 0) {
        stats[0] += s;
        stats[1] += (double)c;
    }
}

size_t mt_cuda_xent_tile_scratch(int64_t R) { /* a loss and a valid flag per row */
    return R > 0 ? (size_t)R * (sizeof(double) + sizeof(int32_t)) : 0;
}

mt_status mt_cuda_xent_tile(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                            int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale,
                            double *stats) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "xent_tile", ddt));
    if (ddt == MT_BF16 && dlogits == (void *)logits)
        return mt_set_error(MT_ERR_INVALID, "cuda: xent_tile: bfloat16 dlogits must not alias the fp32 logits");
    if (R <= 0) return MT_OK;
    char *dbuf = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_XENT, mt_cuda_xent_tile_scratch(R), (void **)&dbuf));
    double *d_loss = (double *)dbuf;
    int32_t *d_valid = (int32_t *)(dbuf + (size_t)R * sizeof(double));
    MT_CUDA_DT_SWITCH(ddt, TD, xent_kernel<TD><<<(unsigned)R, MT_XENT_THREADS>>>(
                                   logits, (TD *)dlogits, labels, V, softcap, ignore_index, dscale, d_loss, d_valid));
    MT_CUDA_LAUNCHED(be, "xent_kernel");
    const xent_row_slots rows = {d_loss, d_valid};
    xent_stats_kernel<xent_row_slots><<<1, MT_XENT_SUM_THREADS>>>(stats, rows, R);
    MT_CUDA_LAUNCHED(be, "xent_stats_kernel");
    return MT_OK;
}

/* ---- vocab-parallel phases (ops.h vocab_tile_*) ---- */

/* Threads of a row block: Vl rounded up to whole warps, at most MT_XENT_THREADS (so the
 * reduction order is fixed by Vl alone). */
static unsigned vocab_threads(int64_t Vl) {
    const int64_t t = (Vl + 31) / 32 * 32;
    return (unsigned)(t < MT_XENT_THREADS ? t : MT_XENT_THREADS);
}

static mt_status vocab_check(const char *op, int64_t R, int64_t Vl) {
    if (R < 0 || Vl < 1)
        return mt_set_error(MT_ERR_INVALID, "cuda: %s: R = %lld, Vl = %lld (need R >= 0, Vl >= 1)", op,
                            (long long)R, (long long)Vl);
    return MT_OK;
}

__global__ void vocab_max_kernel(float *z, int64_t Vl, float cap, float *mx, int accumulate) {
    __shared__ float shf[32];
    const int64_t r = blockIdx.x;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float m = mt_block_max(xent_cap_max(z + r * Vl, Vl, cap, inv_cap), shf);
    if (threadIdx.x == 0) mx[r] = accumulate && mx[r] >= m ? mx[r] : m;
}

__global__ void vocab_sumexp_kernel(const float *z, int64_t Vl, const float *mx, const int32_t *labels, int64_t v0,
                                    int32_t ignore, double *sz, int accumulate) {
    __shared__ double shd[32];
    const int64_t r = blockIdx.x;
    const int32_t label = labels[r];
    if (label == ignore) { /* the whole block leaves: no barrier is left waiting */
        if (threadIdx.x == 0 && !accumulate) sz[2 * r] = sz[2 * r + 1] = 0.0;
        return;
    }
    const double s = mt_block_sum(xent_sumexp(z + r * Vl, Vl, mx[r]), shd);
    if (threadIdx.x == 0) {
        const double zl = label >= v0 && label < v0 + Vl ? (double)z[r * Vl + (label - v0)] : 0.0;
        sz[2 * r] = accumulate ? sz[2 * r] + s : s;
        sz[2 * r + 1] = accumulate ? sz[2 * r + 1] + zl : zl;
    }
}

/* Elementwise given the row's mx and sz: each thread rewrites only its own elements. */
__global__ void vocab_grad_kernel(float *z, int64_t Vl, const float *mx, const double *sz, const int32_t *labels,
                                  int64_t v0, int32_t ignore, float cap, float dscale) {
    const int64_t r = blockIdx.x;
    float *row = z + r * Vl;
    const int32_t label = labels[r];
    if (label == ignore) {
        for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) row[j] = 0.0f;
        return;
    }
    const float m = mx[r], inv_sum = (float)(1.0 / sz[2 * r]), inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const int64_t col = label >= v0 && label < v0 + Vl ? label - v0 : -1;
    for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x)
        row[j] = xent_grad(row[j], m, inv_sum, cap, inv_cap, dscale, j == col);
}

mt_status mt_cuda_vocab_tile_max(mt_backend *be, float *z, int64_t R, int64_t Vl, float softcap, float *mx,
                                  int accumulate) {
    MT_CUDA_ENTER(be);
    MT_TRY(vocab_check("vocab_tile_max", R, Vl));
    if (R == 0) return MT_OK;
    vocab_max_kernel<<<(unsigned)R, vocab_threads(Vl)>>>(z, Vl, softcap, mx, accumulate);
    MT_CUDA_LAUNCHED(be, "vocab_max_kernel");
    return MT_OK;
}

mt_status mt_cuda_vocab_tile_sumexp(mt_backend *be, const float *z, int64_t R, int64_t Vl, const float *mx,
                                    const int32_t *labels, int64_t v0, int32_t ignore_index, double *sz,
                                    int accumulate) {
    MT_CUDA_ENTER(be);
    MT_TRY(vocab_check("vocab_tile_sumexp", R, Vl));
    if (R == 0) return MT_OK;
    vocab_sumexp_kernel<<<(unsigned)R, vocab_threads(Vl)>>>(z, Vl, mx, labels, v0, ignore_index, sz,
                                                            accumulate);
    MT_CUDA_LAUNCHED(be, "vocab_sumexp_kernel");
    return MT_OK;
}

mt_status mt_cuda_vocab_tile_grad(mt_backend *be, float *z, int64_t R, int64_t Vl, const float *mx, const double *sz,
                                  const int32_t *labels, int64_t v0, int32_t ignore_index, float softcap,
                                  float dscale, int write_grad, double *stats) {
    MT_CUDA_ENTER(be);
    MT_TRY(vocab_check("vocab_tile_grad", R, Vl));
    if (R == 0) return MT_OK;
    const vocab_row_loss rows = {mx, sz, labels, ignore_index};
    xent_stats_kernel<vocab_row_loss><<<1, MT_XENT_SUM_THREADS>>>(stats, rows, R);
    MT_CUDA_LAUNCHED(be, "xent_stats_kernel");
    if (!write_grad) return MT_OK;
    vocab_grad_kernel<<<(unsigned)R, vocab_threads(Vl)>>>(z, Vl, mx, sz, labels, v0, ignore_index, softcap, dscale);
    MT_CUDA_LAUNCHED(be, "vocab_grad_kernel");
    return MT_OK;
}
