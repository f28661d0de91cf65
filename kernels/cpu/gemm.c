/* kernels/cpu/gemm.c: C = alpha op(A) op(B) + beta C on the CPU, through one of two
 * libraries picked from the CPU's features (docs/cpu_gemm.md has the measurements):
 *
 *   operands  CPU features              library
 *   fp32      AVX-512 (F, BW, VL, DQ)   oneDNN's matmul primitive (brgemm kernels)
 *   bf16      AMX-BF16                  oneDNN's matmul primitive (brgemm on AMX tiles)
 *   fp32      otherwise (AVX2: Zen)     OpenBLAS's cblas_sgemm, single-threaded on tiles
 *   bf16      otherwise                 the same, operands widened to fp32 slice by slice
 *
 * plus OpenBLAS for what oneDNN's brgemm kernels refuse (strided operands: lda, ldb or
 * ldc larger than the row). AVX512-BF16 without AMX stays on widened fp32: vdpbf16ps
 * does half as many multiply-adds per cycle as fp32 FMA on the CPU measured (Emerald
 * Rapids), so oneDNN's AVX512-BF16 kernels ran at 43-48% of the fp32 FMA peak where
 * widened fp32 ran at 50-77%.
 *
 * A tuned BLAS is the one CPU routine we do not write ourselves (STYLE.md). The wrapper
 * only adds what ops.h promises beyond CBLAS: empty shapes are no-ops, K == 0 scales C,
 * and beta == 0 never reads C (NaN or garbage in C does not propagate); and that every
 * path gives the same bits for any thread count (see the OpenBLAS tiles and oneDNN's
 * "Determinism" below). It must be called outside OpenMP parallel regions: both
 * libraries run their parallel regions on our OpenMP runtime (Debian builds both
 * against libgomp).
 *
 * Neither library is linked; each is dlopen'ed on the first GEMM that needs it (as
 * kernels/cuda/gemm.cu loads cuBLASLt), so a machine without oneDNN still runs.
 * OpenBLAS picks its kernels by CPU model number, in its library constructor, and falls
 * back to SSE3 (Prescott) kernels on a model newer than the library (Debian 12's 0.3.21
 * on Emerald Rapids: 4x slower sgemm). So OPENBLAS_CORETYPE is set from the CPU's
 * features before the load: AVX512F+BW+VL+DQ -> SkylakeX, AVX2+FMA -> Zen on AMD,
 * Haswell otherwise. A user-set OPENBLAS_CORETYPE is kept as it is. The variable is
 * restored after loading, so child processes see the user's environment.
 * MT_CPU_GEMM=openblas in the environment keeps oneDNN out (every GEMM through OpenBLAS);
 * MT_CPU_GEMM=onednn sends every GEMM that oneDNN has a brgemm kernel for to oneDNN
 * (bf16 on AVX512-BF16 CPUs too), the rest to OpenBLAS. Each dtype's path is logged
 * (info) on its first GEMM and returned by mt_cpu_gemm_kernel(). */
#include <assert.h>
#include <dlfcn.h>
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/log.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#ifndef MT_OPENBLAS_PATH
#define MT_OPENBLAS_PATH "libopenblas.so.0"
#endif

/* MT_CPU_GEMM from the environment, read once: MT_CPU_GEMM_AUTO unless it names a library. */
static mt_cpu_gemm_lib g_gemm_env = MT_CPU_GEMM_AUTO;
static pthread_once_t g_gemm_env_once = PTHREAD_ONCE_INIT;

static void gemm_env_read(void) {
    const char *e = getenv("MT_CPU_GEMM");
    if (!e || !*e || strcmp(e, "auto") == 0) return;
    if (strcmp(e, "openblas") == 0)
        g_gemm_env = MT_CPU_GEMM_OPENBLAS;
    else if (strcmp(e, "onednn") == 0)
        g_gemm_env = MT_CPU_GEMM_ONEDNN;
    else
        mt_log(MT_LOG_WARN, "cpu gemm: MT_CPU_GEMM=%s ignored (auto, openblas or onednn)", e);
}

/* ---- OpenBLAS ---- */

static struct {
    pthread_once_t once;
    __typeof__(&cblas_sgemm) sgemm;
    char err[256];
    char core[64]; /* openblas_get_corename() and why it was chosen */
} g_blas = {PTHREAD_ONCE_INIT, NULL, "", ""};

/* The OpenBLAS core for this CPU's features, or NULL to leave OpenBLAS's own choice. */
static const char *blas_core_from_features(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
    return NULL;
}

