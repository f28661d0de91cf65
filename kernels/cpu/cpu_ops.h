/* kernels/cpu/cpu_ops.h: the CPU backend's op functions (private to kernels/cpu/).
 *
 * Each function implements the mt_ops entry of the same name; shapes, dtypes and the
 * math are documented once, in kernels/ops.h. cpu_backend.c assembles them into the
 * backend object of mt_cpu_backend(). Each takes the backend first (unused: the CPU
 * backend has no context) and returns MT_OK unless an argument is invalid. Threading is OpenMP inside each op; no op calls
 * CBLAS from inside a parallel region (OpenBLAS's own threads would oversubscribe).
 * Every reduction has an order fixed by the shapes alone, never by the thread count. */
#ifndef MT_KERNELS_CPU_CPU_OPS_H
#define MT_KERNELS_CPU_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "kernels/ops.h"

/* MT_CPU_SIMD_CLONES on a hot loop function: GCC also compiles an AVX2 clone of it and
 * picks one at load time from the CPU (the library itself is built for baseline x86-64,
 * i.e. 4-wide SSE2). "avx2" does not include FMA and ISO C mode keeps products and sums
 * unfused, so each lane computes the same bits in both clones; only omp simd reductions,
 * whose lane count changes, may round differently, and the clone depends on the CPU
 * alone, never on the thread count. Put it on a function that an OpenMP region calls,
 * not on one that contains the region: the outlined region body is not cloned. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MT_CPU_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MT_CPU_SIMD_CLONES
#endif

/* memory (cpu_backend.c) */
mt_status mt_cpu_alloc(mt_backend *be, size_t bytes, void **out);
mt_status mt_cpu_release(mt_backend *be, void *p);
mt_status mt_cpu_copy(mt_backend *be, void *dst, const void *src, size_t bytes);
mt_status mt_cpu_zero(mt_backend *be, void *p, size_t bytes);
mt_status mt_cpu_sync(mt_backend *be);

/* gemm.c */
/* The OpenBLAS kernel set in use ("SkylakeX (chosen from CPU features)"), loading the
 * library if needed, or the load error. Static storage; for logs and benchmarks. */
const char *mt_cpu_gemm_kernel(void);
mt_status mt_cpu_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc);

/* embedding.c */
mt_status mt_cpu_embedding_fwd(mt_backend *be, float *out, const float *table, const int32_t *tokens, int64_t N,
                          int64_t D, float scale);
mt_status mt_cpu_embedding_bwd(mt_backend *be, float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                          int64_t V, int64_t D, float scale);

/* rmsnorm.c */
mt_status mt_cpu_rmsnorm_fwd(mt_backend *be, float *y, float *rstd, const float *x, const float *w, int64_t N,
                        int64_t D, float eps, float w_offset);
mt_status mt_cpu_rmsnorm_bwd(mt_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int64_t N, int64_t D, float w_offset);

/* rope.c */
mt_status mt_cpu_rope_fwd(mt_backend *be, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);
mt_status mt_cpu_rope_bwd(mt_backend *be, float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);

/* attention.c */
mt_status mt_cpu_attention_fwd(mt_backend *be, const mt_attn_args *a, float *out, float *lse, const float *q,
                          const float *k, const float *v);
mt_status mt_cpu_attention_bwd(mt_backend *be, const mt_attn_args *a, float *dq, float *dk, float *dv,
                          const float *dout, const float *q, const float *k, const float *v,
                          const float *out, const float *lse);

/* glu.c */
mt_status mt_cpu_glu_fwd(mt_backend *be, float *h, const float *gate, const float *up, int64_t count,
                    mt_activation act);
mt_status mt_cpu_glu_bwd(mt_backend *be, float *dgate, float *dup, const float *dh, const float *gate,
                    const float *up, int64_t count, mt_activation act);

/* xent.c */
mt_status mt_cpu_xent_tile(mt_backend *be, float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                      int32_t ignore_index, float dscale, double *loss_sum, int64_t *count);

/* elementwise.c */
mt_status mt_cpu_axpy(mt_backend *be, float *y, const float *x, float alpha, int64_t n);
mt_status mt_cpu_scale(mt_backend *be, float *x, float alpha, int64_t n);
mt_status mt_cpu_sumsq(mt_backend *be, const float *x, int64_t n, double *out);

/* attn_merge.c */
mt_status mt_cpu_attn_merge(mt_backend *be, float *out, float *lse, const float *out_b, const float *lse_b,
                            int64_t B, int64_t T, int64_t H, int64_t Dh);

/* convert.c */
mt_status mt_cpu_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first);
mt_status mt_cpu_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n);

/* adamw.c */
mt_status mt_cpu_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                  float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
