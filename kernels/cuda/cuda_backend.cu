/* kernels/cuda/cuda_backend.cu: the CUDA op table, device memory, error state and the
 * internal scratch buffers.
 *
 * mt_cuda_ops() probes once (cudaGetDeviceCount) and returns NULL when no device is
 * visible, so a CUDA build still runs CPU-only. Memory is cudaMalloc'd (which aligns to
 * at least 256 bytes, as ops.h asks). The table is fp32 end to end, like the CPU
 * backend it is tested against; bf16 compute weights and activations (issue 4) are a
 * later step that adds entries, not a change to these.
 * Not thread-safe: one host thread drives one device (one process per GPU). */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

static int g_failed = 0;

void mt_cuda_fail(const char *file, int line, const char *what, const char *msg) {
    g_failed = 1;
    mt_set_error(MT_ERR_RUNTIME, "cuda: %s failed at %s:%d: %s", what, file, line, msg);
}

int mt_cuda_failed(void) { return g_failed; }

static void *g_scratch[MT_CUDA_SCRATCH_COUNT];
static size_t g_scratch_bytes[MT_CUDA_SCRATCH_COUNT];

void *mt_cuda_scratch(int slot, size_t bytes) {
    if (bytes <= g_scratch_bytes[slot]) return g_scratch[slot];
    if (g_scratch[slot]) {
        MT_CUDA_CHECK(cudaFree(g_scratch[slot]));
        g_scratch[slot] = NULL;
        g_scratch_bytes[slot] = 0;
    }
    size_t want = bytes + bytes / 4; /* room to grow a little without another malloc */
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        mt_cuda_fail(__FILE__, __LINE__, "cudaMalloc(scratch)", cudaGetErrorString(e));
        return NULL;
    }
    g_scratch[slot] = p;
    g_scratch_bytes[slot] = want;
    return p;
}

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 256; /* a unique pointer that release() accepts */
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        /* OOM is the caller's to report (mt_arena_create returns MT_ERR_OOM) */
        mt_set_error(MT_ERR_OOM, "cuda: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* clear the non-sticky error */
        return NULL;
    }
    return p;
}

static void cu_release(void *p) {
    if (p) MT_CUDA_CHECK(cudaFree(p));
}

static void cu_copy_to_device(void *dst, const void *src_host, size_t bytes) {
    if (bytes) MT_CUDA_CHECK(cudaMemcpy(dst, src_host, bytes, cudaMemcpyHostToDevice));
}

static void cu_copy_to_host(void *dst_host, const void *src, size_t bytes) {
    if (bytes) MT_CUDA_CHECK(cudaMemcpy(dst_host, src, bytes, cudaMemcpyDeviceToHost));
}

static void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

static void cu_zero(void *p, size_t bytes) {
    if (bytes) MT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
}

static void cu_sync(void) { MT_CUDA_CHECK(cudaDeviceSynchronize()); }

/* The compute stream (a cudaStream_t; declared for C in parallel/comm_nccl.h): the
 * stream every op above is queued on, today the legacy default stream (0). The NCCL
 * backend orders its communication stream against it with events (comm.h). */
extern "C" void *mt_cuda_compute_stream(void) { return (void *)(cudaStream_t)0; }

static const mt_ops mt_cuda_ops_table = {
    "cuda",
    cu_alloc,
    cu_release,
    cu_copy_to_device,
    cu_copy_to_host,
    cu_copy,
    cu_zero,
    cu_sync,
    mt_cuda_gemm,
    mt_cuda_embedding_fwd,
    mt_cuda_embedding_bwd,
    mt_cuda_rmsnorm_fwd,
    mt_cuda_rmsnorm_bwd,
    mt_cuda_rope_fwd,
    mt_cuda_rope_bwd,
    mt_cuda_attention_fwd,
    mt_cuda_attention_bwd,
    mt_cuda_glu_fwd,
    mt_cuda_glu_bwd,
    mt_cuda_xent_tile,
    mt_cuda_axpy,
    mt_cuda_scale,
    mt_cuda_sumsq,
    mt_cuda_adamw,
};

extern "C" const mt_ops *mt_cuda_ops(void) {
    static int probed = 0, usable = 0;
    if (!probed) {
        probed = 1;
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e == cudaSuccess && n > 0) {
            usable = 1;
        } else {
            (void)cudaGetLastError();
        }
    }
    return usable ? &mt_cuda_ops_table : NULL;
}
