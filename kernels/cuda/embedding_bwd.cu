/* kernels/cuda/embedding_bwd.cu: the deterministic backward of the token embedding
 * (ops.h embedding_bwd), entirely on the device.
 *
 * dtable[v - v0, :] += scale * dout[n, :] for every n with tokens[n] == v in the table's
 * rows [v0, v0 + V) (a vocabulary chunk, or the whole table with v0 = 0), in increasing n,
 * in fp32 (dout fp32 or bf16, widened exactly), without atomics and without a copy to the
 * host (the trainer reads the device only for the loss and the gradient norm:
 * tests/test_emu_syncs.c).
 * 1. Sort. Each row n becomes the 64-bit key (tokens[n] << 32) | n; the keys are unique,
 *    so sorting them ascending gives one order, which groups equal tokens with their rows
 *    in increasing n. The sort is a bitonic network (Batcher 1968) over the keys padded
 *    with UINT64_MAX to P = the next power of two >= N (scratch: 8 P <= 16 N bytes, slot
 *    MT_CUDA_SCRATCH_EMBED): tiles of MT_EBW_TILE keys are sorted and merged in shared
 *    memory, strides of a tile or more by one launch each: O(N log^2 N) work in
 *    L (L + 1) / 2 + L + 1 launches for L = log2(P / tile), all sizes known on the host. A radix sort (CUB) does less work but brings a heavy template
 *    instantiation into the compile; the sort is small next to the step (N keys against
 *    N x D gradient elements).
 * 2. Sum. The sorted keys are cut into runs of MT_EBW_ROWS positions; the block of a run
 *    and of a chunk of MT_EBW_THREADS columns owns every segment (maximal range of equal
 *    tokens) whose first position lies in its run, and adds that segment's dout rows, in
 *    sorted (= increasing n) order, past the end of its run if the segment goes on. So
 *    each dtable row has one owner, the grid depends only on N and D (the number of
 *    segments stays on the device); a segment of a token outside [v0, v0 + V) is
 *    skipped by its owner. The adds are the CPU's: acc = acc + scale * x
 *    with __fmul_rn / __fadd_rn (no FMA contraction), starting from dtable's value, so
 *    the result is bitwise kernels/cpu/embedding.c's for either dtype.
 * A very frequent token makes one block sum many rows (as the CPU does); the column
 * chunks keep D / MT_EBW_THREADS blocks busy on it. */
#include <stdint.h>

#include "kernels/cuda/common.cuh"

#define MT_EBW_TILE 1024   /* keys sorted in shared memory per block (8 KiB) */
#define MT_EBW_THREADS 256 /* columns per block of the sum */
#define MT_EBW_ROWS 32     /* sorted positions whose segments a block of the sum owns */

/* Compare-exchange keys a < b (positions i < i + j) into the order of the bitonic stage
 * whose direction is ascending when `up`. */
__device__ __forceinline__ void ebw_order(uint64_t &a, uint64_t &b, bool up) {
    if ((a > b) == up) {
        const uint64_t t = a;
        a = b;
        b = t;
    }
}

/* The shared-memory strides j = j0, j0 / 2, .. 1 of stage k on the block's tile sh[S]
 * (S = 2 blockDim.x, tile base g0 in the padded array): thread t orders the pair
 * (i, i + j) with i = 2j (t / j) + t % j, ascending when ((g0 + i) & k) == 0. */
__device__ void ebw_tile_strides(uint64_t *sh, int64_t g0, int64_t k, int j0) {
    const int t = threadIdx.x;
    for (int j = j0; j > 0; j >>= 1) {
        __syncthreads();
        const int i = 2 * j * (t / j) + t % j;
        ebw_order(sh[i], sh[i + j], ((g0 + i) & k) == 0);
    }
    __syncthreads();
}

/* Keys of rows [g0, g0 + S) (UINT64_MAX past N) into keys[], each tile sorted in the
 * directions of the first log2(S) stages of the whole network. */
__global__ void ebw_sort_tiles_kernel(uint64_t *keys, const int32_t *tokens, int64_t N) {
    __shared__ uint64_t sh[MT_EBW_TILE];
    const int S = 2 * blockDim.x;
    const int64_t g0 = (int64_t)blockIdx.x * S;
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        const int64_t g = g0 + i;
        sh[i] = g < N ? ((uint64_t)(uint32_t)tokens[g] << 32) | (uint64_t)g : UINT64_MAX;
    }
    for (int64_t k = 2; k <= S; k <<= 1) ebw_tile_strides(sh, g0, k, (int)(k >> 1));
    for (int i = threadIdx.x; i < S; i += blockDim.x) keys[g0 + i] = sh[i];
}

