/* kernels/cuda/gemm.cu: C = alpha op(A) op(B) + beta C through cuBLASLt, fp32.
 *
 * ops.h is row-major; cuBLASLt is column-major. A row-major [r, c] matrix with row
 * stride ld is the column-major [c, r] matrix with the same ld, i.e. its transpose, so
 * C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
 * our B, its second our A, and the transpose flags carry over unchanged.
 * Compute type CUBLAS_COMPUTE_32F (no TF32) keeps fp32 parity with the CPU's sgemm;
 * bf16 inputs with fp32 accumulation and epilogues come with the bf16 step.
 * Descriptors and the heuristic's algorithm are cached per (shape, strides, flags,
 * pointer alignment): cuBLASLt assumes 256-byte aligned pointers unless told otherwise,
 * and a tile's rows (h + r0 * D) are not. cuBLAS gives bitwise-reproducible results for
 * a fixed algorithm on one GPU model (cuBLAS docs, "Results reproducibility"); the cached
 * algorithm makes the choice fixed within a process.
 * The workspace (32 MiB, the size NVIDIA recommends for Hopper) is allocated once here;
 * it should become a plan entry (issue 4).
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

#define MT_GEMM_WS_BYTES ((size_t)32 << 20)
#define MT_GEMM_CACHE 128

typedef struct gemm_key {
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
static void *g_ws;
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

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 4 && (a % (uintptr_t)al) != 0) al >>= 1;
    return al;
}

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
    if (!g_ws) {
        cudaError_t e = cudaMalloc(&g_ws, MT_GEMM_WS_BYTES);
        if (e != cudaSuccess) {
            (void)cudaGetLastError(); /* did not fit: not sticky */
            g_ws = NULL;
            mt_cuda_fail(be, "cudaMalloc(gemm workspace, 32 MiB)", cudaGetErrorString(e), 0);
            return NULL;
        }
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
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb));
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda));
    LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, k->N, k->M, k->ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(lt.cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = MT_GEMM_WS_BYTES;
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

__global__ void gemm_scale_kernel(float *C, int64_t M, int64_t N, int64_t ldc, float beta) {
    const int64_t total = M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        float *c = C + (i / N) * ldc + (i % N);
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

mt_status mt_cuda_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    MT_CUDA_ENTER(be);
    if (M <= 0 || N <= 0) return MT_OK;
    if (K <= 0 || alpha == 0.0f) { /* C = beta C; C not read when beta == 0 */
        gemm_scale_kernel<<<mt_cuda_blocks(M * N, 256), 256>>>(C, M, N, ldc, beta);
        MT_CUDA_LAUNCHED(be, "gemm_scale_kernel");
        return MT_OK;
    }
    gemm_key k;
    memset(&k, 0, sizeof(k)); /* padding bytes take part in memcmp */
    k.ta = trans_a != 0;
    k.tb = trans_b != 0;
    k.M = M;
    k.N = N;
    k.K = K;
    k.lda = lda;
    k.ldb = ldb;
    k.ldc = ldc;
    k.al_a = ptr_align(A);
    k.al_b = ptr_align(B);
    k.al_c = ptr_align(C);
    k.beta_zero = beta == 0.0f;
    gemm_plan *p = plan_get(be, &k);
    if (!p) return MT_ERR_RUNTIME; /* message recorded by plan_get */
    cublasStatus_t s = lt.cublasLtMatmul(g_lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                      &p->algo, g_ws, MT_GEMM_WS_BYTES, 0);
    if (s != CUBLAS_STATUS_SUCCESS) return mt_cuda_fail(be, "cublasLtMatmul", lt.cublasLtGetStatusString(s), 1);
    return MT_OK;
}
