/* kernels/cuda/cuda_backend.cu: the CUDA backend object (op table + context), device
 * memory, the context's error state and scratch buffers.
 *
 * mt_cuda_backend_available() probes once (cudaGetDeviceCount); mt_cuda_backend_create
 * refuses with MT_ERR_UNSUPPORTED when no device is visible, so a CUDA build still runs
 * CPU-only. Memory is cudaMalloc'd (which aligns to at least 256 bytes, as ops.h asks).
 * Every op takes float32 or bfloat16 tensors (ops.h "Dtypes"; common.cuh mt_ld / mt_st),
 * bfloat16 only when caps.compute_dtypes lists it (mt_cuda_check_dtype). The
 * capabilities live in the registry (kernels/backend.c mt_cuda_backend_caps).
 * Not thread-safe: one host thread drives one device (one process per GPU). */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

static mt_cuda_ctx *ctx_of(mt_backend *be) { return (mt_cuda_ctx *)be->ctx; }

mt_status mt_cuda_fail(mt_backend *be, const char *what, const char *msg, int sticky) {
    mt_cuda_ctx *c = ctx_of(be);
    if (sticky && c->sticky == MT_OK) {
        c->sticky = MT_ERR_RUNTIME;
        snprintf(c->msg, sizeof c->msg, "cuda: %s: %s (an earlier device failure: the backend is unusable)", what,
                 msg);
    }
    return mt_set_error(MT_ERR_RUNTIME, "cuda: %s: %s", what, msg);
}

mt_status mt_cuda_check_dtype(const mt_backend *be, const char *op, mt_dtype dt) {
    if (dt == MT_F32 || (dt == MT_BF16 && mt_backend_has_dtype(&be->caps, MT_BF16))) return MT_OK;
    if (dt == MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "cuda: %s: dtype bfloat16 is not a compute dtype of this backend "
                            "(caps.compute_dtypes)", op);
    return mt_set_error(MT_ERR_INVALID, "cuda: %s: dtype %s (float32 or bfloat16 only)", op, mt_dtype_name(dt));
}

size_t mt_cuda_scratch_bytes(mt_backend *be, const mt_scratch_query *q) {
    (void)be;
    size_t m = mt_cuda_sumsq_scratch();
#define MT_SCRATCH_MAX(x)          \
    do {                           \
        const size_t b_ = (x);     \
        if (b_ > m) m = b_;        \
    } while (0)
    MT_SCRATCH_MAX(mt_cuda_rmsnorm_bwd_scratch(q->rows, q->width));
    MT_SCRATCH_MAX(mt_cuda_rmsnorm_bwd_scratch(q->rows * q->heads, q->head_dim)); /* q_norm */
    MT_SCRATCH_MAX(mt_cuda_rmsnorm_bwd_scratch(q->rows * q->kv_heads, q->head_dim)); /* k_norm */
    MT_SCRATCH_MAX(mt_cuda_embedding_bwd_scratch(q->rows));
    if (q->attn.B > 0) MT_SCRATCH_MAX(mt_cuda_attention_scratch(&q->attn));
    MT_SCRATCH_MAX(mt_cuda_xent_tile_scratch(q->loss_rows));
#undef MT_SCRATCH_MAX
    return m;
}

mt_status mt_cuda_scratch(mt_backend *be, int slot, size_t bytes, void **out) {
    mt_cuda_ctx *c = ctx_of(be);
    *out = NULL;
    if (c->ws) { /* the plan's workspace: the op's scratch lives there */
        if (bytes > c->ws_bytes)
            return mt_set_error(MT_ERR_INVALID, "cuda: an op needs %zu bytes of scratch but the bound workspace has "
                                "%zu (its plan was sized by scratch_bytes for smaller shapes)", bytes, c->ws_bytes);
        *out = c->ws;
        return MT_OK;
    }
    if (bytes <= c->scratch_bytes[slot]) {
        *out = c->scratch[slot];
        return MT_OK;
    }
    if (c->scratch[slot]) {
        MT_CUDA_TRY(be, cudaFree(c->scratch[slot]));
        c->scratch[slot] = NULL;
        c->scratch_bytes[slot] = 0;
    }
    size_t want = bytes + bytes / 4; /* room to grow a little without another malloc */
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation that did not fit is not sticky */
        return mt_set_error(MT_ERR_OOM, "cuda: cudaMalloc(scratch, %zu bytes): %s", want, cudaGetErrorString(e));
    }
    c->scratch[slot] = p;
    c->scratch_bytes[slot] = want;
    *out = p;
    return MT_OK;
}