static void blas_load(void) {
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *core = user && *user ? NULL : blas_core_from_features();
    if (core) setenv("OPENBLAS_CORETYPE", core, 1); /* read by OpenBLAS's constructor */
    void *h = dlopen(MT_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (core) unsetenv("OPENBLAS_CORETYPE");
    if (!h) {
        snprintf(g_blas.err, sizeof g_blas.err, "dlopen(%s): %s", MT_OPENBLAS_PATH, dlerror());
        return;
    }
    char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
    *(void **)&g_blas.sgemm = dlsym(h, "cblas_sgemm");
    if (!g_blas.sgemm) {
        snprintf(g_blas.err, sizeof g_blas.err, "dlsym(cblas_sgemm) in %s: missing", MT_OPENBLAS_PATH);
        return;
    }
    snprintf(g_blas.core, sizeof g_blas.core, "%s (%s)", corename ? corename() : "?",
             user && *user ? "OPENBLAS_CORETYPE set by the user" : core ? "chosen from CPU features"
                                                                  : "OpenBLAS's own choice");
    mt_log(MT_LOG_INFO, "cpu gemm: OpenBLAS kernels %s", g_blas.core);
}

/* ---- OpenBLAS, in tiles fixed by the shape ----
 * OpenBLAS's own threading does not give the same bits for every thread count: its
 * threaded driver (driver/level3/level3_thread.c) cuts K differently from the
 * single-threaded one (level3.c) when GEMM_Q < K < 2 GEMM_Q, and its Haswell / Zen
 * kernels (the AVX2 machines') differ between 1 and 2 threads on every shape measured,
 * 4096 x 512 x 512 included. So OpenBLAS is only ever run single-threaded here, on
 * tiles of C whose sides depend on M and N alone (gemm_tile_dims), the tiles spread
 * over the OpenMP threads: each element of C comes out of the same single-threaded
 * call, with the same K blocking, whatever the thread count. Tiles are 256 or 512 on
 * a side (single-threaded sgemm ran at 134-144 GFLOP/s on them on one Emerald Rapids
 * core, against 119 on 128 x 128), halved from 512 while C has fewer than
 * MT_GEMM_TILES of them; C smaller than a tile is one call on the calling thread.
 * OpenBLAS runs single-threaded inside our parallel region (num_cpu_avail: 1 when
 * omp_in_parallel()); blas_sgemm_1t also sets this thread's OpenMP thread count to 1
 * around the call, for a call outside a region or in a region of one thread. */
#define MT_GEMM_TILE ((int64_t)512)
#define MT_GEMM_TILE_MIN ((int64_t)256)
#define MT_GEMM_TILES 32

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The tile sides *mb x *nb for C [M, N] (M, N > 0): a function of M and N only. */
static void gemm_tile_dims(int64_t M, int64_t N, int64_t *mb, int64_t *nb) {
    *mb = M < MT_GEMM_TILE ? M : MT_GEMM_TILE;
    *nb = N < MT_GEMM_TILE ? N : MT_GEMM_TILE;
    if (cdiv(M, *mb) * cdiv(N, *nb) < MT_GEMM_TILES && *mb > MT_GEMM_TILE_MIN) *mb = MT_GEMM_TILE_MIN;
    if (cdiv(M, *mb) * cdiv(N, *nb) < MT_GEMM_TILES && *nb > MT_GEMM_TILE_MIN) *nb = MT_GEMM_TILE_MIN;
}

/* cblas_sgemm (loaded) on one thread. */
static void blas_sgemm_1t(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    /* CBLAS takes int dimensions; CPU-sized problems stay far below INT_MAX. */
    assert(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    const int nt = omp_get_max_threads();
    if (nt != 1) omp_set_num_threads(1);
    /* OpenBLAS's beta pass stores zeros when beta == 0 (its gemm_beta kernels), so C is
     * overwritten, not scaled; tests/test_ops.c checks this with NaN in C. */
    g_blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
                 (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    if (nt != 1) omp_set_num_threads(nt);
}

/* C[M, N] (of c_dt) = beta C, or 0 when beta == 0 (C unread): the K == 0 or alpha == 0 GEMM. */
static void gemm_scale(int64_t M, int64_t N, float beta, void *C, int64_t ldc, mt_dtype c_dt) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            mt_cpu_st(C, i * ldc + j, beta == 0.0f ? 0.0f : beta * mt_cpu_ld(C, i * ldc + j, c_dt), c_dt);
}

static mt_status blas_ready(void) {
    pthread_once(&g_blas.once, blas_load);
    return g_blas.sgemm ? MT_OK : mt_set_error(MT_ERR_RUNTIME, "cpu gemm: %s", g_blas.err);
}

/* C = alpha op(A) op(B) + beta C with every operand fp32, through OpenBLAS. */
static mt_status gemm_f32(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (K <= 0 || alpha == 0.0f) {
        gemm_scale(M, N, beta, C, ldc, MT_F32);
        return MT_OK;
    }
    MT_TRY(blas_ready());
    int64_t mb, nb;
    gemm_tile_dims(M, N, &mb, &nb);
    const int64_t tm = cdiv(M, mb), tiles = tm * cdiv(N, nb);
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t i0 = t % tm * mb, j0 = t / tm * nb;
        const int64_t m = M - i0 < mb ? M - i0 : mb, n = N - j0 < nb ? N - j0 : nb;
        blas_sgemm_1t(trans_a, trans_b, m, n, K, alpha, trans_a ? A + i0 : A + i0 * lda, lda,
                      trans_b ? B + j0 * ldb : B + j0, ldb, beta, C + i0 * ldc + j0, ldc);
    }
    return MT_OK;
}

/* ---- bf16 operands, widened for OpenBLAS ----
 * A bf16 x bf16 product is exact in fp32 (8 + 8 significant bits), so widening A and B
 * to fp32 and calling cblas_sgemm is exactly bf16 x bf16 -> fp32 with fp32 sums (what
 * cuBLASLt's CUBLAS_COMPUTE_32F does). Each tile of C (gemm_tile_dims, as for fp32) is
 * made by one thread in MT_GEMM_KB slices of K: the slice of op(A)'s rows and op(B)'s
 * columns is widened into that thread's scratch and added by one single-threaded sgemm
 * (beta on the first slice, 1 after), into C itself when C is fp32, else into an fp32
 * tile that starts as beta * float(C) (C unread when beta == 0) and is rounded once into
 * the bf16 C at the end. The order of the fp32 sums therefore differs from one sgemm
 * over all of K, within the same gamma_(K+2) bound (ops.h: backends differ by the order
 * of fp32 sums), and depends on the shape alone. Scratch rows are padded by MT_GEMM_PAD
 * floats, so that no leading dimension is a power of two (cache-set conflicts in
 * OpenBLAS's packing). Scratch per thread that makes tiles (the caller and the OpenMP
 * workers): two widened slices and the fp32 tile, MT_GEMM_SCRATCH_FLOATS = 536 Ki
 * floats = 2.1 MiB, allocated on the thread's first bf16 tile and freed when the thread
 * exits (a pthread key destructor); never more, whatever the shapes. */
#define MT_GEMM_KB ((int64_t)256)
#define MT_GEMM_PAD ((int64_t)16)
#define MT_GEMM_MAX2(a, b) ((a) > (b) ? (a) : (b))
#define MT_GEMM_WIDE_FLOATS MT_GEMM_MAX2(MT_GEMM_TILE * (MT_GEMM_KB + MT_GEMM_PAD), MT_GEMM_KB * (MT_GEMM_TILE + MT_GEMM_PAD))
#define MT_GEMM_SCRATCH_FLOATS (2 * MT_GEMM_WIDE_FLOATS + MT_GEMM_TILE * (MT_GEMM_TILE + MT_GEMM_PAD))

static pthread_key_t g_gemm_key;
static pthread_once_t g_gemm_key_once = PTHREAD_ONCE_INIT;
static int g_gemm_key_ok;

static void gemm_key_make(void) { g_gemm_key_ok = pthread_key_create(&g_gemm_key, free) == 0; }

/* This thread's MT_GEMM_SCRATCH_FLOATS floats, or NULL when they cannot be had. */
static float *gemm_scratch(void) {
    pthread_once(&g_gemm_key_once, gemm_key_make);
    if (!g_gemm_key_ok) return NULL;
    float *p = pthread_getspecific(g_gemm_key);
    if (!p) {
        p = malloc((size_t)MT_GEMM_SCRATCH_FLOATS * sizeof(float));
        if (p && pthread_setspecific(g_gemm_key, p) != 0) {
            free(p);
            p = NULL;
        }
    }
    return p;
}

/* d[0, n) = s[0, n) widened (exact), and the reverse, rounded once to nearest even:
 * cpu_dtype.h's conversions as SIMD loops. */
MT_CPU_SIMD_CLONES static void gemm_widen_row(float *restrict d, const mt_bf16 *restrict s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = mt_bf16_to_f32(s[i]);
}
MT_CPU_SIMD_CLONES static void gemm_round_row(mt_bf16 *restrict d, const float *restrict s, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) d[i] = mt_f32_to_bf16(s[i]);
}

