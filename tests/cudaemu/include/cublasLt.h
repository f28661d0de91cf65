/* tests/cudaemu/include/cublasLt.h: the CPU cuBLASLt of the CUDA emulator.
 *
 * Exactly the calls kernels/cuda/gemm.cu and bench/gpu_bench.c make, with cuBLASLt's
 * names, enumerator values (CUDA 13: cublas_api.h, cublasLt.h, library_types.h) and
 * column-major semantics: D = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n,
 * C and D m x n, each layout (type, rows, cols, ld) with element (i, j) at i + j * ld.
 *
 * Supported (anything else -> CUBLAS_STATUS_NOT_SUPPORTED): compute CUBLAS_COMPUTE_32F
 * or _32F_PEDANTIC, scale CUDA_R_32F, host pointer mode, the default epilogue, and
 *   A, B CUDA_R_32F  -> C, D CUDA_R_32F
 *   A, B CUDA_R_16BF -> C, D CUDA_R_16BF or CUDA_R_32F (C and D the same type).
 * Numerics (tests/cudaemu/src/cublaslt.cpp): every product is formed in fp32 and added
 * to an fp32 accumulator starting at 0 in increasing k order, then
 * D = alpha * acc (+ beta * C when beta != 0; C is not read when beta == 0, so NaN in C
 * does not propagate), rounded to bf16 (RNE) for a bf16 D. The result does not depend
 * on the algorithm, workspace or thread count: bitwise reproducible.
 *
 * Rejected as the real library does, with CUBLAS_STATUS_INVALID_VALUE: NULL handle,
 * descriptor, layout or alpha/beta; ld < rows; op(A), op(B), C and D shapes that do not
 * agree; C == D in memory with different layouts; a workspace smaller than the
 * algorithm's. Emulator checks (the real library would fault or misbehave later):
 *  - every matrix must lie inside one live device allocation (cudaemu_device_range);
 *    otherwise the call returns CUBLAS_STATUS_INVALID_VALUE *and* records a sticky
 *    cudaErrorIllegalAddress naming the operand, as the device fault a GPU would raise,
 *    so both the call site and the next synchronising CUDA call see it;
 *  - a pointer less aligned than the algorithm was chosen for (the preference's
 *    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256) -> INVALID_VALUE;
 *  - the algorithm from cublasLtMatmulAlgoGetHeuristic asks for min(MAX_WORKSPACE_BYTES,
 *    1 MiB) of workspace, which must be a device range of at least that size. */
#ifndef CUDAEMU_CUBLASLT_H
#define CUDAEMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime.h"
#include "cudaemu_dl.h"

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 0
#define CUBLAS_VER_PATCH 0
#define CUBLAS_VERSION (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_64F = 70
} cublasComputeType_t;

/* library_types.h */
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0, /* int32_t */
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,   /* int32_t */
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2, /* int32_t; only host (0) is supported */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,       /* int32_t cublasOperation_t */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,       /* int32_t cublasOperation_t */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7      /* uint32_t; only CUBLASLT_EPILOGUE_DEFAULT */
} cublasLtMatmulDescAttributes_t;

#define CUBLASLT_EPILOGUE_DEFAULT 1
#define CUBLASLT_POINTER_MODE_HOST 0

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,         /* uint32_t, accepted and ignored */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1, /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cudaemu_lt_desc *cublasLtMatmulDesc_t;
typedef struct cudaemu_lt_layout *cublasLtMatrixLayout_t;
typedef struct cudaemu_lt_pref *cublasLtMatmulPreference_t;

/* An algorithm as the heuristic returns it (semi-opaque, by value, as the real one). */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

/* One heuristic result (the real struct's layout). */
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize; /* bytes the algorithm needs */
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

#ifdef __cplusplus
extern "C" {
#endif

/* A library handle; INVALID_VALUE for a NULL out pointer. */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
/* Release it; NOT_INITIALIZED for NULL. */
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
/* "CUBLAS_STATUS_SUCCESS", ...; "<unknown>" for other values. */
const char *cublasLtGetStatusString(cublasStatus_t status);
/* A matmul descriptor (transposes N, host pointer mode, default epilogue). Types are
 * checked when used (NOT_SUPPORTED), as the real library does. */
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
/* Set one attribute from `buf` of `size` bytes (its type as listed above; a wrong size
 * -> INVALID_VALUE, an attribute not listed -> NOT_SUPPORTED). */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size);
/* A column-major layout: rows x cols elements of `type`, column stride `ld` elements. */
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
/* Heuristic preferences (workspace limit, pointer alignments). */
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size);
/* Validate the problem (statuses as cublasLtMatmul) and return one algorithm in
 * results[0] (*count = 1); *count = 0 on failure. */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *count);
/* D = alpha op(A) op(B) + beta C on the CPU (see the top of this file); alpha and beta
 * are host floats; algo NULL means no workspace; runs synchronously on `stream`. */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t adesc, const void *B, cublasLtMatrixLayout_t bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t cdesc, void *D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
