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
 * it should become a plan entry (issue 4). */
#include <cublasLt.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

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
            mt_cuda_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(s_));         \
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
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

static gemm_plan *plan_get(const gemm_key *k) {
    for (int i = 0; i < MT_GEMM_CACHE; i++)
        if (g_cache[i].used && memcmp(&g_cache[i].key, k, sizeof(*k)) == 0) return &g_cache[i];
    if (!g_lt) {
        LT_CHECK(cublasLtCreate(&g_lt));
        if (cudaMalloc(&g_ws, MT_GEMM_WS_BYTES) != cudaSuccess) {
            mt_cuda_fail(__FILE__, __LINE__, "cudaMalloc(gemm workspace)", "out of memory");
            return NULL;
        }
    }
    gemm_plan *p = &g_cache[g_next];
    g_next = (g_next + 1) % MT_GEMM_CACHE;
    plan_destroy(p);
    p->key = *k;
    const cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A = our B */
    const cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's B = our A */
    LT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    /* stored column-major shapes: our B is [K, N] row-major -> [N, K] col-major (or [K, N]) */
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, k->N, k->M, k->ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = MT_GEMM_WS_BYTES;
    uint32_t aa = (uint32_t)k->al_b, ab = (uint32_t)k->al_a, ac = (uint32_t)k->al_c;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                                      &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p->used = 1; /* descriptors exist: destroy them on eviction even on failure below */
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        plan_destroy(p);
        mt_cuda_fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", "no algorithm for this shape");
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

void mt_cuda_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) { /* C = beta C; C not read when beta == 0 */
        gemm_scale_kernel<<<mt_cuda_blocks(M * N, 256), 256>>>(C, M, N, ldc, beta);
        MT_CUDA_LAUNCHED();
        return;
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
    gemm_plan *p = plan_get(&k);
    if (!p) return;
    cublasStatus_t s = cublasLtMatmul(g_lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                      &p->algo, g_ws, MT_GEMM_WS_BYTES, 0);
    if (s != CUBLAS_STATUS_SUCCESS) mt_cuda_fail(__FILE__, __LINE__, "cublasLtMatmul", cublasLtGetStatusString(s));
}