/* dst[r][c] (row stride ldd) = widened src[(r0 + r) lds + c0 + c] for r < rows, c < cols. */
static void gemm_widen(float *restrict dst, int64_t ldd, const mt_bf16 *restrict src, int64_t lds, int64_t r0,
                       int64_t c0, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) gemm_widen_row(dst + r * ldd, src + (r0 + r) * lds + c0, cols);
}

/* One tile C[i0 .. i0 + m, j0 .. j0 + n) of gemm_bf16, on this thread with its scratch s. */
static void gemm_bf16_tile(int trans_a, int trans_b, int64_t i0, int64_t j0, int64_t m, int64_t n, int64_t K,
                           float alpha, const mt_bf16 *A, int64_t lda, const mt_bf16 *B, int64_t ldb, float beta,
                           void *C, int64_t ldc, mt_dtype c_dt, float *s) {
    float *Ab = s, *Bb = s + MT_GEMM_WIDE_FLOATS, *Ct = Bb + MT_GEMM_WIDE_FLOATS;
    /* the fp32 tile: C itself, or Ct holding float(C) */
    float *ct = c_dt == MT_F32 ? (float *)C + i0 * ldc + j0 : Ct;
    const int64_t ldt = c_dt == MT_F32 ? ldc : n + MT_GEMM_PAD;
    if (c_dt == MT_BF16 && beta != 0.0f) gemm_widen(Ct, ldt, C, ldc, i0, j0, m, n);
    for (int64_t k0 = 0; k0 < K; k0 += MT_GEMM_KB) {
        const int64_t kb = K - k0 < MT_GEMM_KB ? K - k0 : MT_GEMM_KB;
        /* op(A)[i0.., k0..]: A[k0.., i0..] (kb x m) when transposed, else m x kb */
        const int64_t lda_b = (trans_a ? m : kb) + MT_GEMM_PAD, ldb_b = (trans_b ? kb : n) + MT_GEMM_PAD;
        if (trans_a)
            gemm_widen(Ab, lda_b, A, lda, k0, i0, kb, m);
        else
            gemm_widen(Ab, lda_b, A, lda, i0, k0, m, kb);
        if (trans_b)
            gemm_widen(Bb, ldb_b, B, ldb, j0, k0, n, kb);
        else
            gemm_widen(Bb, ldb_b, B, ldb, k0, j0, kb, n);
        blas_sgemm_1t(trans_a, trans_b, m, n, kb, alpha, Ab, lda_b, Bb, ldb_b, k0 == 0 ? beta : 1.0f, ct, ldt);
    }
    if (c_dt == MT_BF16)
        for (int64_t r = 0; r < m; r++) gemm_round_row((mt_bf16 *)C + (i0 + r) * ldc + j0, Ct + r * ldt, n);
}