static mt_status cu_alloc(mt_backend *be, size_t bytes, void **out) {
    *out = NULL;
    MT_CUDA_ENTER(be);
    void *p = NULL;
    if (bytes == 0) bytes = 256; /* a unique pointer that release() accepts */
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the non-sticky error */
        return mt_set_error(MT_ERR_OOM, "cuda: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    *out = p;
    return MT_OK;
}

static mt_status cu_release(mt_backend *be, void *p) {
    if (p) MT_CUDA_TRY(be, cudaFree(p));
    return MT_OK;
}

/* From pageable host memory (every caller's malloc'd buffers) cudaMemcpyAsync copies the
 * data into a staging buffer before it returns, without waiting for the device (CUDA
 * runtime API, "API synchronization behavior"): the host buffer may be reused at once,
 * as ops.h asks, and a step's input uploads never make the host wait
 * (tests/test_emu_syncs.c). Pinned memory would be read later by the copy engine, so
 * from it the copy is the synchronous cudaMemcpy. */
static mt_status cu_copy_to_device(mt_backend *be, void *dst, const void *src_host, size_t bytes) {
    MT_CUDA_ENTER(be);
    if (!bytes) return MT_OK;
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, src_host) != cudaSuccess) {
        (void)cudaGetLastError(); /* an unknown pointer: treat it as pinned (the safe copy) */
        at.type = cudaMemoryTypeHost;
    }
    /* cudaMemcpyDefault: dst is device memory or the page-locked host pool (ops.h
     * "Backend memory"); unified addressing tells the direction */
    if (at.type == cudaMemoryTypeUnregistered)
        MT_CUDA_TRY(be, cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyDefault, 0));
    else
        MT_CUDA_TRY(be, cudaMemcpy(dst, src_host, bytes, cudaMemcpyDefault));
    return MT_OK;
}

/* cudaMemcpyDefault in the copies below: either side may be the page-locked host pool. */
static mt_status cu_copy_to_host(mt_backend *be, void *dst_host, const void *src, size_t bytes) {
    MT_CUDA_ENTER(be);
    if (bytes) MT_CUDA_TRY(be, cudaMemcpy(dst_host, src, bytes, cudaMemcpyDefault));
    return MT_OK;
}

static mt_status cu_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    MT_CUDA_ENTER(be);
    if (bytes && dst != src) MT_CUDA_TRY(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, 0));
    return MT_OK;
}

/* Zero bytes [0, n) of p: the page-locked host pool, which cudaMemset does not take. */
__global__ void zero_bytes_kernel(unsigned char *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0;
}

static mt_status cu_zero(mt_backend *be, void *p, size_t bytes) {
    MT_CUDA_ENTER(be);
    if (!bytes) return MT_OK;
    if (mt_cuda_is_device_ptr(p)) {
        MT_CUDA_TRY(be, cudaMemsetAsync(p, 0, bytes, 0));
    } else { /* the host pool: written in stream order through unified addressing */
        const size_t blocks = (bytes + 255) / 256 < 1024 ? (bytes + 255) / 256 : 1024;
        zero_bytes_kernel<<<(unsigned)blocks, 256>>>((unsigned char *)p, bytes);
        MT_CUDA_TRY(be, cudaGetLastError());
    }
    return MT_OK;
}

static mt_status cu_sync(mt_backend *be) {
    MT_CUDA_ENTER(be);
    MT_CUDA_TRY(be, cudaDeviceSynchronize());
    return MT_OK;
}

static void cu_free(mt_backend *be) {
    if (!be) return;
    mt_cuda_ctx *c = ctx_of(be);
    for (int i = 0; i < MT_CUDA_SCRATCH_COUNT; i++)
        if (c->scratch[i]) (void)cudaFree(c->scratch[i]);
    free(c);
    free(be);
}

/* The compute stream (a cudaStream_t; declared for C in parallel/comm_nccl.h): the
 * stream every op above is queued on, today the legacy default stream (0). The NCCL
 * backend orders its communication stream against it with events (comm.h). */
