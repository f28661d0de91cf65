/* kernels/backend.h: the backend object and its registry (op table + context +
 * capabilities; chosen at start-up by backend=auto|cpu|cuda).
 *
 * A backend is an object in ggml's shape (ggml-backend-impl.h: an `iface` table of
 * functions plus a `context`): mt_backend holds its op table (kernels/ops.h), a
 * context private to the backend (the CUDA backend keeps its sticky error state and
 * scratch buffers there) and its capabilities. Nobody compares backend names: code
 * that depends on what a backend can do reads mt_backend_caps. The name is for
 * messages only.
 *
 * Lifetime: mt_backend_create gives a new object that the caller releases with
 * mt_backend_free after every buffer it allocated was released. */
#ifndef MT_KERNELS_BACKEND_H
#define MT_KERNELS_BACKEND_H

#include <stdint.h>

#include "kernels/ops.h"
#include "runtime/plan.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend can do. */
typedef struct mt_backend_caps {
    /* 1: buffers from alloc are not host-addressable (only ops and the copies may
     * touch them); 0: they are plain host memory. */
    int device_memory;
    /* Bit (1u << mt_dtype) set for each dtype the backend computes in: the `dtype` of
     * activations and compute weights (float32 and bfloat16 on both backends). */
    uint32_t compute_dtypes;
    /* Bit (1u << mt_dtype) for each grad_dtype its gradient accumulation supports
     * (grad_accumulate / to_f32: float32 and bfloat16 on both). */
    uint32_t grad_dtypes;
    /* Nominal dense peak FLOP/s of one device, for MFU (metrics.jsonl "mfu"): 989e12
     * for CUDA (H100/H200 SXM bf16 dense, NVIDIA H100 Tensor
     * Core GPU datasheet); 0 when none is stated (the
     * CPU: a nominal CPU peak would make the number meaningless), which makes MFU NaN. */
    double peak_flops;
    /* 1: the trainer may run it with more than one rank (its optimizer, checkpoint and
     * gradient collectives work on its buffers). */
    int multi_rank;
    /* 1: parameter_memory_host_offload / optimizer_memory_host_offload run on it. */
    int host_offload;
    /* Bytes of GEMM workspace the backend wants in the plan (ops.h set_workspace): 32 MiB
     * for CUDA (cuBLASLt), 0 for the CPU. */
    size_t workspace_bytes;
} mt_backend_caps;

/* The backend object (fields read by callers; only the backend writes them). */
struct mt_backend {
    const mt_ops *ops;    /* the op table (kernels/ops.h); never NULL */
    void *ctx;            /* the backend's private context (NULL for the CPU) */
    mt_backend_caps caps;
    const char *name;     /* "cpu" or "cuda": for messages only */
};

/* Which backend to create (the config's backend=auto|cpu|cuda). */
typedef enum mt_backend_kind {
    MT_BACKEND_AUTO = 0, /* cuda when this build has it and a device is visible, else cpu */
    MT_BACKEND_CPU = 1,
    MT_BACKEND_CUDA = 2
} mt_backend_kind;

/* Parse "auto" | "cpu" | "cuda". Errors: MT_ERR_INVALID naming the allowed values. */
mt_status mt_backend_kind_parse(const char *s, mt_backend_kind *out);

/* *out = a new backend of `kind`. Errors: MT_ERR_UNSUPPORTED for cuda when this build
 * has no CUDA backend ("not built with CUDA") or no device is visible; MT_ERR_OOM. */
mt_status mt_backend_create(mt_backend_kind kind, mt_backend **out);

/* The capabilities `kind` would have, without creating it or touching a device (for
 * start-up checks made from the config alone). AUTO answers for the backend that
 * mt_backend_create would pick, which probes for a device. */
mt_backend_caps mt_backend_kind_caps(mt_backend_kind kind);

/* Release a backend from mt_backend_create (NULL is a no-op). */
void mt_backend_free(mt_backend *be);

