/* kernels/cpu/cpu_ops.h: the CPU backend's op functions (private to kernels/cpu/).
 *
 * Each function implements the mt_ops entry of the same name; shapes, dtypes and the
 * math are documented once, in kernels/ops.h. cpu_backend.c assembles them into the
 * backend object of mt_cpu_backend(). Each takes the backend first (unused: the CPU
 * backend has no context) and returns MT_OK unless an argument is invalid (a dtype other
 * than MT_F32 or MT_BF16 is MT_ERR_INVALID naming the op and the dtype) or the scratch
 * that bf16 data is widened into cannot be allocated (MT_ERR_OOM: rmsnorm's rows, gemm's
 * panels).
 * Threading is OpenMP inside each op; gemm calls OpenBLAS single-threaded on tiles of C
 * from inside its parallel region (OpenBLAS's own threading splits K by thread count:
 * gemm.c). Every reduction has an order fixed by the shapes alone, never by the thread
 * count, for either dtype.
 *
 * Dtypes: each op's MT_F32 path is its fp32 code, bitwise what it computed before
 * dtypes existed. MT_BF16 runs the same fp32 code on exactly widened copies of the bf16
 * inputs and rounds each bf16 output once (cpu_dtype.h); where an op departs from that
 * (attention's bf16 P, gemm's K blocks, attention_bwd's schedule) its file says so
 * (tests/test_ops_bf16.c and tests/test_ops_attention.c check both). */
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
mt_status mt_cpu_set_workspace(mt_backend *be, void *ws, size_t bytes);

/* gemm.c */
/* The libraries behind mt_cpu_gemm (gemm.c, docs/cpu_gemm.md): AUTO picks from the
 * CPU's features (oneDNN's brgemm matmul for fp32 on AVX-512 and bf16 on AMX, OpenBLAS
 * in tiles otherwise) unless MT_CPU_GEMM=openblas|onednn is set in the environment. */
typedef enum { MT_CPU_GEMM_AUTO = 0, MT_CPU_GEMM_OPENBLAS = 1, MT_CPU_GEMM_ONEDNN = 2 } mt_cpu_gemm_lib;
/* What each dtype's GEMMs run on, loading the libraries if needed, e.g. "float32:
 * oneDNN 2.6.3 matmul (avx512_core_bf16); OpenBLAS SkylakeX (chosen from CPU features)
 * in tiles for the rest; bfloat16: widened for OpenBLAS SkylakeX (...) in tiles (no
 * AMX)", with the load error where a library is missing. Static storage; for logs and
 * benchmarks. */
const char *mt_cpu_gemm_kernel(void);
mt_status mt_cpu_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C,
                      int64_t ldc, mt_dtype c_dt);
/* mt_cpu_gemm (ops.h's gemm, same math, same bits for any thread count) through lib:
 * AUTO is mt_cpu_gemm itself; OPENBLAS never uses oneDNN (bf16 operands widened for
 * cblas_sgemm); ONEDNN uses oneDNN's brgemm matmul for either dtype and fails with
 * MT_ERR_UNSUPPORTED, C untouched, where oneDNN is missing or has no brgemm kernel for
 * the call (AVX2-only CPUs, strided operands). For benchmarks and tests comparing them. */
mt_status mt_cpu_gemm_with(mt_cpu_gemm_lib lib, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                           float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt,
                           float beta, void *C, int64_t ldc, mt_dtype c_dt);

/* embedding.c */
mt_status mt_cpu_embedding_fwd(mt_backend *be, void *out, const void *table, const int32_t *tokens, int64_t N,
                               int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt);
mt_status mt_cpu_embedding_bwd(mt_backend *be, float *dtable, const void *dout, const int32_t *tokens, int64_t N,
                               int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt);

/* rmsnorm.c */
mt_status mt_cpu_rmsnorm_fwd(mt_backend *be, void *y, float *rstd, const void *x, const void *w, int64_t N,
                             int64_t D, float eps, float w_offset, mt_dtype dt);
mt_status mt_cpu_rmsnorm_bwd(mt_backend *be, void *dx, float *dw, const void *dy, const void *x, const void *w,
                             const float *rstd, int64_t N, int64_t D, float w_offset, mt_dtype dt);
mt_status mt_cpu_add_rmsnorm_fwd(mt_backend *be, void *h, void *y, float *rstd, const void *x, const void *r,
                                 const void *w, int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt);

/* rope.c */
mt_status mt_cpu_rope_fwd(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt);
mt_status mt_cpu_rope_bwd(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt);

/* attention.c */
mt_status mt_cpu_attention_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                               const void *k, const void *v);
mt_status mt_cpu_attention_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                               const void *dout, const void *q, const void *k, const void *v, const void *out,
                               const float *lse);

/* glu.c */
mt_status mt_cpu_glu_fwd(mt_backend *be, void *h, const void *gate, const void *up, int64_t count,
                         mt_activation act, mt_dtype dt);
mt_status mt_cpu_glu_bwd(mt_backend *be, void *dgate, void *dup, const void *dh, const void *gate, const void *up,
                         int64_t count, mt_activation act, mt_dtype dt);

/* xent.c */
mt_status mt_cpu_xent_tile(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                           int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale, double *stats);
mt_status mt_cpu_vocab_tile_max(mt_backend *be, float *z, int64_t R, int64_t Vl, float softcap, float *mx,
                                  int accumulate);
mt_status mt_cpu_vocab_tile_sumexp(mt_backend *be, const float *z, int64_t R, int64_t Vl, const float *mx,
                                   const int32_t *labels, int64_t v0, int32_t ignore_index, double *sz, int accumulate);
mt_status mt_cpu_vocab_tile_grad(mt_backend *be, float *z, int64_t R, int64_t Vl, const float *mx, const double *sz,
                                 const int32_t *labels, int64_t v0, int32_t ignore_index, float softcap, float dscale,
                                 int write_grad, double *stats);

/* elementwise.c */
mt_status mt_cpu_axpy(mt_backend *be, void *y, const void *x, float alpha, int64_t n, mt_dtype dt);
mt_status mt_cpu_scale(mt_backend *be, void *x, float alpha, int64_t n, mt_dtype dt);
mt_status mt_cpu_sumsq(mt_backend *be, const float *x, int64_t n, double *acc);

/* attn_merge.c */
mt_status mt_cpu_attn_merge(mt_backend *be, void *out, float *lse, const void *out_b, const float *lse_b,
                            int64_t B, int64_t T, int64_t H, int64_t Dh, mt_dtype dt);

/* convert.c */
mt_status mt_cpu_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first);
mt_status mt_cpu_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n);
mt_status mt_cpu_from_f32(mt_backend *be, void *dst, mt_dtype dtype, const float *src, int64_t n, int stochastic,
                          uint64_t seed, uint64_t offset);

/* adamw.c */
mt_status mt_cpu_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                       int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
