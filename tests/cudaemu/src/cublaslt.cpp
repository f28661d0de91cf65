/* tests/cudaemu/src/cublaslt.cpp: the CPU cuBLASLt of the emulator (contract and
 * numerics: include/cublasLt.h).
 *
 * The product: op(A) is packed once into fp32 panels of 8 rows (bf16 widened exactly),
 * op(B) four columns at a time; each 8 x 4 block of D is then summed in registers (GCC
 * vector extensions, one lane per row): for p = 0..k-1 in order,
 * acc[i][j] += opA[i][p] * opB[p][j] in fp32, starting from 0. Every D element is thus
 * a recursive sum in a fixed order that depends only on k (a separate multiply and add,
 * unless the build enables FMA contraction, e.g. -march with FMA; either way the order
 * is fixed and |error| <= gamma_k sum|a||b|, Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., eq. 3.5). Then D = alpha acc (+ beta C). */
#include <cublasLt.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cudaemu_internal.h"

extern "C" int cudaemu_stream_valid(cudaStream_t s); /* runtime.cpp */

namespace {
constexpr uint32_t kMagic = 0x4c54454d; /* marks live handles and descriptors */
constexpr uint64_t kAlgoTag = 0x63756461656d75ull;
constexpr uint64_t kAlgoWorkspace = 1u << 20;
} // namespace

struct cublasLtContext {
    uint32_t magic;
};
struct cudaemu_lt_desc {
    uint32_t magic;
    int compute, scale, pointer_mode, ta, tb;
    uint32_t epilogue;
};
struct cudaemu_lt_layout {
    uint32_t magic;
    int type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cudaemu_lt_pref {
    uint32_t magic;
    uint64_t max_ws;
    uint32_t align[4]; /* A, B, C, D in bytes */
};

namespace {

bool quiet() {
    cudaemu_env_check();
    const char *v = getenv("CUDAEMU_QUIET");
    return v && strcmp(v, "1") == 0;
}

/* Returns `s` after printing why (the real library is silent; this is for the reader). */
cublasStatus_t lt_fail(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t lt_fail(cublasStatus_t s, const char *fmt, ...) {
    if (quiet()) return s;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudaemu: %s -> %s\n", buf, cublasLtGetStatusString(s));
    return s;
}

size_t elem_size(int type) { return type == CUDA_R_16BF ? 2 : 4; }

/* Elements spanned by a layout: (cols - 1) * ld + rows, 0 when empty. */
uint64_t extent(const cudaemu_lt_layout *l) { return l->rows && l->cols ? (l->cols - 1) * (uint64_t)l->ld + l->rows : 0; }

struct Problem {
    uint64_t m, n, k;
};

/* Checks shared by the heuristic and the matmul. */
cublasStatus_t validate(const char *call, cublasLtHandle_t h, cublasLtMatmulDesc_t d, const cudaemu_lt_layout *const l[4],
                        Problem *pr) {
    static const char *nm = "ABCD";
    if (!h || h->magic != kMagic) return lt_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle not created", call);
    if (!d || d->magic != kMagic) return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: NULL or dead matmul descriptor", call);
    for (int i = 0; i < 4; i++) {
        if (!l[i] || l[i]->magic != kMagic)
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: NULL or dead layout %c", call, nm[i]);
        if (l[i]->ld < (int64_t)l[i]->rows || l[i]->ld < 1)
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: layout %c has ld %lld < rows %llu", call, nm[i],
                           (long long)l[i]->ld, (unsigned long long)l[i]->rows);
    }
    if ((d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC) || d->scale != CUDA_R_32F)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: compute type %d / scale type %d (only COMPUTE_32F, R_32F)", call,
                       d->compute, d->scale);
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST || d->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: only host pointer mode and the default epilogue", call);
    const int ta = l[0]->type, tc = l[2]->type;
    const bool types_ok = ta == l[1]->type && tc == l[3]->type &&
                          ((ta == CUDA_R_32F && tc == CUDA_R_32F) ||
                           (ta == CUDA_R_16BF && (tc == CUDA_R_16BF || tc == CUDA_R_32F)));
    if (!types_ok)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: types A %d B %d C %d D %d not supported", call, ta, l[1]->type,
                       tc, l[3]->type);
    const uint64_t m = d->ta ? l[0]->cols : l[0]->rows, k = d->ta ? l[0]->rows : l[0]->cols;
    const uint64_t kb = d->tb ? l[1]->cols : l[1]->rows, n = d->tb ? l[1]->rows : l[1]->cols;
    if (k != kb || l[2]->rows != m || l[2]->cols != n || l[3]->rows != m || l[3]->cols != n)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE,
                       "%s: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu do not agree", call,
                       (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb, (unsigned long long)n,
                       (unsigned long long)l[2]->rows, (unsigned long long)l[2]->cols, (unsigned long long)l[3]->rows,
                       (unsigned long long)l[3]->cols);
    *pr = Problem{m, n, k};
    return CUBLAS_STATUS_SUCCESS;
}