static mt_status gemm_bf16(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const mt_bf16 *A, int64_t lda, const mt_bf16 *B, int64_t ldb, float beta, void *C,
                           int64_t ldc, mt_dtype c_dt) {
    if (K <= 0 || alpha == 0.0f) {
        gemm_scale(M, N, beta, C, ldc, c_dt);
        return MT_OK;
    }
    MT_TRY(blas_ready());
    int64_t mb, nb;
    gemm_tile_dims(M, N, &mb, &nb);
    const int64_t tm = cdiv(M, mb), tiles = tm * cdiv(N, nb);
    int oom = 0;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
    for (int64_t t = 0; t < tiles; t++) {
        float *s = gemm_scratch();
        if (!s) {
#pragma omp atomic write
            oom = 1;
            continue;
        }
        const int64_t i0 = t % tm * mb, j0 = t / tm * nb;
        gemm_bf16_tile(trans_a, trans_b, i0, j0, M - i0 < mb ? M - i0 : mb, N - j0 < nb ? N - j0 : nb, K, alpha, A,
                       lda, B, ldb, beta, C, ldc, c_dt, s);
    }
    if (oom)
        return mt_set_error(MT_ERR_OOM, "cpu gemm: no %lld-float bf16 scratch for a thread (C partly written)",
                            (long long)MT_GEMM_SCRATCH_FLOATS);
    return MT_OK;
}

/* ---- oneDNN ----
 * The matmul primitive (oneDNN 2.x C API; Debian 12: 2.6.3) with src and weights of the
 * operands' dtype and a dst of C's: dst = alpha (src @ weights) + beta dst, alpha as the
 * output scale, beta as a sum post-op (none when beta == 0: C unread), fp math mode
 * strict (no implicit down-conversion, whatever ONEDNN_DEFAULT_FPMATH_MODE says).
 * Only its brgemm kernels are used ("brg:" implementations); anything else (oneDNN's
 * gemm-based or reference matmul, e.g. on AVX2, or strided operands, which brgemm
 * refuses) goes to OpenBLAS. fp32 brgemm is FMA in fp32. bf16 brgemm adds exact bf16 x
 * bf16 products into fp32 sums (tdpbf16ps on AMX, vdpbf16ps with AVX512-BF16), ops.h's
 * math with one difference: those instructions treat denormal inputs as zero and flush
 * denormal results (|x| < 2^-126, far below training values; docs/cpu_gemm.md). A bf16
 * dst is rounded once, to nearest even (vcvtneps2bf16).
 *
 * Determinism: each C element is summed over K in an order fixed by the shape (K blocks
 * in order, the kernel's fixed order inside a block) unless oneDNN splits K across
 * threads ("nthr_k", a reduction whose order follows the thread count). In oneDNN
 * 2.5-2.7 that happens only (1) on AVX-512 for a transposed src with K >= 2048 when
 * threads outnumber the N blocks, and (2) on AMX with >= 16 threads and K > 1024
 * (src/cpu/x64/matmul/brgemm_matmul_utils.cpp). So a transposed-A GEMM with
 * K > MT_DNNL_KMAX is cut here into K slices of at most MT_DNNL_KMAX (rows of A^T and B,
 * still dense; fp32 C accumulates, beta on the first slice, 1 after), and on AMX the
 * other GEMMs with K > MT_DNNL_KMAX are planned for at most 15 threads. Results are then
 * bitwise the same for any thread count and run to run (checked on AVX-512 and
 * AVX512-BF16 with 1, 2, 3, 9 and 16 threads; the AMX case follows from the source).
 *
 * Plans (primitive, memory objects) are cached per calling thread, keyed by shape,
 * transposes, leading dimensions, dtypes, alpha, beta and the OpenMP thread count
 * (MT_DNNL_PLANS, least recently used evicted), as kernels/cuda/gemm.cu caches cuBLASLt
 * plans. The scratchpad is user-managed: one buffer per calling thread, grown to the
 * largest plan's need (the step's shapes: at most 2.5 MiB on 2 threads, 10.5 MiB on 16),
 * and a plan needing more than MT_DNNL_SCRATCH_MAX goes to OpenBLAS; freed, with the
 * plans, when the thread exits. */
#if MT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#ifndef MT_DNNL_PATH
#define MT_DNNL_PATH "libdnnl.so.2"
#endif
#define MT_DNNL_KMAX ((int64_t)1024)
#define MT_DNNL_PLANS 64
#define MT_DNNL_SCRATCH_MAX ((size_t)64 << 20)

