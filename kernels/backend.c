/* kernels/backend.c: the backend registry (kernels/backend.h).
 *
 * Lookup by the config's backend=auto|cpu|cuda. A build with CUDA (CMake's
 * MT_HAVE_CUDA) links kernels/cuda/cuda_backend.cu, which defines the CUDA backend's
 * constructor; without it the stub below answers "not built with CUDA". */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

mt_status mt_backend_kind_parse(const char *s, mt_backend_kind *out) {
    static const char *names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, names[i]) == 0) return *out = (mt_backend_kind)i, MT_OK;
    return mt_set_error(MT_ERR_INVALID, "backend '%s': expected one of auto, cpu, cuda", s ? s : "(null)");
}

mt_status mt_backend_create(mt_backend_kind kind, mt_backend **out) {
    *out = NULL;
    switch (kind) {
    case MT_BACKEND_CPU: return mt_cpu_backend_create(out);
    case MT_BACKEND_CUDA: return mt_cuda_backend_create(out);
    case MT_BACKEND_AUTO:
    default: return mt_cuda_backend_available() ? mt_cuda_backend_create(out) : mt_cpu_backend_create(out);
    }
}

mt_backend_caps mt_backend_kind_caps(mt_backend_kind kind) {
    switch (kind) {
    case MT_BACKEND_CPU: return mt_cpu_backend_caps();
    case MT_BACKEND_CUDA: return mt_cuda_backend_caps();
    case MT_BACKEND_AUTO:
    default: return mt_cuda_backend_available() ? mt_cuda_backend_caps() : mt_cpu_backend_caps();
    }
}

static mt_status arena_alloc(void *ctx, size_t bytes, void **out) {
    mt_backend *be = ctx;
    return be->ops->alloc(be, bytes, out);
}

static void arena_release(void *ctx, void *p) {
    mt_backend *be = ctx;
    (void)be->ops->release(be, p); /* a destroy path: nothing to report to */
}

mt_status mt_backend_arena_create(mt_backend *be, mt_arena *a, const mt_plan *p) {
    return mt_arena_create(a, p, arena_alloc, arena_release, be);
}

static mt_status host_arena_alloc(void *ctx, size_t bytes, void **out) {
    MT_TRY(mt_backend_host_alloc(ctx, bytes, out));
    memset(*out, 0, bytes);
    return MT_OK;
}

static void host_arena_release(void *ctx, void *p) { mt_backend_host_free(ctx, p); }

mt_status mt_backend_host_arena_create(mt_backend *be, mt_arena *a, const mt_plan *p) {
    return mt_arena_create(a, p, host_arena_alloc, host_arena_release, be);
}

void mt_backend_free(mt_backend *be) {
    if (be) be->ops->free(be);
}

mt_status mt_backend_bind_device(mt_backend_kind kind, int local_rank, int local_size) {
    if (kind == MT_BACKEND_CPU || (kind == MT_BACKEND_AUTO && !mt_cuda_backend_available())) return MT_OK;
    return mt_cuda_bind_device(local_rank, local_size);
}

int mt_backend_is_device_ptr(const mt_backend *be, const void *p) {
    return be && p && be->caps.device_memory && mt_cuda_is_device_ptr(p);
}

mt_status mt_backend_host_alloc(mt_backend *be, size_t bytes, void **out) {
    *out = be && be->caps.device_memory ? mt_cuda_host_alloc(bytes) : malloc(bytes ? bytes : 1);
    if (!*out) return mt_set_error(MT_ERR_OOM, "%s: cannot allocate %zu bytes of host memory", be ? be->name : "host",
                                   bytes);
    return MT_OK;
}

void mt_backend_host_free(mt_backend *be, void *p) {
    if (be && be->caps.device_memory)
        mt_cuda_host_free(p);
    else
        free(p);
}

/* The CUDA backend's capabilities, kept here (not in the .cu) so that start-up checks
 * made from the config give the same answer in every build, with or without CUDA.
 * multi_rank 1: the collectives take its buffers (NCCL, or staged through host memory:
 * parallel/comm.h); host_offload 1: the host pool is page-locked
 * (mt_backend_host_arena_create), which the kernels reach directly. */
mt_backend_caps mt_cuda_backend_caps(void) {
    mt_backend_caps c = {.device_memory = 1,
                         .compute_dtypes = (1u << MT_F32) | (1u << MT_BF16),
                         .grad_dtypes = (1u << MT_F32) | (1u << MT_BF16),
                         .peak_flops = 989e12,
                         .multi_rank = 1,
                         .host_offload = 1,
                         .workspace_bytes = (size_t)32 << 20};
    return c;
}

#ifndef MT_HAVE_CUDA
/* This build has no CUDA backend (CMake found no nvcc, or MESHTRAIN_CUDA=OFF). */
int mt_cuda_backend_available(void) { return 0; }

mt_status mt_cuda_backend_create(mt_backend **out) {
    *out = NULL;
    return mt_set_error(MT_ERR_UNSUPPORTED, "backend=cuda: meshtrain was not built with CUDA");
}

mt_status mt_cuda_bind_device(int local_rank, int local_size) {
    (void)local_rank;
    (void)local_size;
    return mt_set_error(MT_ERR_UNSUPPORTED, "backend=cuda: meshtrain was not built with CUDA");
}

int mt_cuda_is_device_ptr(const void *p) {
    (void)p;
    return 0;
}

void *mt_cuda_host_alloc(size_t bytes) {
    (void)bytes;
    return NULL;
}

void mt_cuda_host_free(void *p) { (void)p; }
#endif