/* Bind this process to its device before the backend of `kind` is created: one process
 * per GPU, the node's ranks local_rank = 0..local_size-1 (parallel/comm.h
 * mt_comm_local_rank/_size) taking devices 0..local_size-1 of those visible
 * (cudaSetDevice(local_rank); CUDA_VISIBLE_DEVICES narrows them as usual). The CPU (and
 * AUTO when it picks the CPU) binds nothing. Call it before any other CUDA call of the
 * process (the first device allocation creates the context on the current device).
 * Errors: MT_ERR_INVALID when local_size exceeds the visible devices, naming both
 * counts; MT_ERR_UNSUPPORTED as mt_backend_create (no CUDA, no device);
 * MT_ERR_RUNTIME (cudaSetDevice failed, CUDA's text). */
mt_status mt_backend_bind_device(mt_backend_kind kind, int local_rank, int local_size);

/* 1 when p points into memory that host code must not touch (device memory:
 * cudaPointerGetAttributes says cudaMemoryTypeDevice); 0 for host, pinned and managed
 * memory, for every pointer of a backend without caps.device_memory, and for NULL. */
int mt_backend_is_device_ptr(const mt_backend *be, const void *p);

/* *out = `bytes` of host memory that be's copy_to_host / copy_to_device move fastest:
 * page-locked (cudaMallocHost) on a backend with caps.device_memory, plain malloc
 * otherwise (the staging buffers of parallel/comm.h). Free with mt_backend_host_free.
 * Errors: MT_ERR_OOM naming the size (*out = NULL). */
mt_status mt_backend_host_alloc(mt_backend *be, size_t bytes, void **out);
/* Release memory from mt_backend_host_alloc of the same be (NULL is a no-op). */
void mt_backend_host_free(mt_backend *be, void *p);

/* mt_arena_create with the backend's alloc and release (runtime/plan.h): the arena
 * of plan p in be's memory. mt_arena_destroy releases it through be, so be must
 * outlive the arena. Errors: those of mt_arena_create and be->ops->alloc. */
mt_status mt_backend_arena_create(mt_backend *be, mt_arena *a, const mt_plan *p);

/* The arena of plan p in be's host memory (mt_backend_host_alloc), zero-filled: the
 * host pool of parameter, optimizer and activation offload. On a backend with device
 * memory it is page-locked, so copies to and from it are DMA and the backend's kernels
 * read and write it in place (CUDA unified addressing: memory from cudaMallocHost is
 * directly accessible from every device; CUDA Runtime API, "Unified Addressing"), as
 * AdamW does on offloaded moments and master weights. be must outlive the arena.
 * Errors: those of mt_arena_create and mt_backend_host_alloc. */
mt_status mt_backend_host_arena_create(mt_backend *be, mt_arena *a, const mt_plan *p);

/* 1 when the backend computes in dtype t (caps.compute_dtypes). */
static inline int mt_backend_has_dtype(const mt_backend_caps *c, mt_dtype t) {
    return (c->compute_dtypes >> (unsigned)t) & 1u;
}

/* ---- for backend implementations and the registry ---- */

/* The CPU backend (kernels/cpu/cpu_backend.c): C11 + OpenMP + CBLAS; never fails
 * except MT_ERR_OOM. */
mt_status mt_cpu_backend_create(mt_backend **out);
mt_backend_caps mt_cpu_backend_caps(void);
/* The CPU backend has no context, so one process-wide object serves every caller:
 * never NULL, mt_backend_free on it is a no-op. mt_cpu_backend_create returns it. */
mt_backend *mt_cpu_backend(void);
/* The CUDA backend's parts of mt_backend_bind_device, mt_backend_is_device_ptr and
 * mt_backend_host_alloc (kernels/cuda/cuda_backend.cu; stubs in kernels/backend.c
 * without CUDA). */
mt_status mt_cuda_bind_device(int local_rank, int local_size);
int mt_cuda_is_device_ptr(const void *p);
void *mt_cuda_host_alloc(size_t bytes); /* cudaMallocHost; NULL on failure */
void mt_cuda_host_free(void *p);

/* The CUDA backend (kernels/cuda/cuda_backend.cu when built with CUDA, else the
 * registry's stub in kernels/backend.c). mt_cuda_backend_available: 1 when this build
 * has CUDA and a device is visible (probed once per process). Create errors:
 * MT_ERR_UNSUPPORTED (not built with CUDA, no device), MT_ERR_OOM. */
int mt_cuda_backend_available(void);
mt_status mt_cuda_backend_create(mt_backend **out);
mt_backend_caps mt_cuda_backend_caps(void);

#ifdef __cplusplus
}
#endif
#endif