#define MT_DNNL_FUNCS(X)                                                                                       \
    X(dnnl_version) X(dnnl_get_effective_cpu_isa) X(dnnl_engine_create) X(dnnl_stream_create)                 \
    X(dnnl_stream_destroy) X(dnnl_memory_desc_init_by_strides) X(dnnl_memory_desc_get_size)                   \
    X(dnnl_matmul_desc_init) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)                     \
    X(dnnl_primitive_attr_set_fpmath_mode) X(dnnl_primitive_attr_set_scratchpad_mode)                         \
    X(dnnl_primitive_attr_set_output_scales) X(dnnl_primitive_attr_set_post_ops) X(dnnl_post_ops_create)      \
    X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum) X(dnnl_primitive_desc_create)                        \
    X(dnnl_primitive_desc_destroy) X(dnnl_primitive_desc_query) X(dnnl_primitive_desc_query_md)               \
    X(dnnl_primitive_create) X(dnnl_primitive_destroy) X(dnnl_primitive_execute) X(dnnl_memory_create)        \
    X(dnnl_memory_destroy) X(dnnl_memory_set_data_handle)

static struct {
    pthread_once_t once;
#define MT_DNNL_MEMBER(f) __typeof__(&f) f;
    MT_DNNL_FUNCS(MT_DNNL_MEMBER)
#undef MT_DNNL_MEMBER
    dnnl_engine_t engine;
    int avx512;     /* oneDNN has avx512_core brgemm kernels here (fp32) */
    int amx;        /* ... and AMX ones (bf16) */
    char desc[160]; /* "oneDNN 2.6.3 matmul (avx512_core_bf16)" or why it is not used */
} g_dnnl = {.once = PTHREAD_ONCE_INIT};

static const char *dnnl_isa_name(dnnl_cpu_isa_t isa) {
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx) return "avx512_core_amx";
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16) return "avx512_core_bf16";
    if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) return "avx512_core";
    if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2) return "avx2";
    return "pre-avx2";
}

static void dnnl_load(void) {
    void *h = dlopen(MT_DNNL_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h && strcmp(MT_DNNL_PATH, "libdnnl.so.2") != 0) h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN not loaded: %s", dlerror());
        mt_log(MT_LOG_INFO, "cpu gemm: %s", g_dnnl.desc);
        return;
    }
