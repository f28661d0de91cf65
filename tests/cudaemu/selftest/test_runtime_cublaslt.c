/* tests/cudaemu/selftest/test_runtime_cublaslt.c: the emulator's CPU cuBLASLt and the
 * dlopen shim, in C, called as kernels/cuda/gemm.cu calls them (through dlopen/dlsym).
 * Returns the number of failed checks.
 *
 * Accuracy bound (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
 * eq. 3.5): an fp32 dot product of length K summed in any fixed order satisfies
 *   |d - d_exact| <= gamma_K * sum_p |a_ip||b_pj|,  gamma_K = K u / (1 - K u), u = 2^-24.
 * With alpha, beta powers of two (exact scalings) and one more addition for beta C:
 *   |d - d_exact| <= gamma_{K+1} * (|alpha| sum_p |a_ip||b_pj| + |beta||c_ij|).
 * bf16 inputs: their products are exact in fp32, so the same bound holds against the
 * bf16 values; a bf16 D adds one rounding of 2^-8 relative. d_exact is computed in
 * double from the same (rounded) inputs. */
#define _POSIX_C_SOURCE 200809L
#include <cublasLt.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu_internal.h"
#include "runtime_check.h"

#define MT_LT_FUNCS(X)                                                                    \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                 \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
#define PTR(f) __typeof__(&f) f;
static struct { MT_LT_FUNCS(PTR) } lt;
#undef PTR

static double gamma_n(double n) {
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

/* dlopen as gemm.cu does; checks every symbol is ours and the real library stays out. */
static void test_dlopen(void) {
    void *h = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen: %s", dlerror());
#define SYM(f)                                                                            \
    lt.f = (__typeof__(lt.f))dlsym(h, #f);                                                \
    CHECK(lt.f == &f, "dlsym(%s) is not the emulator's", #f);
    MT_LT_FUNCS(SYM)
#undef SYM
    CHECK(dlsym(h, "cublasLtNoSuchCall") == NULL, "unknown symbol resolved");
    const char *e = dlerror();
    CHECK(e && strstr(e, "cublasLtNoSuchCall"), "dlerror: %s", e ? e : "(null)");
    CHECK(dlerror() == NULL, "dlerror not cleared");
    void *m = dlopen("libm.so.6", RTLD_NOW); /* other libraries: the real loader */
    CHECK(m && dlsym(m, "cos") != NULL, "real dlopen of libm");
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int mapped = 0;
    while (f && fgets(line, sizeof line, f)) mapped |= strstr(line, "libcublasLt") != NULL;
    if (f) fclose(f);
    CHECK(f && !mapped, "the toolkit's libcublasLt is mapped into the process");
}

typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

/* Descriptors for D[m,n] = op(A) op(B) (+ C) with A stored rows x cols = (ta ? k x m : m x k). */
static cublasStatus_t make_plan(cublasLtHandle_t h, plan *p, int ta, int tb, cudaDataType_t tin, cudaDataType_t tout,
                                int m, int n, int k, int lda, int ldb, int ldc, size_t ws) {
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt.cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa);
    lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob);
    lt.cublasLtMatrixLayoutCreate(&p->la, tin, ta ? k : m, ta ? m : k, lda);
    lt.cublasLtMatrixLayoutCreate(&p->lb, tin, tb ? n : k, tb ? k : n, ldb);
    lt.cublasLtMatrixLayoutCreate(&p->lc, tout, m, n, ldc);
    cublasLtMatmulPreference_t pref;
    lt.cublasLtMatmulPreferenceCreate(&pref);
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &(uint64_t){ws}, 8);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t s = lt.cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &r, &found);
    lt.cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found != 1) s = CUBLAS_STATUS_INTERNAL_ERROR;
    p->algo = r.algo;
    return s;
}

static void free_plan(plan *p) {
    lt.cublasLtMatrixLayoutDestroy(p->la);
    lt.cublasLtMatrixLayoutDestroy(p->lb);
    lt.cublasLtMatrixLayoutDestroy(p->lc);
    lt.cublasLtMatmulDescDestroy(p->desc);
}