/* One stride j >= S of stage k over the whole padded array: pair t of the P / 2 (grid
 * stride) is (i, i + j) with i = 2j (t / j) + t % j. */
__global__ void ebw_sort_stride_kernel(uint64_t *keys, int64_t half, int64_t k, int64_t j) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < half; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = 2 * j * (t / j) + t % j;
        ebw_order(keys[i], keys[i + j], (i & k) == 0);
    }
}

/* The strides below S of stage k, per tile in shared memory. */
__global__ void ebw_sort_merge_kernel(uint64_t *keys, int64_t k) {
    __shared__ uint64_t sh[MT_EBW_TILE];
    const int S = 2 * blockDim.x;
    const int64_t g0 = (int64_t)blockIdx.x * S;
    for (int i = threadIdx.x; i < S; i += blockDim.x) sh[i] = keys[g0 + i];
    ebw_tile_strides(sh, g0, k, S >> 1);
    for (int i = threadIdx.x; i < S; i += blockDim.x) keys[g0 + i] = sh[i];
}

/* Block (run, column chunk): the segments starting in sorted positions [p0, p0 + ROWS). */
template <typename T>
__global__ void ebw_sum_kernel(float *dtable, const T *dout, const uint64_t *keys, int64_t N, int64_t v0, int64_t V,
                               int64_t D, float scale) {
    const int64_t d = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= D) return;
    const int64_t p0 = (int64_t)blockIdx.x * MT_EBW_ROWS;
    const int64_t p1 = p0 + MT_EBW_ROWS < N ? p0 + MT_EBW_ROWS : N;
    int64_t p = p0;
    if (p > 0) /* skip the tail of a segment that started in an earlier run */
        while (p < p1 && (keys[p] >> 32) == (keys[p0 - 1] >> 32)) p++;
    while (p < p1) {
        const uint64_t tok = keys[p] >> 32;
        const int64_t v = (int64_t)tok - v0;
        if (v < 0 || v >= V) { /* another chunk's token: pass its segment */
            while (p < N && (keys[p] >> 32) == tok) p++;
            continue;
        }
        float *dst = dtable + v * D + d;
        float acc = *dst;
        for (; p < N && (keys[p] >> 32) == tok; p++)
            acc = __fadd_rn(acc, __fmul_rn(scale, mt_ld(dout, (int64_t)(uint32_t)keys[p] * D + d)));
        *dst = acc;
    }
}

size_t mt_cuda_embedding_bwd_scratch(int64_t N) { /* one key per row, padded to a power of two (>= 2) */
    int64_t P = 2;
    while (P < N) P <<= 1;
    return N > 0 ? (size_t)P * sizeof(uint64_t) : 0;
}

mt_status mt_cuda_embedding_bwd(mt_backend *be, float *dtable, const void *dout, const int32_t *tokens, int64_t N,
                                int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "embedding_bwd", dt));
    if (N <= 0 || D <= 0 || V <= 0) return MT_OK;
    if (N > INT32_MAX)
        return mt_set_error(MT_ERR_INVALID, "cuda: embedding_bwd: %lld rows (at most 2^31 - 1)", (long long)N);
    const int64_t P = (int64_t)(mt_cuda_embedding_bwd_scratch(N) / sizeof(uint64_t));
    const int S = P < MT_EBW_TILE ? (int)P : MT_EBW_TILE;
    uint64_t *keys = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_EMBED, (size_t)P * sizeof(uint64_t), (void **)&keys));
    const unsigned tiles = (unsigned)(P / S);
    ebw_sort_tiles_kernel<<<tiles, S / 2>>>(keys, tokens, N);
    MT_CUDA_LAUNCHED(be, "ebw_sort_tiles_kernel");
    for (int64_t k = 2 * (int64_t)S; k <= P; k <<= 1) {
        for (int64_t j = k >> 1; j >= S; j >>= 1) {
            ebw_sort_stride_kernel<<<mt_cuda_blocks(P / 2, 256), 256>>>(keys, P / 2, k, j);
            MT_CUDA_LAUNCHED(be, "ebw_sort_stride_kernel");
        }
        ebw_sort_merge_kernel<<<tiles, S / 2>>>(keys, k);
        MT_CUDA_LAUNCHED(be, "ebw_sort_merge_kernel");
    }
    const dim3 grid((unsigned)((N + MT_EBW_ROWS - 1) / MT_EBW_ROWS), (unsigned)((D + MT_EBW_THREADS - 1) / MT_EBW_THREADS));
    MT_CUDA_DT_SWITCH(dt, T, ebw_sum_kernel<T><<<grid, MT_EBW_THREADS>>>(dtable, (const T *)dout, keys, N, v0, V, D,
                                                                    scale));
    MT_CUDA_LAUNCHED(be, "ebw_sum_kernel");
    return MT_OK;
}