#define MT_DNNL_SYM(f)                                                                                         \
    if (!(*(void **)&g_dnnl.f = dlsym(h, #f))) {                                                              \
        snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN not used: %s missing in %s", #f, MT_DNNL_PATH);     \
        mt_log(MT_LOG_INFO, "cpu gemm: %s", g_dnnl.desc);                                                      \
        return;                                                                                                \
    }
    MT_DNNL_FUNCS(MT_DNNL_SYM)
#undef MT_DNNL_SYM
    const dnnl_version_t *v = g_dnnl.dnnl_version();
    const dnnl_cpu_isa_t isa = g_dnnl.dnnl_get_effective_cpu_isa(); /* cpuid, capped by ONEDNN_MAX_CPU_ISA */
    if (g_dnnl.dnnl_engine_create(&g_dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
        g_dnnl.engine = NULL;
        snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN not used: dnnl_engine_create failed");
        mt_log(MT_LOG_INFO, "cpu gemm: %s", g_dnnl.desc);
        return;
    }
    g_dnnl.avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    g_dnnl.amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN %d.%d.%d matmul (%s)", v->major, v->minor, v->patch,
             dnnl_isa_name(isa));
    mt_log(MT_LOG_INFO, "cpu gemm: %s", g_dnnl.desc);
}

typedef struct {
    int32_t ta, tb, ab_dt, c_dt, nthr, pad;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
} dnnl_key;

typedef struct {
    dnnl_key key;
    dnnl_primitive_t prim; /* NULL: no brgemm kernel for this key (OpenBLAS instead) */
    dnnl_memory_t mem[4];  /* src, weights, dst, scratchpad (NULL when none is needed) */
    size_t scratch;        /* scratchpad bytes */
    uint64_t used;         /* the thread's clock at the last use */
} dnnl_plan;

/* A calling thread's oneDNN state. */
typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
    uint64_t clock;
    int nplans;
    dnnl_plan plans[MT_DNNL_PLANS];
} dnnl_thread;

static pthread_key_t g_dnnl_key;
static pthread_once_t g_dnnl_key_once = PTHREAD_ONCE_INIT;
static int g_dnnl_key_ok;

static void dnnl_plan_free(dnnl_plan *p) {
    for (int i = 0; i < 4; i++)
        if (p->mem[i]) g_dnnl.dnnl_memory_destroy(p->mem[i]);
    if (p->prim) g_dnnl.dnnl_primitive_destroy(p->prim);
    memset(p, 0, sizeof *p);
}

static void dnnl_thread_free(void *arg) {
    dnnl_thread *t = arg;
    for (int i = 0; i < t->nplans; i++) dnnl_plan_free(&t->plans[i]);
    if (t->stream) g_dnnl.dnnl_stream_destroy(t->stream);
    free(t->scratch);
    free(t);
}

static void dnnl_key_make(void) { g_dnnl_key_ok = pthread_key_create(&g_dnnl_key, dnnl_thread_free) == 0; }

/* This thread's oneDNN state, or NULL (no memory, no stream). */
static dnnl_thread *dnnl_this_thread(void) {
    pthread_once(&g_dnnl_key_once, dnnl_key_make);
    if (!g_dnnl_key_ok) return NULL;
    dnnl_thread *t = pthread_getspecific(g_dnnl_key);
    if (t) return t;
    if (!(t = calloc(1, sizeof *t))) return NULL;
    if (g_dnnl.dnnl_stream_create(&t->stream, g_dnnl.engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(g_dnnl_key, t) != 0) {
        dnnl_thread_free(t);
        return NULL;
    }
    return t;
}

/* Creates p->prim and its memory objects for p->key; leaves p->prim NULL when oneDNN
 * has no brgemm kernel for it or its scratchpad exceeds MT_DNNL_SCRATCH_MAX. */
static void dnnl_plan_create(dnnl_plan *p) {
    const dnnl_key *k = &p->key;
    const dnnl_data_type_t abt = k->ab_dt == MT_BF16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_data_type_t ct = k->c_dt == MT_BF16 ? dnnl_bf16 : dnnl_f32;
    /* row-major A [M, K] or, transposed, [K, M]; B [K, N] or [N, K]; C [M, N] */
    const dnnl_dims_t ad = {k->M, k->K}, as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
    const dnnl_dims_t bd = {k->K, k->N}, bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
    const dnnl_dims_t cd = {k->M, k->N}, cs = {k->ldc, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    if (g_dnnl.dnnl_memory_desc_init_by_strides(&amd, 2, ad, abt, as) != dnnl_success ||
        g_dnnl.dnnl_memory_desc_init_by_strides(&bmd, 2, bd, abt, bs) != dnnl_success ||
        g_dnnl.dnnl_memory_desc_init_by_strides(&cmd, 2, cd, ct, cs) != dnnl_success ||
        g_dnnl.dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) != dnnl_success)
        return;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = g_dnnl.dnnl_primitive_attr_create(&attr) == dnnl_success &&
             g_dnnl.dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict) == dnnl_success &&
             g_dnnl.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && k->alpha != 1.0f) ok = g_dnnl.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha) == dnnl_success;
    if (ok && k->beta != 0.0f)
        ok = g_dnnl.dnnl_post_ops_create(&po) == dnnl_success &&
             g_dnnl.dnnl_post_ops_append_sum(po, k->beta) == dnnl_success &&
             g_dnnl.dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok) {
        /* oneDNN plans for omp_get_max_threads() threads; see "Determinism" above */
        const int capped = g_dnnl.amx && k->K > MT_DNNL_KMAX && k->nthr > 15;
        if (capped) omp_set_num_threads(15);
        ok = g_dnnl.dnnl_primitive_desc_create(&pd, &md, attr, g_dnnl.engine, NULL) == dnnl_success;
        if (capped) omp_set_num_threads(k->nthr);
    }
    const char *impl = NULL;
    if (ok) ok = g_dnnl.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
                 strncmp(impl, "brg", 3) == 0;
    const dnnl_memory_desc_t *smd = ok ? g_dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    p->scratch = smd ? g_dnnl.dnnl_memory_desc_get_size(smd) : 0;
    if (ok && p->scratch <= MT_DNNL_SCRATCH_MAX && g_dnnl.dnnl_primitive_create(&p->prim, pd) == dnnl_success) {
        ok = g_dnnl.dnnl_memory_create(&p->mem[0], &amd, g_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success &&
             g_dnnl.dnnl_memory_create(&p->mem[1], &bmd, g_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success &&
             g_dnnl.dnnl_memory_create(&p->mem[2], &cmd, g_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success &&
             (p->scratch == 0 ||
              g_dnnl.dnnl_memory_create(&p->mem[3], smd, g_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success);
        if (!ok) {
            const dnnl_key key = p->key;
            dnnl_plan_free(p);
            p->key = key;
        }
    }
    if (pd) g_dnnl.dnnl_primitive_desc_destroy(pd);
    if (po) g_dnnl.dnnl_post_ops_destroy(po);
    if (attr) g_dnnl.dnnl_primitive_attr_destroy(attr);
}

/* The plan of key in thread t: cached, or created (evicting the least recently used). */
static dnnl_plan *dnnl_plan_get(dnnl_thread *t, const dnnl_key *key) {
    t->clock++;
    int lru = 0;
    for (int i = 0; i < t->nplans; i++) {
        if (memcmp(&t->plans[i].key, key, sizeof *key) == 0) {
            t->plans[i].used = t->clock;
            return &t->plans[i];
        }
        if (t->plans[i].used < t->plans[lru].used) lru = i;
    }
    dnnl_plan *p = &t->plans[t->nplans < MT_DNNL_PLANS ? t->nplans++ : lru];
    dnnl_plan_free(p);
    p->key = *key;
    p->used = t->clock;
    dnnl_plan_create(p);
    return p;
}

/* The plan of one oneDNN matmul in thread t (its prim NULL when oneDNN has none). */
static dnnl_plan *dnnl_plan_for(dnnl_thread *t, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                                int64_t lda, int64_t ldb, mt_dtype ab_dt, float beta, int64_t ldc, mt_dtype c_dt) {
    dnnl_key key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.ta = ta, key.tb = tb, key.ab_dt = (int32_t)ab_dt, key.c_dt = (int32_t)c_dt;
    key.nthr = omp_get_max_threads();
    key.M = M, key.N = N, key.K = K, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.alpha = alpha, key.beta = beta;
    return dnnl_plan_get(t, &key);
}

/* Runs plan p (which has a prim) on A, B, C with thread t's scratchpad. */
static mt_status dnnl_exec(dnnl_thread *t, dnnl_plan *p, const void *A, const void *B, void *C) {
    if (p->scratch > t->scratch_bytes) {
        void *s = NULL;
        if (posix_memalign(&s, 4096, p->scratch) != 0)
            return mt_set_error(MT_ERR_OOM, "cpu gemm: no %zu-byte oneDNN scratchpad", p->scratch);
        free(t->scratch);
        t->scratch = s;
        t->scratch_bytes = p->scratch;
    }
    g_dnnl.dnnl_memory_set_data_handle(p->mem[0], (void *)A);
    g_dnnl.dnnl_memory_set_data_handle(p->mem[1], (void *)B);
    g_dnnl.dnnl_memory_set_data_handle(p->mem[2], C);
    if (p->mem[3]) g_dnnl.dnnl_memory_set_data_handle(p->mem[3], t->scratch);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->mem[0]}, {DNNL_ARG_WEIGHTS, p->mem[1]}, {DNNL_ARG_DST, p->mem[2]},
                               {DNNL_ARG_SCRATCHPAD, p->mem[3]}};
    const dnnl_status_t s = g_dnnl.dnnl_primitive_execute(p->prim, t->stream, p->mem[3] ? 4 : 3, args);
    if (s != dnnl_success)
        return mt_set_error(MT_ERR_RUNTIME, "cpu gemm: dnnl_primitive_execute (M %lld N %lld K %lld): status %d",
                            (long long)p->key.M, (long long)p->key.N, (long long)p->key.K, (int)s);
    return MT_OK;
}

/* C = alpha op(A) op(B) + beta C through oneDNN (K > 0, alpha != 0). Returns 0 and sets
 * *st when done, -1 when oneDNN cannot take it (C untouched). */
static int gemm_dnnl(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                     const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C, int64_t ldc, mt_dtype c_dt,
                     mt_status *st) {
    pthread_once(&g_dnnl.once, dnnl_load);
    if (!g_dnnl.engine) return -1;
    dnnl_thread *t = dnnl_this_thread();
    if (!t) return -1;
    if (!ta || K <= MT_DNNL_KMAX) {
        dnnl_plan *p = dnnl_plan_for(t, ta, tb, M, N, K, alpha, lda, ldb, ab_dt, beta, ldc, c_dt);
        if (!p->prim) return -1;
        *st = dnnl_exec(t, p, A, B, C);
        return 0;
    }
    /* Transposed A with K > MT_DNNL_KMAX: K slices (rows of A^T and of B) added into an
     * fp32 C, beta on the first, 1 after. B's slices are dense only when B is not
     * transposed, and a bf16 C would need an fp32 copy: those go to OpenBLAS. Every
     * slice's plan is made before C is touched (at most three shapes). */
    if (tb || c_dt != MT_F32) return -1;
    const int64_t ns = (K + MT_DNNL_KMAX - 1) / MT_DNNL_KMAX, kb = (K + ns - 1) / ns;
    const size_t es = mt_dtype_size(ab_dt);
    for (int run = 0; run < 2; run++)
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            const int64_t kk = K - k0 < kb ? K - k0 : kb;
            dnnl_plan *p = dnnl_plan_for(t, ta, tb, M, N, kk, alpha, lda, ldb, ab_dt, k0 == 0 ? beta : 1.0f, ldc, c_dt);
            if (!p->prim) return -1; /* only while run == 0: the plans are cached by then */
            if (!run) continue;
            *st = dnnl_exec(t, p, (const char *)A + (size_t)(k0 * lda) * es, (const char *)B + (size_t)(k0 * ldb) * es,
                            C);
            if (*st != MT_OK) return 0;
        }
    return 0;
}

