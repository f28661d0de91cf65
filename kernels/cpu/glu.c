/* kernels/cpu/glu.c: the gated MLP activation, h = act(gate) * up, and its VJP.
 *
 * SwiGLU (Llama): silu(g) = g * sigmoid(g), silu'(g) = s (1 + g (1 - s)).
 * GeGLU (Gemma, HF "gelu_pytorch_tanh"): gelu(g) = g/2 (1 + tanh(u)),
 *   u = sqrt(2/pi) (g + 0.044715 g^3),
 *   gelu'(g) = (1 + t)/2 + g/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2), t = tanh(u).
 * One elementwise pass per call, in fixed blocks across threads; exp and tanh come from
 * vmath.h so the loop vectorises, 8-wide in the AVX2 clone (MT_CPU_SIMD_CLONES).
 * bf16 (cpu_dtype.h): a block is done in pieces of MT_GLU_WIDE elements, each input
 * widened into fp32 on the stack, computed by the same block function and each output
 * rounded once (a piece's inputs are all loaded before its outputs are stored, so the
 * backward may run in place). */
#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vmath.h"

#define MT_CPU_PAR_MIN ((int64_t)16384)
#define MT_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define MT_GELU_C 0.044715f

#define MT_GLU_BLOCK ((int64_t)4096) /* elements per work item */
#define MT_GLU_WIDE ((int64_t)512)   /* bf16 elements widened at once (5 x 2 KiB of stack) */

/* Elements [0, n) of the forward (MT_CPU_SIMD_CLONES: 8-wide where the CPU has AVX2). */
MT_CPU_SIMD_CLONES
static void glu_fwd_block(float *restrict h, const float *restrict gate, const float *restrict up,
                          int64_t n, mt_activation act) {
    if (act == MT_ACT_SILU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            h[i] = g / (1.0f + mt_vexpf(-g)) * up[i];
        }
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float t = mt_vtanhf(MT_GELU_K * (g + MT_GELU_C * g * g * g));
            h[i] = 0.5f * g * (1.0f + t) * up[i];
        }
    }
}

/* Elements [0, n) of the backward. In place allowed (ops.h glu_bwd): dgate may be gate
 * and dup may be up, so neither pair is restrict; each element's inputs are read before
 * its outputs are written, and omp simd (no loop-carried dependence) still vectorises. */
MT_CPU_SIMD_CLONES
static void glu_bwd_block(float *dgate, float *dup, const float *restrict dh, const float *gate,
                          const float *up, int64_t n, mt_activation act) {
    if (act == MT_ACT_SILU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float s = 1.0f / (1.0f + mt_vexpf(-g));
            const float a = g * s;
            const float da = s * (1.0f + g * (1.0f - s));
            dgate[i] = dh[i] * up[i] * da;
            dup[i] = dh[i] * a;
        }
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float g2 = g * g;
            const float t = mt_vtanhf(MT_GELU_K * (g + MT_GELU_C * g2 * g));
            const float a = 0.5f * g * (1.0f + t);
            const float da = 0.5f * (1.0f + t) +
                             0.5f * g * (1.0f - t * t) * MT_GELU_K * (1.0f + 3.0f * MT_GELU_C * g2);
            dgate[i] = dh[i] * up[i] * da;
            dup[i] = dh[i] * a;
        }
    }
}

/* Elements [i0, i0 + n) of the forward for tensors of dt. */
static void glu_fwd_range(void *h, const void *gate, const void *up, int64_t i0, int64_t n, mt_activation act,
                          mt_dtype dt) {
    if (dt == MT_F32) {
        glu_fwd_block((float *)h + i0, (const float *)gate + i0, (const float *)up + i0, n, act);
        return;
    }
    float hw[MT_GLU_WIDE], gw[MT_GLU_WIDE], uw[MT_GLU_WIDE];
    for (int64_t j = i0; j < i0 + n; j += MT_GLU_WIDE) {
        const int64_t m = i0 + n - j < MT_GLU_WIDE ? i0 + n - j : MT_GLU_WIDE;
        mt_cpu_load(gw, gate, j, m, dt);
        mt_cpu_load(uw, up, j, m, dt);
        glu_fwd_block(hw, gw, uw, m, act);
        mt_cpu_store(h, j, hw, m, dt);
    }
}

/* Elements [i0, i0 + n) of the backward for tensors of dt. */
static void glu_bwd_range(void *dgate, void *dup, const void *dh, const void *gate, const void *up, int64_t i0,
                          int64_t n, mt_activation act, mt_dtype dt) {
    if (dt == MT_F32) {
        glu_bwd_block((float *)dgate + i0, (float *)dup + i0, (const float *)dh + i0, (const float *)gate + i0,
                      (const float *)up + i0, n, act);
        return;
    }
    float dgw[MT_GLU_WIDE], duw[MT_GLU_WIDE], dhw[MT_GLU_WIDE], gw[MT_GLU_WIDE], uw[MT_GLU_WIDE];
    for (int64_t j = i0; j < i0 + n; j += MT_GLU_WIDE) {
        const int64_t m = i0 + n - j < MT_GLU_WIDE ? i0 + n - j : MT_GLU_WIDE;
        mt_cpu_load(dhw, dh, j, m, dt);
        mt_cpu_load(gw, gate, j, m, dt);
        mt_cpu_load(uw, up, j, m, dt);
        glu_bwd_block(dgw, duw, dhw, gw, uw, m, act);
        mt_cpu_store(dgate, j, dgw, m, dt);
        mt_cpu_store(dup, j, duw, m, dt);
    }
}

mt_status mt_cpu_glu_fwd(mt_backend *be, void *h, const void *gate, const void *up, int64_t count,
                         mt_activation act, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("glu_fwd", dt));
    const int64_t nblk = (count + MT_GLU_BLOCK - 1) / MT_GLU_BLOCK;
#pragma omp parallel for schedule(static) if (count >= MT_CPU_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t i0 = b * MT_GLU_BLOCK, n = count - i0 < MT_GLU_BLOCK ? count - i0 : MT_GLU_BLOCK;
        glu_fwd_range(h, gate, up, i0, n, act, dt);
    }
    return MT_OK;
}

mt_status mt_cpu_glu_bwd(mt_backend *be, void *dgate, void *dup, const void *dh, const void *gate, const void *up,
                         int64_t count, mt_activation act, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("glu_bwd", dt));
    const int64_t nblk = (count + MT_GLU_BLOCK - 1) / MT_GLU_BLOCK;
#pragma omp parallel for schedule(static) if (count >= MT_CPU_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t i0 = b * MT_GLU_BLOCK, n = count - i0 < MT_GLU_BLOCK ? count - i0 : MT_GLU_BLOCK;
        glu_bwd_range(dgate, dup, dh, gate, up, i0, n, act, dt);
    }
    return MT_OK;
}