inline float load(const void *p, int type, uint64_t i) {
    if (type == CUDA_R_32F) return static_cast<const float *>(p)[i];
    uint32_t u = (uint32_t) static_cast<const uint16_t *>(p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

inline void store(void *p, int type, uint64_t i, float v) {
    if (type == CUDA_R_32F) {
        static_cast<float *>(p)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    static_cast<uint16_t *>(p)[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFF : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

typedef float v8f __attribute__((vector_size(32))); /* 8 fp32 lanes; lane l = row i0 + l */

void compute(const Problem &pr, int ta, int tb, float alpha, const void *A, const cudaemu_lt_layout *la, const void *B,
             const cudaemu_lt_layout *lb, float beta, const void *C, const cudaemu_lt_layout *lc, void *D,
             const cudaemu_lt_layout *ld) {
    const uint64_t m = pr.m, n = pr.n, k = pr.k, panels = (m + 7) / 8;
    /* op(A) in panels of 8 rows: a[(panel k + p) 8 + l] = opA(8 panel + l, p), rows past m are 0 */
    std::vector<v8f> a(panels * k);
    for (uint64_t i = 0; i < panels * 8; i++)
        for (uint64_t p = 0; p < k; p++)
            a[(i / 8) * k + p][i % 8] = i < m ? load(A, la->type, ta ? p + i * la->ld : i + p * la->ld) : 0.0f;
    std::vector<float> b(k * 4);
    for (uint64_t j0 = 0; j0 < n; j0 += 4) {
        const int nb = (int)(n - j0 < 4 ? n - j0 : 4);
        for (uint64_t p = 0; p < k; p++) /* b[4 p + q] = opB(p, j0 + q), 0 past n */
            for (int q = 0; q < 4; q++)
                b[4 * p + q] = q < nb ? load(B, lb->type, tb ? (j0 + q) + p * lb->ld : p + (j0 + q) * lb->ld) : 0.0f;
        for (uint64_t pa = 0; pa < panels; pa++) {
            v8f acc[4] = {}; /* each lane: one D element's sum, in increasing p */
            const v8f *ap = a.data() + pa * k;
            const float *bp = b.data();
            for (uint64_t p = 0; p < k; p++, bp += 4) {
                const v8f av = ap[p];
                acc[0] += av * bp[0];
                acc[1] += av * bp[1];
                acc[2] += av * bp[2];
                acc[3] += av * bp[3];
            }
            for (int q = 0; q < nb; q++)
                for (uint64_t l = 0; l < 8 && pa * 8 + l < m; l++) {
                    const uint64_t i = pa * 8 + l, j = j0 + q;
                    float v = alpha * acc[q][l];
                    if (beta != 0.0f) v += beta * load(C, lc->type, i + j * lc->ld);
                    store(D, ld->type, i + j * ld->ld, v);
                }
        }
    }
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext{kMagic};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle || handle->magic != kMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
#define N(x) case x: return #x;
    N(CUBLAS_STATUS_SUCCESS) N(CUBLAS_STATUS_NOT_INITIALIZED) N(CUBLAS_STATUS_ALLOC_FAILED)
    N(CUBLAS_STATUS_INVALID_VALUE) N(CUBLAS_STATUS_ARCH_MISMATCH) N(CUBLAS_STATUS_MAPPING_ERROR)
    N(CUBLAS_STATUS_EXECUTION_FAILED) N(CUBLAS_STATUS_INTERNAL_ERROR) N(CUBLAS_STATUS_NOT_SUPPORTED)
    N(CUBLAS_STATUS_LICENSE_ERROR)
#undef N
    }
    return "<unknown>";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new cudaemu_lt_desc{kMagic, (int)compute, (int)scale, CUBLASLT_POINTER_MODE_HOST, 0, 0, CUBLASLT_EPILOGUE_DEFAULT};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    if (!desc || desc->magic != kMagic) return CUBLAS_STATUS_INVALID_VALUE;
    desc->magic = 0;
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    if (!desc || desc->magic != kMagic || !buf || size != 4)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute(%d): bad descriptor, buffer or size %zu",
                       (int)attr, size);
    int32_t v;
    memcpy(&v, buf, 4);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: desc->compute = v; break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: desc->scale = v; break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: desc->pointer_mode = v; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: desc->epilogue = (uint32_t)v; break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (v < CUBLAS_OP_N || v > CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->ta : desc->tb) = v != CUBLAS_OP_N; /* C == T for real types */
        break;
    default: return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute: attribute %d not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new cudaemu_lt_layout{kMagic, (int)type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    if (!layout || layout->magic != kMagic) return CUBLAS_STATUS_INVALID_VALUE;
    layout->magic = 0;
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cudaemu_lt_pref{kMagic, 0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!pref || pref->magic != kMagic) return CUBLAS_STATUS_INVALID_VALUE;
    pref->magic = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    if (!pref || pref->magic != kMagic || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != 8) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&pref->max_ws, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (size != 4) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_SEARCH_MODE) return CUBLAS_STATUS_SUCCESS;
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        memcpy(&pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    }
    return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulPreferenceSetAttribute: attribute %d not emulated", (int)attr);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *count) {
    if (count) *count = 0;
    if (!count || !results || requested < 1 || !pref || pref->magic != kMagic)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: bad preference, results or count");
    const cudaemu_lt_layout *l[4] = {a, b, c, d};
    Problem pr;
    if (cublasStatus_t s = validate("cublasLtMatmulAlgoGetHeuristic", handle, desc, l, &pr)) return s;
    memset(&results[0], 0, sizeof results[0]);
    const uint64_t ws = pref->max_ws < kAlgoWorkspace ? pref->max_ws : kAlgoWorkspace;
    results[0].algo.data[0] = kAlgoTag;
    results[0].algo.data[1] = ws;
    for (int i = 0; i < 4; i++) results[0].algo.data[2 + i] = pref->align[i];
    results[0].workspaceSize = ws;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t adesc, const void *B, cublasLtMatrixLayout_t bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t cdesc, void *D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    const cudaemu_lt_layout *l[4] = {adesc, bdesc, cdesc, ddesc};
    Problem pr;
    if (cublasStatus_t s = validate("cublasLtMatmul", handle, desc, l, &pr)) return s;
    if (!alpha || !beta) return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: NULL alpha or beta");
    if (C == D && (cdesc->ld != ddesc->ld || cdesc->type != ddesc->type))
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: C == D with different layouts");
    if (algo && algo->data[0] != kAlgoTag)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: algo not from cublasLtMatmulAlgoGetHeuristic");
    const uint64_t need_ws = algo ? algo->data[1] : 0;
    if (workspace_bytes < need_ws || (need_ws && !cudaemu_device_range(workspace, need_ws)))
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: workspace %p of %zu bytes, the algorithm needs %llu device bytes",
                       workspace, workspace_bytes, (unsigned long long)need_ws);
    if (!cudaemu_stream_valid(stream)) return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: stream %p not live", (void *)stream);
    if (cudaemu_sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED; /* a faulted context runs nothing */
    const float fa = *(const float *)alpha, fb = *(const float *)beta;
    if (pr.m == 0 || pr.n == 0) return CUBLAS_STATUS_SUCCESS;
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        if (i == 2 && fb == 0.0f) continue; /* C is not read */
        const size_t bytes = extent(l[i]) * elem_size(l[i]->type);
        if (bytes && !cudaemu_device_range(ptr[i], bytes)) {
            cudaemu_record_error(cudaErrorIllegalAddress, 1,
                                 "cublasLtMatmul: %c = [%p, +%zu bytes) (%llu x %llu, ld %lld) is not inside one device "
                                 "allocation",
                                 "ABCD"[i], ptr[i], bytes, (unsigned long long)l[i]->rows,
                                 (unsigned long long)l[i]->cols, (long long)l[i]->ld);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        const uint64_t al = algo ? algo->data[2 + i] : elem_size(l[i]->type);
        if (al && (uintptr_t)ptr[i] % al)
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: %c = %p is not %llu-byte aligned as the algorithm assumes",
                           "ABCD"[i], ptr[i], (unsigned long long)al);
    }
    cudaemu_device_access acc; /* A, B, C, D are device memory */
    compute(pr, desc->ta, desc->tb, fa, A, adesc, B, bdesc, fb, C, cdesc, D, ddesc);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