static const char *dnnl_desc(void) {
    pthread_once(&g_dnnl.once, dnnl_load);
    return g_dnnl.desc;
}
/* Whether oneDNN is loaded and runs matmuls of ab_dt on brgemm kernels worth taking:
 * fp32 on avx512_core or better, bf16 on AMX. */
static int dnnl_has(mt_dtype ab_dt) {
    pthread_once(&g_dnnl.once, dnnl_load);
    return g_dnnl.engine && (ab_dt == MT_BF16 ? g_dnnl.amx : g_dnnl.avx512);
}
#else
static int gemm_dnnl(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                     const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C, int64_t ldc, mt_dtype c_dt,
                     mt_status *st) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)ab_dt;
    (void)beta, (void)C, (void)ldc, (void)c_dt, (void)st;
    return -1;
}
static const char *dnnl_desc(void) { return "oneDNN not built in (no oneapi/dnnl/dnnl.h at configure time)"; }
static int dnnl_has(mt_dtype ab_dt) {
    (void)ab_dt;
    return 0;
}
#endif

/* ---- dispatch ---- */

/* What cpuid says before oneDNN is loaded (it is loaded only where it may be used):
 * AVX-512 as oneDNN's avx512_core needs it (F, BW, VL, DQ), and AMX-BF16 (leaf 7 EDX
 * bit 22). oneDNN then has the last word (OS support, ONEDNN_MAX_CPU_ISA). */
