/* kernels/cuda/gemm.cu: C = alpha op(A) op(B) + beta C through cuBLASLt.
 *
 * ops.h is row-major; cuBLASLt is column-major. A row-major [r, c] matrix with row
 * stride ld is the column-major [c, r] matrix with the same ld, i.e. its transpose, so
 * C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
 * our B, its second our A, and the transpose flags carry over unchanged.
 * Dtypes (ops.h): A and B of ab_dt, C (and D, the same buffer) of c_dt, as cuBLASLt
 * types CUDA_R_32F / CUDA_R_16BF: (fp32, fp32), (bf16, fp32) or (bf16, bf16). Compute
 * type CUBLAS_COMPUTE_32F (no TF32) with fp32 scale type: fp32 products and sums (a
 * bf16 x bf16 product is exact in fp32) and fp32 alpha/beta, a bf16 D rounded once at
 * the end, as the CPU's widened sgemm does.
 * Descriptors and the heuristic's algorithm are cached per (dtypes, shape, strides,
 * flags, pointer alignment): cuBLASLt assumes 256-byte aligned pointers unless told
 * otherwise, and a tile's rows (h + r0 * D) are not. cuBLAS gives bitwise-reproducible results for
 * a fixed algorithm on one GPU model (cuBLAS docs, "Results reproducibility"); the cached
 * algorithm makes the choice fixed within a process.
 * The workspace is the plan's (ops.h set_workspace: "workspace", at least caps.workspace_bytes =
 * 32 MiB, the size NVIDIA recommends for Hopper in the cuBLAS docs, "cublasSetWorkspace";
 * the other ops' scratch shares it); without one the algorithms are those that need none.
 * Its size is part of the cache key.
 *
 * cuBLASLt is loaded with dlopen on the first GEMM, not linked: merely loading the
 * library costs about 148 MiB of resident memory (its relocated data), which every
 * CPU-only run of a CUDA build would otherwise pay. The soname libcublasLt.so.<major>
 * is tried first (the loader's search path, ld.so.cache), then the file CMake found
 * (MT_CUBLASLT_PATH). Only the functions below are used. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define MT_LT_FUNCS(X)                                                                    \
    X(cublasLtCreate) X(cublasLtGetStatusString) X(cublasLtMatmul)                        \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)                         \
    X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                        \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                  \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate)                 \
    X(cublasLtMatrixLayoutDestroy)

#define MT_LT_PTR(f) decltype(&::f) f;
static struct { MT_LT_FUNCS(MT_LT_PTR) } lt; /* filled by lt_load */
#undef MT_LT_PTR

#define MT_STR2(x) #x
#define MT_STR(x) MT_STR2(x)

/* 1 when every function resolved; else records the error (mt_cuda_fail, not sticky:
 * the device is fine) and returns 0. */
static int lt_load(mt_backend *be) {
    static int state; /* 0 not tried, 1 loaded, -1 failed */
    if (state < 0) mt_cuda_fail(be, "cuBLASLt", "libcublasLt could not be loaded (see the first failure)", 0);
    if (state) return state > 0;
    const char *names[] = {"libcublasLt.so." MT_STR(CUBLAS_VER_MAJOR), "libcublasLt.so",
#ifdef MT_CUBLASLT_PATH
                           MT_CUBLASLT_PATH,
#endif
                           NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        state = -1;
        mt_cuda_fail(be, "dlopen(libcublasLt)", dlerror(), 0);
        return 0;
    }
#define MT_LT_SYM(f)                                                                      \
    if (!(lt.f = (decltype(lt.f))dlsym(h, #f))) {                                         \
        state = -1;                                                                       \
        mt_cuda_fail(be, "dlsym(" #f ")", "symbol missing in libcublasLt", 0);      \
        return 0;                                                                         \
    }
    MT_LT_FUNCS(MT_LT_SYM)
#undef MT_LT_SYM
    state = 1;
    return 1;
}

#define MT_GEMM_CACHE 128

typedef struct gemm_key {
    size_t ws_bytes; /* the workspace the algorithm may use (set_workspace) */
    int ab_dt, c_dt; /* mt_dtype of A/B and of C/D */
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    int al_a, al_b, al_c;
    int beta_zero;
} gemm_key;

typedef struct gemm_plan {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int used;
} gemm_plan;

static cublasLtHandle_t g_lt;
static gemm_plan g_cache[MT_GEMM_CACHE];
static int g_next; /* round-robin eviction */

#define LT_CHECK(call)                                                                    \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            mt_cuda_fail(be, #call, lt.cublasLtGetStatusString(s_), 1);                     \
            return NULL;                                                                  \
        }                                                                                 \
    } while (0)

/* The largest power of two up to 256 dividing p, at least the element size `es`. */
static int ptr_align(const void *p, int es) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > es && (a % (uintptr_t)al) != 0) al >>= 1;
    return al;
}