static float bf16_round(float x) { /* RNE, as the emulator's store */
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void *to_device(const float *h, size_t n, int bf16) {
    void *d = NULL;
    uint16_t *b = malloc(n * 2 + 2);
    for (size_t i = 0; i < n && bf16; i++) {
        uint32_t u;
        memcpy(&u, &h[i], 4);
        b[i] = (uint16_t)(u >> 16); /* h already holds bf16 values */
    }
    cudaMalloc(&d, n * (bf16 ? 2 : 4));
    cudaMemcpy(d, bf16 ? (void *)b : (const void *)h, n * (bf16 ? 2 : 4), cudaMemcpyHostToDevice);
    free(b);
    return d;
}

/* One GEMM against the fp64 reference; returns the worst err / bound. */
static double check_gemm(cublasLtHandle_t h, void *ws, int ta, int tb, int m, int n, int k, int pad, float alpha,
                         float beta, int bf16_in, int bf16_out) {
    const int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad + 1, ldc = m + 2 * pad + 1;
    const size_t na = (size_t)lda * (ta ? m : k), nb = (size_t)ldb * (tb ? k : n), nc = (size_t)ldc * n;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *D = malloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = (float)(rand() % 2001 - 1000) / 777.0f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)(rand() % 2001 - 1000) / 333.0f;
    for (size_t i = 0; i < nc; i++) C[i] = beta == 0.0f ? NAN : (float)(rand() % 201 - 100) / 7.0f;
    if (bf16_in) {
        for (size_t i = 0; i < na; i++) A[i] = bf16_round(A[i]);
        for (size_t i = 0; i < nb; i++) B[i] = bf16_round(B[i]);
    }
    for (size_t i = 0; i < nc && bf16_out; i++) C[i] = bf16_round(C[i]);
    void *dA = to_device(A, na, bf16_in), *dB = to_device(B, nb, bf16_in), *dC = to_device(C, nc, bf16_out);
    plan p;
    double worst = INFINITY;
    const cudaDataType_t tin = bf16_in ? CUDA_R_16BF : CUDA_R_32F, tout = bf16_out ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t s = make_plan(h, &p, ta, tb, tin, tout, m, n, k, lda, ldb, ldc, 1 << 20);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.cublasLtMatmul(h, p.desc, &alpha, dA, p.la, dB, p.lb, &beta, dC, p.lc, dC, p.lc, &p.algo, ws, 1 << 20, 0);
    CHECK(s == CUBLAS_STATUS_SUCCESS, "gemm ta %d tb %d: %s", ta, tb, cublasLtGetStatusString(s));
    if (s == CUBLAS_STATUS_SUCCESS) {
        worst = 0.0;
        if (bf16_out) { /* widen the bf16 result */
            uint16_t *b = malloc(nc * 2);
            cudaMemcpy(b, dC, nc * 2, cudaMemcpyDeviceToHost);
            for (size_t i = 0; i < nc; i++) {
                uint32_t u = (uint32_t)b[i] << 16;
                memcpy(&D[i], &u, 4);
            }
            free(b);
        } else {
            cudaMemcpy(D, dC, nc * 4, cudaMemcpyDeviceToHost);
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double ref = 0.0, mag = 0.0;
                for (int q = 0; q < k; q++) {
                    const double a = A[ta ? q + (size_t)i * lda : i + (size_t)q * lda];
                    const double b = B[tb ? j + (size_t)q * ldb : q + (size_t)j * ldb];
                    ref += a * b;
                    mag += fabs(a * b);
                }
                const double c = beta == 0.0f ? 0.0 : C[i + (size_t)j * ldc];
                ref = alpha * ref + beta * c;
                double bound = gamma_n(k + 1) * (fabs(alpha) * mag + fabs(beta) * fabs(c));
                if (bf16_out) bound += ldexp(1.0, -8) * (fabs(ref) + bound);
                const double err = fabs(D[i + (size_t)j * ldc] - ref);
                const double r = err / (bound > 0 ? bound : 1e-300);
                if (!(r <= worst)) worst = r; /* NaN propagates */
            }
        free_plan(&p);
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    free(A), free(B), free(C), free(D);
    return worst;
}

static void test_gemm(cublasLtHandle_t h, void *ws) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            double w = check_gemm(h, ws, ta, tb, 37, 29, 211, 3, 1.0f, 0.0f, 0, 0);
            CHECK(w <= 1.0, "fp32 ta %d tb %d beta 0: error %.3g x the bound (or NaN from C)", ta, tb, w);
            w = check_gemm(h, ws, ta, tb, 17, 40, 64, 0, 2.0f, 0.5f, 0, 0);
            CHECK(w <= 1.0, "fp32 ta %d tb %d alpha 2 beta 0.5: error %.3g x the bound", ta, tb, w);
            w = check_gemm(h, ws, ta, tb, 33, 9, 130, 1, 1.0f, 0.0f, 1, 0);
            CHECK(w <= 1.0, "bf16->fp32 ta %d tb %d: error %.3g x the bound", ta, tb, w);
            w = check_gemm(h, ws, ta, tb, 12, 19, 77, 2, 1.0f, 1.0f, 1, 1);
            CHECK(w <= 1.0, "bf16->bf16 ta %d tb %d: error %.3g x the bound", ta, tb, w);
        }
}

