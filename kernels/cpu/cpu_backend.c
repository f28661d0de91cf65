/* kernels/cpu/cpu_backend.c: the CPU op table and its host-memory functions.
 *
 * Memory is plain host memory from aligned_alloc (256-byte aligned, as ops.h asks of
 * every backend, so vector loads and cache lines never straddle an allocation's start).
 * "Device" copies are memcpy and sync is a no-op: the CPU runs each op to completion
 * before returning. The op implementations live one group per file next to this one. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_ALIGN ((size_t)256)

void *mt_cpu_alloc(size_t bytes) {
    /* C11 aligned_alloc wants a size that is a multiple of the alignment; a request of
     * 0 bytes still returns a unique pointer that release() accepts. */
    size_t rounded = (bytes + MT_CPU_ALIGN - 1) / MT_CPU_ALIGN * MT_CPU_ALIGN;
    if (rounded < bytes) return NULL; /* overflow */
    if (rounded == 0) rounded = MT_CPU_ALIGN;
    return aligned_alloc(MT_CPU_ALIGN, rounded);
}

void mt_cpu_release(void *p) { free(p); }

void mt_cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes > 0 && dst != src) memmove(dst, src, bytes);
}

void mt_cpu_zero(void *p, size_t bytes) {
    if (bytes > 0) memset(p, 0, bytes);
}

void mt_cpu_sync(void) {}

static const mt_ops mt_cpu_ops_table = {
    .name = "cpu",
    .alloc = mt_cpu_alloc,
    .release = mt_cpu_release,
    .copy_to_device = mt_cpu_copy,
    .copy_to_host = mt_cpu_copy,
    .copy = mt_cpu_copy,
    .zero = mt_cpu_zero,
    .sync = mt_cpu_sync,
    .gemm = mt_cpu_gemm,
    .embedding_fwd = mt_cpu_embedding_fwd,
    .embedding_bwd = mt_cpu_embedding_bwd,
    .rmsnorm_fwd = mt_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = mt_cpu_rmsnorm_bwd,
    .rope_fwd = mt_cpu_rope_fwd,
    .rope_bwd = mt_cpu_rope_bwd,
    .attention_fwd = mt_cpu_attention_fwd,
    .attention_bwd = mt_cpu_attention_bwd,
    .glu_fwd = mt_cpu_glu_fwd,
    .glu_bwd = mt_cpu_glu_bwd,
    .xent_tile = mt_cpu_xent_tile,
    .axpy = mt_cpu_axpy,
    .scale = mt_cpu_scale,
    .sumsq = mt_cpu_sumsq,
    .adamw = mt_cpu_adamw,
};

const mt_ops *mt_cpu_ops(void) { return &mt_cpu_ops_table; }

#ifndef MT_HAVE_CUDA
/* This build has no CUDA backend (CMake found no nvcc). */
const mt_ops *mt_cuda_ops(void) { return NULL; }
#endif