static cudaDataType lt_type(int dt) { return dt == MT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static void plan_destroy(gemm_plan *p) {
    if (!p->used) return;
    lt.cublasLtMatrixLayoutDestroy(p->la);
    lt.cublasLtMatrixLayoutDestroy(p->lb);
    lt.cublasLtMatrixLayoutDestroy(p->lc);
    lt.cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

/* The cached plan of k, or NULL with the error recorded (the message names the
 * cuBLASLt call and cublasLtGetStatusString). */
static gemm_plan *plan_get(mt_backend *be, const gemm_key *k) {
    for (int i = 0; i < MT_GEMM_CACHE; i++)
        if (g_cache[i].used && memcmp(&g_cache[i].key, k, sizeof(*k)) == 0) return &g_cache[i];
    if (!g_lt) {
        if (!lt_load(be)) return NULL;
        LT_CHECK(lt.cublasLtCreate(&g_lt));
    }
    gemm_plan *p = &g_cache[g_next];
    g_next = (g_next + 1) % MT_GEMM_CACHE;
    plan_destroy(p);
    p->key = *k;
    const cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A = our B */
    const cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's B = our A */
    LT_CHECK(lt.cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    /* stored column-major shapes: our B is [K, N] row-major -> [N, K] col-major (or [K, N]) */
    const cudaDataType tab = lt_type(k->ab_dt), tc = lt_type(k->c_dt);
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->la, tab, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb));
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lb, tab, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda));
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lc, tc, k->N, k->M, k->ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(lt.cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = k->ws_bytes;
    uint32_t aa = (uint32_t)k->al_b, ab = (uint32_t)k->al_a, ac = (uint32_t)k->al_c;
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = lt.cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                                      &res, &found);
    lt.cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1; /* descriptors exist: destroy them on eviction even on failure below */
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        plan_destroy(p);
        mt_cuda_fail(be, "cublasLtMatmulAlgoGetHeuristic", s != CUBLAS_STATUS_SUCCESS ? lt.cublasLtGetStatusString(s) : "no algorithm for this shape", 0);
        return NULL;
    }
    p->algo = res.algo;
    return p;
}

template <typename T>
__global__ void gemm_scale_kernel(T *C, int64_t M, int64_t N, int64_t ldc, float beta) {
    const int64_t total = M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t at = (i / N) * ldc + (i % N);
        mt_st(C, at, beta == 0.0f ? 0.0f : beta * mt_ld(C, at));
    }
}

mt_status mt_cuda_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C,
                       int64_t ldc, mt_dtype c_dt) {
    MT_CUDA_ENTER(be);
    const int ok = (ab_dt == MT_F32 && c_dt == MT_F32) || (ab_dt == MT_BF16 && (c_dt == MT_F32 || c_dt == MT_BF16));
    if (!ok)
        return mt_set_error(MT_ERR_INVALID, "cuda: gemm: dtypes A/B %s, C %s (float32/float32, bfloat16/float32 "
                            "or bfloat16/bfloat16)", mt_dtype_name(ab_dt), mt_dtype_name(c_dt));
    MT_TRY(mt_cuda_check_dtype(be, "gemm", ab_dt));
    MT_TRY(mt_cuda_check_dtype(be, "gemm", c_dt));
    if (M <= 0 || N <= 0) return MT_OK;
    if (K <= 0 || alpha == 0.0f) { /* C = beta C; C not read when beta == 0 */
        MT_CUDA_DT_SWITCH(c_dt, T, gemm_scale_kernel<T><<<mt_cuda_blocks(M * N, 256), 256>>>((T *)C, M, N, ldc, beta));
        MT_CUDA_LAUNCHED(be, "gemm_scale_kernel");
        return MT_OK;
    }
    const int esab = ab_dt == MT_BF16 ? 2 : 4, esc = c_dt == MT_BF16 ? 2 : 4;
    gemm_key k;
    memset(&k, 0, sizeof(k)); /* padding bytes take part in memcmp */
    k.ab_dt = (int)ab_dt;
    k.c_dt = (int)c_dt;
    k.ta = trans_a != 0;
    k.tb = trans_b != 0;
    k.M = M;
    k.N = N;
    k.K = K;
    k.lda = lda;
    k.ldb = ldb;
    k.ldc = ldc;
    k.al_a = ptr_align(A, esab);
    k.al_b = ptr_align(B, esab);
    k.al_c = ptr_align(C, esc);
    k.beta_zero = beta == 0.0f;
    const mt_cuda_ctx *c = (const mt_cuda_ctx *)be->ctx;
    k.ws_bytes = c->ws ? c->ws_bytes : 0;
    gemm_plan *p = plan_get(be, &k);
    if (!p) return MT_ERR_RUNTIME; /* message recorded by plan_get */
    cublasStatus_t s = lt.cublasLtMatmul(g_lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                         &p->algo, k.ws_bytes ? c->ws : NULL, k.ws_bytes, 0);
    if (s != CUBLAS_STATUS_SUCCESS) return mt_cuda_fail(be, "cublasLtMatmul", lt.cublasLtGetStatusString(s), 1);
    return MT_OK;
}