static void test_rejects(cublasLtHandle_t h, void *ws) {
    plan p;
    const float one = 1.0f, zero = 0.0f;
    void *dA = NULL, *dB = NULL, *dC = NULL;
    cudaMalloc(&dA, 64 * 64 * 4), cudaMalloc(&dB, 64 * 64 * 4), cudaMalloc(&dC, 64 * 64 * 4);
    /* ld < rows */
    CHECK_EQ_INT(make_plan(h, &p, 0, 0, CUDA_R_32F, CUDA_R_32F, 8, 8, 8, 7, 8, 8, 0), CUBLAS_STATUS_INVALID_VALUE);
    free_plan(&p);
    CHECK_EQ_INT(make_plan(h, &p, 0, 0, CUDA_R_32F, CUDA_R_32F, 8, 8, 8, 8, 8, 8, 0), CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t bad;
    lt.cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 8, 8, 4); /* ld 4 < 8 rows, used as D */
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, bad, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    lt.cublasLtMatrixLayoutDestroy(bad);
    /* k of op(A) 8, k of op(B) 9; C with the wrong column count */
    cublasLtMatrixLayout_t b9, c7;
    lt.cublasLtMatrixLayoutCreate(&b9, CUDA_R_32F, 9, 8, 9);
    lt.cublasLtMatrixLayoutCreate(&c7, CUDA_R_32F, 8, 7, 8);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, b9, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, c7, dC, c7, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, c7, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    lt.cublasLtMatrixLayoutDestroy(b9);
    lt.cublasLtMatrixLayoutDestroy(c7);
    /* mixed input types; TF32 compute; NULL handle / descriptor / alpha */
    cublasLtMatrixLayout_t bf;
    lt.cublasLtMatrixLayoutCreate(&bf, CUDA_R_16BF, 8, 8, 8);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, bf, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, bf, dB, bf, &zero, dC, bf, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    lt.cublasLtMatrixLayoutDestroy(bf);
    cublasLtMatmulDesc_t tf32;
    lt.cublasLtMatmulDescCreate(&tf32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, tf32, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    lt.cublasLtMatmulDescDestroy(tf32);
    CHECK_EQ_INT(lt.cublasLtMatmul(NULL, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, NULL, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, NULL, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    free_plan(&p);
    /* a workspace smaller than the algorithm asks (min(1 MiB, preference) = 4096 here) */
    CHECK_EQ_INT(make_plan(h, &p, 0, 0, CUDA_R_32F, CUDA_R_32F, 8, 8, 8, 8, 8, 8, 4096), CUBLAS_STATUS_SUCCESS);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, &p.algo, ws, 4095, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, &p.algo, ws, 4096, 0),
                 CUBLAS_STATUS_SUCCESS);
    /* a pointer less aligned than the default 256-byte preference */
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, (char *)dA + 16, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, &p.algo,
                                   ws, 4096, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(cudaemu_sticky_error(), cudaSuccess);
    /* an operand outside device memory: INVALID_VALUE and a sticky illegal address */
    float host[64];
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, host, p.la, dB, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(cudaemu_sticky_error(), cudaErrorIllegalAddress);
    CHECK(strstr(cudaGetErrorString(cudaErrorIllegalAddress), "cublasLtMatmul: A"), "%s",
          cudaGetErrorString(cudaErrorIllegalAddress));
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaDeviceReset(), cudaSuccess);
    void *small = NULL;
    cudaMalloc(&small, 8 * 8 * 4 - 4), cudaMalloc(&dA, 256), cudaMalloc(&dC, 256);
    CHECK_EQ_INT(lt.cublasLtMatmul(h, p.desc, &one, dA, p.la, small, p.lb, &zero, dC, p.lc, dC, p.lc, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_INT(cudaemu_sticky_error(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaDeviceReset(), cudaSuccess);
    free_plan(&p);
}

int main(void) {
    setenv("CUDAEMU_QUIET", "1", 1);
    srand(12345);
    test_dlopen();
    if (!lt.cublasLtCreate || !lt.cublasLtMatmul) return 1;
    cublasLtHandle_t h = NULL;
    CHECK_EQ_INT(lt.cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    void *ws = NULL;
    CHECK_EQ_INT(cudaMalloc(&ws, 1 << 20), cudaSuccess);
    test_gemm(h, ws);
    test_rejects(h, ws);
    CHECK_EQ_INT(lt.cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
    CHECK_EQ_INT(cublasLtDestroy(NULL), CUBLAS_STATUS_NOT_INITIALIZED);
    printf("test_runtime_cublaslt: %d failure(s)\n", g_failures);
    return g_failures != 0;
}
