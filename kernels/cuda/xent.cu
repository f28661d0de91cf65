/* kernels/cuda/xent.cu: softmax cross-entropy on one vocabulary tile (ops.h xent_tile).
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
 * the fp64 sum has the fixed order ops.h states. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_XENT_THREADS 512
#define MT_XENT_SUM_THREADS 256

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
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float zj = z[j];
        if (cap > 0.0f) {
            zj = cap * tanhf(zj * inv_cap);
            z[j] = zj;
        }
        mx = fmaxf(mx, zj);
    }
    mx = mt_block_max(mx, shf); /* its barriers also publish the capped z[label] */
    const int bad = label < 0 || (int64_t)label >= V;
    if (threadIdx.x == 0) s_zl = bad ? NAN : z[label];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(z[j] - mx);
    sum = mt_block_sum(sum, shd); /* barrier: s_zl visible, every z[label] read done */
    const float zl = s_zl;
    const float inv_sum = (float)(1.0 / sum);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        const float zj = z[j];
        const float th = zj * inv_cap;
        const float dz = cap > 0.0f ? 1.0f - th * th : 1.0f;
        const float p = expf(zj - mx) * inv_sum;
        mt_st(g, j, dscale * (j == label ? p - 1.0f : p) * dz);
    }
    if (threadIdx.x == 0) {
        row_loss[r] = (double)mx + log(sum) - (double)zl;
        row_valid[r] = 1;
    }
}

/* stats[0] += sum of the valid rows' losses in increasing r (fp64), stats[1] += their
 * count. One block: the threads stage MT_XENT_SUM_THREADS rows at a time in shared
 * memory (coalesced loads), thread 0 adds them in order. */
__global__ void xent_stats_kernel(double *stats, const double *row_loss, const int32_t *row_valid, int64_t R) {
    __shared__ double sl[MT_XENT_SUM_THREADS];
    __shared__ int32_t sv[MT_XENT_SUM_THREADS];
    double s = 0.0;
    int64_t c = 0;
    for (int64_t r0 = 0; r0 < R; r0 += MT_XENT_SUM_THREADS) {
        const int64_t r = r0 + threadIdx.x;
        sl[threadIdx.x] = r < R ? row_loss[r] : 0.0;
        sv[threadIdx.x] = r < R ? row_valid[r] : 0;
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

mt_status mt_cuda_xent_tile(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                            int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale,
                            double *stats) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "xent_tile", ddt));
    if (ddt == MT_BF16 && dlogits == (void *)logits)
        return mt_set_error(MT_ERR_INVALID, "cuda: xent_tile: bfloat16 dlogits must not alias the fp32 logits");
    if (R <= 0) return MT_OK;
    char *dbuf = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_XENT, (size_t)R * (sizeof(double) + sizeof(int32_t)),
                           (void **)&dbuf));
    double *d_loss = (double *)dbuf;
    int32_t *d_valid = (int32_t *)(dbuf + (size_t)R * sizeof(double));
    MT_CUDA_DT_SWITCH(ddt, TD, xent_kernel<TD><<<(unsigned)R, MT_XENT_THREADS>>>(
                                   logits, (TD *)dlogits, labels, V, softcap, ignore_index, dscale, d_loss, d_valid));
    MT_CUDA_LAUNCHED(be, "xent_kernel");
    xent_stats_kernel<<<1, MT_XENT_SUM_THREADS>>>(stats, d_loss, d_valid, R);
    MT_CUDA_LAUNCHED(be, "xent_stats_kernel");
    return MT_OK;
}