static int cpu_has_avx512_core(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}
static int cpu_has_amx_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
#else
    return 0;
#endif
}

/* Whether a GEMM with operands of ab_dt goes to oneDNN first, for lib (AUTO: the
 * environment's MT_CPU_GEMM, else fp32 on AVX-512 and bf16 on AMX). */
static int gemm_lib_dnnl(mt_cpu_gemm_lib lib, mt_dtype ab_dt) {
    pthread_once(&g_gemm_env_once, gemm_env_read);
    if (lib == MT_CPU_GEMM_AUTO) lib = g_gemm_env;
    if (lib == MT_CPU_GEMM_AUTO)
        return (ab_dt == MT_BF16 ? cpu_has_amx_bf16() : cpu_has_avx512_core()) && dnnl_has(ab_dt);
    return lib == MT_CPU_GEMM_ONEDNN;
}

/* The path of ab_dt's GEMMs in words, e.g. "oneDNN 2.6.3 matmul (avx512_core_bf16);
 * OpenBLAS SkylakeX (...) in tiles for the rest" or "widened for OpenBLAS SkylakeX
 * (...) in tiles (no AMX)". */
static void gemm_path_desc(mt_dtype ab_dt, char *buf, size_t n) {
    pthread_once(&g_gemm_env_once, gemm_env_read);
    pthread_once(&g_blas.once, blas_load);
    const char *blas = g_blas.sgemm ? g_blas.core : g_blas.err;
    const char *widened = ab_dt == MT_BF16 ? "widened for " : "";
    if (gemm_lib_dnnl(MT_CPU_GEMM_AUTO, ab_dt))
        snprintf(buf, n, "%s; %sOpenBLAS %s in tiles for the rest", dnnl_desc(), widened, blas);
    else
        snprintf(buf, n, "%sOpenBLAS %s in tiles (%s)", widened, blas,
                 g_gemm_env == MT_CPU_GEMM_OPENBLAS ? "MT_CPU_GEMM=openblas"
                 : ab_dt == MT_BF16 && !cpu_has_amx_bf16() ? "no AMX"
                 : ab_dt == MT_F32 && !cpu_has_avx512_core() ? "no AVX-512"
                                                             : dnnl_desc());
}

static char g_gemm_desc[1024];
static pthread_once_t g_gemm_desc_once = PTHREAD_ONCE_INIT;

static void gemm_desc_make(void) {
    char f32[480], bf16[480];
    gemm_path_desc(MT_F32, f32, sizeof f32);
    gemm_path_desc(MT_BF16, bf16, sizeof bf16);
    snprintf(g_gemm_desc, sizeof g_gemm_desc, "float32: %s; bfloat16: %s", f32, bf16);
}

const char *mt_cpu_gemm_kernel(void) {
    pthread_once(&g_gemm_desc_once, gemm_desc_make);
    return g_gemm_desc;
}

/* The info log line naming each dtype's path, on its first GEMM. */
static pthread_once_t g_gemm_log_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static void gemm_log(mt_dtype ab_dt) {
    char d[480];
    gemm_path_desc(ab_dt, d, sizeof d);
    mt_log(MT_LOG_INFO, "cpu gemm: %s operands: %s", mt_dtype_name(ab_dt), d);
}
static void gemm_log_f32(void) { gemm_log(MT_F32); }
static void gemm_log_bf16(void) { gemm_log(MT_BF16); }

mt_status mt_cpu_gemm_with(mt_cpu_gemm_lib lib, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                           float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt,
                           float beta, void *C, int64_t ldc, mt_dtype c_dt) {
    const int f32 = ab_dt == MT_F32 && c_dt == MT_F32;
    if (!f32 && !(ab_dt == MT_BF16 && (c_dt == MT_F32 || c_dt == MT_BF16)))
        return mt_set_error(MT_ERR_INVALID,
                            "cpu gemm: A and B of %s with C of %s (float32/float32, bfloat16/float32 or "
                            "bfloat16/bfloat16 only)",
                            mt_dtype_name(ab_dt), mt_dtype_name(c_dt));
    if (M <= 0 || N <= 0) return MT_OK;
    pthread_once(&g_gemm_log_once[!f32], f32 ? gemm_log_f32 : gemm_log_bf16);
    if (K > 0 && alpha != 0.0f && gemm_lib_dnnl(lib, ab_dt)) {
        mt_status st = MT_OK;
        if (gemm_dnnl(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, ab_dt, beta, C, ldc, c_dt, &st) == 0)
            return st;
        if (lib == MT_CPU_GEMM_ONEDNN)
            return mt_set_error(MT_ERR_UNSUPPORTED, "cpu gemm: no oneDNN brgemm kernel for %c%c M %lld N %lld K %lld "
                                                    "(lda %lld ldb %lld ldc %lld): %s", trans_a ? 'T' : 'N',
                                trans_b ? 'T' : 'N', (long long)M, (long long)N, (long long)K, (long long)lda,
                                (long long)ldb, (long long)ldc, dnnl_desc());
    }
    if (f32) return gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, c_dt);
}

mt_status mt_cpu_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C,
                      int64_t ldc, mt_dtype c_dt) {
    (void)be;
    return mt_cpu_gemm_with(MT_CPU_GEMM_AUTO, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, ab_dt, beta, C, ldc,
                            c_dt);
}
