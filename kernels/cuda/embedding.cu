/* kernels/cuda/embedding.cu: token embedding lookup and its deterministic backward.
 *
 * Forward: out[n, :] = scale * table[tokens[n], :], one block per row.
 * Backward: dtable[v, :] += scale * dout[n, :] for every n with tokens[n] == v, in
 * increasing n, without atomics. Choice: the tokens (N int32, a few KiB) are copied to
 * the host and counting-sorted there (stable, O(N + V)) into segments of equal token;
 * then one block per (segment, column chunk) owns its rows of dtable and adds the
 * segment's dout rows in increasing n. Work is O(N D), like the forward; the cost is
 * one device->host copy (a synchronisation) per backward, once per step. Alternatives
 * considered: one thread per column scanning all N tokens (deterministic, but only D
 * threads of parallelism) and a device radix sort (CUB; no host round trip, but a
 * heavy template instantiation in CI's compile time): the latter is the upgrade when
 * the sync shows up in a profile.
 * The adds use __fmul_rn/__fadd_rn (no FMA contraction) in the CPU's order, so the
 * result is meant to be bitwise kernels/cpu/embedding.c's. */
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

#define MT_EMB_THREADS 256

__global__ void embedding_fwd_kernel(float *out, const float *table, const int32_t *tokens, int64_t D,
                                     float scale) {
    const int64_t n = blockIdx.x;
    const float *src = table + (int64_t)tokens[n] * D;
    float *dst = out + n * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = scale * src[d];
}

/* seg[0..nseg] are starts into order[]; segtok[s] the token of segment s. */
__global__ void embedding_bwd_kernel(float *dtable, const float *dout, const int32_t *order, const int32_t *seg,
                                     const int32_t *segtok, int64_t D, float scale) {
    const int64_t s = blockIdx.x;
    const int64_t d = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= D) return;
    float *dst = dtable + (int64_t)segtok[s] * D + d;
    float acc = *dst;
    for (int32_t k = seg[s]; k < seg[s + 1]; k++)
        acc = __fadd_rn(acc, __fmul_rn(scale, dout[(int64_t)order[k] * D + d]));
    *dst = acc;
}

mt_status mt_cuda_embedding_fwd(mt_backend *be, float *out, const float *table, const int32_t *tokens, int64_t N, int64_t D,
                           float scale) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || D <= 0) return MT_OK;
    embedding_fwd_kernel<<<(unsigned)N, MT_EMB_THREADS>>>(out, table, tokens, D, scale);
    MT_CUDA_LAUNCHED(be, "embedding_fwd_kernel");
    return MT_OK;
}

mt_status mt_cuda_embedding_bwd(mt_backend *be, float *dtable, const float *dout, const int32_t *tokens, int64_t N, int64_t V,
                           int64_t D, float scale) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || D <= 0 || V <= 0) return MT_OK;
    /* host: tokens -> stable counting sort -> order, segment starts, segment tokens */
    int32_t *h = (int32_t *)malloc((size_t)(4 * N + 2) * sizeof(int32_t));
    int32_t *cnt = (int32_t *)calloc((size_t)V + 1, sizeof(int32_t));
    if (!h || !cnt) {
        free(h);
        free(cnt);
        return mt_set_error(MT_ERR_OOM, "cuda: embedding_bwd: out of host memory for the token sort");
    }
    int32_t *tok = h, *order = h + N, *seg = h + 2 * N, *segtok = h + 3 * N + 1;
    cudaError_t e = cudaMemcpy(tok, tokens, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(h);
        free(cnt);
        return mt_cuda_fail(be, "embedding_bwd: cudaMemcpy(tokens to host)", cudaGetErrorString(e), 1);
    }
    for (int64_t n = 0; n < N; n++) cnt[tok[n] + 1]++; /* tokens are in [0, V) (caller) */
    for (int64_t v = 0; v < V; v++) cnt[v + 1] += cnt[v];
    int64_t nseg = 0;
    for (int64_t v = 0; v < V; v++)
        if (cnt[v + 1] > cnt[v]) {
            seg[nseg] = cnt[v];
            segtok[nseg] = (int32_t)v;
            nseg++;
        }
    seg[nseg] = (int32_t)N;
    for (int64_t n = 0; n < N; n++) order[cnt[tok[n]]++] = (int32_t)n; /* stable: increasing n */
    free(cnt);
    /* device copy of order | seg | segtok, laid out as on the host */
    int32_t *dbuf = NULL;
    mt_status st = mt_cuda_scratch(be, MT_CUDA_SCRATCH_EMBED, (size_t)(3 * N + 2) * sizeof(int32_t), (void **)&dbuf);
    if (st != MT_OK) {
        free(h);
        return st;
    }
    e = cudaMemcpy(dbuf, order, (size_t)(3 * N + 2) * sizeof(int32_t), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) return mt_cuda_fail(be, "embedding_bwd: cudaMemcpy(sort to device)", cudaGetErrorString(e), 1);
    dim3 grid((unsigned)nseg, (unsigned)((D + MT_EMB_THREADS - 1) / MT_EMB_THREADS));
    embedding_bwd_kernel<<<grid, MT_EMB_THREADS>>>(dtable, dout, dbuf, dbuf + N, dbuf + 2 * N + 1, D, scale);
    MT_CUDA_LAUNCHED(be, "embedding_bwd_kernel");
    return MT_OK;
}
