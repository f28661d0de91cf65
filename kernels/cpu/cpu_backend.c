/* kernels/cpu/cpu_backend.c: the CPU backend object, its op table and its host-memory
 * functions.
 *
 * Memory is plain host memory from aligned_alloc (256-byte aligned, as ops.h asks of
 * every backend, so vector loads and cache lines never straddle an allocation's start).
 * "Device" copies are memcpy and sync is a no-op: the CPU runs each op to completion
 * before returning. The CPU backend has no context (no streams, no scratch, nothing
 * sticky: an op fails only on an invalid argument), so one process-wide object serves
 * every caller and mt_backend_free on it does nothing. The op implementations live one
 * group per file next to this one. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_ALIGN ((size_t)256)

mt_status mt_cpu_alloc(mt_backend *be, size_t bytes, void **out) {
    (void)be;
    *out = NULL;
    /* C11 aligned_alloc wants a size that is a multiple of the alignment; a request of
     * 0 bytes still returns a unique pointer that release() accepts. */
    size_t rounded = (bytes + MT_CPU_ALIGN - 1) / MT_CPU_ALIGN * MT_CPU_ALIGN;
    if (rounded < bytes) return mt_set_error(MT_ERR_OOM, "cpu: alloc of %zu bytes overflows", bytes);
    if (rounded == 0) rounded = MT_CPU_ALIGN;
    *out = aligned_alloc(MT_CPU_ALIGN, rounded);
    if (!*out) return mt_set_error(MT_ERR_OOM, "cpu: out of memory allocating %zu bytes", bytes);
    /* MT_CPU_POISON=1 (the tests): every byte 0xFF, a NaN in fp32 and bf16, so that a
     * buffer read before it is written shows in the results (the CUDA emulator's device
     * memory is poisoned the same way); fresh pages would read as zeros otherwise */
    const char *poison = getenv("MT_CPU_POISON");
    if (poison && poison[0] == '1') memset(*out, 0xFF, rounded);
    return MT_OK;
}

mt_status mt_cpu_release(mt_backend *be, void *p) {
    (void)be;
    free(p);
    return MT_OK;
}

mt_status mt_cpu_copy(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes > 0 && dst != src) memmove(dst, src, bytes);
    return MT_OK;
}

mt_status mt_cpu_zero(mt_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes > 0) memset(p, 0, bytes);
    return MT_OK;
}

mt_status mt_cpu_sync(mt_backend *be) {
    (void)be;
    return MT_OK;
}

/* The CPU's gemm needs no workspace (caps.workspace_bytes 0; its bf16 operands are
 * widened in a fixed per-thread scratch, kernels/cpu/gemm.c): accepted and unused. */
mt_status mt_cpu_set_workspace(mt_backend *be, void *ws, size_t bytes) {
    (void)be;
    if (bytes > 0 && !ws) return mt_set_error(MT_ERR_INVALID, "cpu: set_workspace: %zu bytes at NULL", bytes);
    return MT_OK;
}

/* The CPU ops' temporaries are per-thread host buffers of their own (no device scratch). */
static size_t cpu_scratch_bytes(mt_backend *be, const mt_scratch_query *q) {
    (void)be;
    (void)q;
    return 0;
}

static void cpu_free(mt_backend *be) { (void)be; /* the process-wide object stays */ }

static const mt_ops mt_cpu_ops_table = {
    .free = cpu_free,
    .alloc = mt_cpu_alloc,
    .release = mt_cpu_release,
    .copy_to_device = mt_cpu_copy,
    .copy_to_host = mt_cpu_copy,
    .copy = mt_cpu_copy,
    .zero = mt_cpu_zero,
    .sync = mt_cpu_sync,
    .set_workspace = mt_cpu_set_workspace,
    .scratch_bytes = cpu_scratch_bytes,
    .gemm = mt_cpu_gemm,
    .embedding_fwd = mt_cpu_embedding_fwd,
    .embedding_bwd = mt_cpu_embedding_bwd,
    .rmsnorm_fwd = mt_cpu_rmsnorm_fwd,
    .add_rmsnorm_fwd = mt_cpu_add_rmsnorm_fwd,
    .rmsnorm_bwd = mt_cpu_rmsnorm_bwd,
    .rope_fwd = mt_cpu_rope_fwd,
    .rope_bwd = mt_cpu_rope_bwd,
    .attention_fwd = mt_cpu_attention_fwd,
    .attention_bwd = mt_cpu_attention_bwd,
    .attn_merge = mt_cpu_attn_merge,
    .glu_fwd = mt_cpu_glu_fwd,
    .glu_bwd = mt_cpu_glu_bwd,
    .xent_tile = mt_cpu_xent_tile,
    .vocab_tile_max = mt_cpu_vocab_tile_max,
    .vocab_tile_sumexp = mt_cpu_vocab_tile_sumexp,
    .vocab_tile_grad = mt_cpu_vocab_tile_grad,
    .axpy = mt_cpu_axpy,
    .scale = mt_cpu_scale,
    .sumsq = mt_cpu_sumsq,
    .grad_accumulate = mt_cpu_grad_accumulate,
    .to_f32 = mt_cpu_to_f32,
    .from_f32 = mt_cpu_from_f32,
    .adamw = mt_cpu_adamw,
};

/* Host memory; float32 and bfloat16 compute; peak FLOP/s unknown (MFU is NaN on the CPU). */
#define MT_CPU_CAPS                                                                       \
    {.device_memory = 0, .compute_dtypes = (1u << MT_F32) | (1u << MT_BF16),              \
     .grad_dtypes = (1u << MT_F32) | (1u << MT_BF16), .peak_flops = 0.0, .multi_rank = 1, \
     .host_offload = 1}

mt_backend_caps mt_cpu_backend_caps(void) {
    const mt_backend_caps c = MT_CPU_CAPS;
    return c;
}

mt_backend *mt_cpu_backend(void) {
    static mt_backend be = {.ops = &mt_cpu_ops_table, .ctx = NULL, .caps = MT_CPU_CAPS, .name = "cpu"};
    return &be;
}

mt_status mt_cpu_backend_create(mt_backend **out) {
    *out = mt_cpu_backend();
    return MT_OK;
}
