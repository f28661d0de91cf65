/* kernels/cuda/xent.cu: softmax cross-entropy on one vocabulary tile, gradient in place.
 *
 * One block per row (MT_XENT_THREADS threads striding over V), three passes over the
 * row like kernels/cpu/xent.c: (1) optional final soft-cap z = cap tanh(x / cap), kept
 * in place, and the row max; (2) sum exp(z - max) in fp64 (V reaches 256k); (3) the
 * scaled gradient dscale (softmax - onehot) dz/dx. Each thread revisits only the
 * elements it wrote, so the passes need no barrier between them beyond the reductions.
 * The row's loss goes to a per-row fp64 slot with a valid flag; the host adds the rows
 * in row order after one small copy (the loss sum and count are host values in ops.h),
 * so the sum is deterministic. That copy synchronises once per tile; keeping the sums
 * on the device until the step ends is an optimisation for later. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

#define MT_XENT_THREADS 512

__global__ void xent_kernel(float *logits, const int32_t *labels, int64_t V, float cap, int32_t ignore,
                            float dscale, double *row_loss, int32_t *row_valid) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    __shared__ float s_zl;
    const int64_t r = blockIdx.x;
    float *z = logits + r * V;
    const int32_t label = labels[r];
    if (label == ignore) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) z[j] = 0.0f;
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
        z[j] = dscale * (j == label ? p - 1.0f : p) * dz;
    }
    if (threadIdx.x == 0) {
        row_loss[r] = (double)mx + log(sum) - (double)zl;
        row_valid[r] = 1;
    }
}

mt_status mt_cuda_xent_tile(mt_backend *be, float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                       int32_t ignore_index, float dscale, double *loss_sum, int64_t *count) {
    MT_CUDA_ENTER(be);
    if (R <= 0) return MT_OK;
    const size_t bytes = (size_t)R * (sizeof(double) + sizeof(int32_t));
    char *dbuf = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_XENT, bytes, (void **)&dbuf));
    char *hbuf = (char *)malloc(bytes);
    if (!hbuf) return mt_set_error(MT_ERR_OOM, "cuda: xent_tile: out of host memory");
    double *d_loss = (double *)dbuf;
    int32_t *d_valid = (int32_t *)(dbuf + (size_t)R * sizeof(double));
    xent_kernel<<<(unsigned)R, MT_XENT_THREADS>>>(logits, labels, V, softcap, ignore_index, dscale, d_loss, d_valid);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(hbuf, dbuf, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(hbuf);
        return mt_cuda_fail(be, "xent_kernel launch or its cudaMemcpy (synchronising)", cudaGetErrorString(e), 1);
    }
    const double *h_loss = (const double *)hbuf;
    const int32_t *h_valid = (const int32_t *)(hbuf + (size_t)R * sizeof(double));
    double s = 0.0;
    int64_t c = 0;
    for (int64_t r = 0; r < R; r++)
        if (h_valid[r]) {
            s += h_loss[r];
            c++;
        }
    *loss_sum += s;
    *count += c;
    free(hbuf);
    return MT_OK;
}