extern "C" void *mt_cuda_compute_stream(void) { return (void *)(cudaStream_t)0; }

static mt_status cu_set_workspace(mt_backend *be, void *ws, size_t bytes) {
    if (bytes > 0 && !ws) return mt_set_error(MT_ERR_INVALID, "cuda: set_workspace: %zu bytes at NULL", bytes);
    mt_cuda_ctx *c = ctx_of(be);
    c->ws = bytes > 0 ? ws : NULL;
    c->ws_bytes = bytes;
    return MT_OK;
}

static mt_ops make_table(void) {
    mt_ops t;
    t.free = cu_free;
    t.alloc = cu_alloc;
    t.release = cu_release;
    t.copy_to_device = cu_copy_to_device;
    t.copy_to_host = cu_copy_to_host;
    t.copy = cu_copy;
    t.zero = cu_zero;
    t.sync = cu_sync;
    t.set_workspace = cu_set_workspace;
    t.scratch_bytes = mt_cuda_scratch_bytes;
    t.gemm = mt_cuda_gemm;
    t.embedding_fwd = mt_cuda_embedding_fwd;
    t.embedding_bwd = mt_cuda_embedding_bwd;
    t.rmsnorm_fwd = mt_cuda_rmsnorm_fwd;
    t.add_rmsnorm_fwd = mt_cuda_add_rmsnorm_fwd;
    t.rmsnorm_bwd = mt_cuda_rmsnorm_bwd;
    t.rope_fwd = mt_cuda_rope_fwd;
    t.rope_bwd = mt_cuda_rope_bwd;
    t.attention_fwd = mt_cuda_attention_fwd;
    t.attention_bwd = mt_cuda_attention_bwd;
    t.attn_merge = mt_cuda_attn_merge;
    t.glu_fwd = mt_cuda_glu_fwd;
    t.glu_bwd = mt_cuda_glu_bwd;
    t.xent_tile = mt_cuda_xent_tile;
    t.vocab_tile_max = mt_cuda_vocab_tile_max;
    t.vocab_tile_sumexp = mt_cuda_vocab_tile_sumexp;
    t.vocab_tile_grad = mt_cuda_vocab_tile_grad;
    t.axpy = mt_cuda_axpy;
    t.scale = mt_cuda_scale;
    t.sumsq = mt_cuda_sumsq;
    t.grad_accumulate = mt_cuda_grad_accumulate;
    t.to_f32 = mt_cuda_to_f32;
    t.from_f32 = mt_cuda_from_f32;
    t.adamw = mt_cuda_adamw;
    return t;
}

static const mt_ops mt_cuda_ops_table = make_table();

extern "C" int mt_cuda_backend_available(void) {
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
    return usable;
}

extern "C" mt_status mt_cuda_bind_device(int local_rank, int local_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return mt_set_error(MT_ERR_UNSUPPORTED, "backend=cuda: no CUDA device is visible");
    }
    if (local_size > n) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return mt_set_error(MT_ERR_INVALID, "%d ranks run on this node but it has %d visible CUDA device%s%s%s%s: "
                            "start at most %d ranks per node (one process per GPU)", local_size, n, n == 1 ? "" : "s",
                            vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "", n);
    }
    const int dev = local_rank < 0 ? 0 : local_rank;
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mt_set_error(MT_ERR_RUNTIME, "cudaSetDevice(%d) (node-local rank %d): %s", dev, local_rank,
                            cudaGetErrorString(e));
    }
    return MT_OK;
}

extern "C" int mt_cuda_is_device_ptr(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

extern "C" void *mt_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void mt_cuda_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}

extern "C" mt_status mt_cuda_backend_create(mt_backend **out) {
    *out = NULL;
    if (!mt_cuda_backend_available())
        return mt_set_error(MT_ERR_UNSUPPORTED, "backend=cuda: no CUDA device is visible");
    mt_backend *be = (mt_backend *)calloc(1, sizeof *be);
    mt_cuda_ctx *c = (mt_cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return mt_set_error(MT_ERR_OOM, "cuda: out of host memory for the backend");
    }
    be->ops = &mt_cuda_ops_table;
    be->ctx = c;
    be->caps = mt_cuda_backend_caps();
    be->name = "cuda";
    *out = be;
    return MT_OK;
}
