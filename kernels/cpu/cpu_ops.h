/* kernels/cpu/cpu_ops.h: the CPU backend's op functions (private to kernels/cpu/).
 *
 * Each function implements the mt_ops entry of the same name; shapes, dtypes and the
 * math are documented once, in kernels/ops.h. cpu_backend.c assembles them into the
 * table returned by mt_cpu_ops(). Threading is OpenMP inside each op; no op calls
 * CBLAS from inside a parallel region (OpenBLAS's own threads would oversubscribe).
 * Every reduction has an order fixed by the shapes alone, never by the thread count. */
#ifndef MT_KERNELS_CPU_CPU_OPS_H
#define MT_KERNELS_CPU_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
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
void *mt_cpu_alloc(size_t bytes);
void mt_cpu_release(void *p);
void mt_cpu_copy(void *dst, const void *src, size_t bytes);
void mt_cpu_zero(void *p, size_t bytes);
void mt_cpu_sync(void);

/* gemm.c */
void mt_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc);

/* embedding.c */
void mt_cpu_embedding_fwd(float *out, const float *table, const int32_t *tokens, int64_t N,
                          int64_t D, float scale);
void mt_cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                          int64_t V, int64_t D, float scale);

/* rmsnorm.c */
void mt_cpu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t N,
                        int64_t D, float eps, float w_offset);
void mt_cpu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int64_t N, int64_t D, float w_offset);

/* rope.c */
void mt_cpu_rope_fwd(float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);
void mt_cpu_rope_bwd(float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);

/* attention.c */
void mt_cpu_attention_fwd(const mt_attn_args *a, float *out, float *lse, const float *q,
                          const float *k, const float *v);
void mt_cpu_attention_bwd(const mt_attn_args *a, float *dq, float *dk, float *dv,
                          const float *dout, const float *q, const float *k, const float *v,
                          const float *out, const float *lse);

/* glu.c */
void mt_cpu_glu_fwd(float *h, const float *gate, const float *up, int64_t count,
                    mt_activation act);
void mt_cpu_glu_bwd(float *dgate, float *dup, const float *dh, const float *gate,
                    const float *up, int64_t count, mt_activation act);

/* xent.c */
void mt_cpu_xent_tile(float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                      int32_t ignore_index, float dscale, double *loss_sum, int64_t *count);

/* elementwise.c */
void mt_cpu_axpy(float *y, const float *x, float alpha, int64_t n);
void mt_cpu_scale(float *x, float alpha, int64_t n);
double mt_cpu_sumsq(const float *x, int64_t n);

/* adamw.c */
void mt_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                  float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
