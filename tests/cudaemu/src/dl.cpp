/* tests/cudaemu/src/dl.cpp: the dlopen shim (include/cudaemu_dl.h). A name containing
 * "libcublasLt" resolves to the emulator's CPU cuBLASLt (cublaslt.cpp) through a table,
 * so the toolkit's library is never mapped into the process; everything else is passed
 * to the real dl* functions. */
#ifndef CUDAEMU
#define CUDAEMU 1
#endif
#include <cublasLt.h>

#include <cstdio>
#include <cstring>

#undef dlopen
#undef dlsym
#undef dlerror
#undef dlclose

namespace {
char g_lt_handle;                     /* its address is the emulated library's handle */
thread_local const char *t_err;       /* pending message for cudaemu_dlerror */
thread_local char t_buf[256];

struct Sym {
    const char *name;
    void *fn;
};
#define S(f) {#f, (void *)&f},
const Sym kTable[] = {S(cublasLtCreate) S(cublasLtDestroy) S(cublasLtGetStatusString) S(cublasLtMatmul)
                      S(cublasLtMatmulAlgoGetHeuristic) S(cublasLtMatmulDescCreate) S(cublasLtMatmulDescDestroy)
                      S(cublasLtMatmulDescSetAttribute) S(cublasLtMatmulPreferenceCreate)
                      S(cublasLtMatmulPreferenceDestroy) S(cublasLtMatmulPreferenceSetAttribute)
                      S(cublasLtMatrixLayoutCreate) S(cublasLtMatrixLayoutDestroy)};
#undef S
} // namespace

extern "C" void *cudaemu_dlopen(const char *file, int mode) {
    if (file && strstr(file, "libcublasLt")) return &g_lt_handle;
    return dlopen(file, mode);
}

extern "C" void *cudaemu_dlsym(void *handle, const char *name) {
    if (handle != &g_lt_handle) return dlsym(handle, name);
    for (const Sym &s : kTable)
        if (name && strcmp(s.name, name) == 0) return s.fn;
    snprintf(t_buf, sizeof t_buf, "cudaemu: the emulated libcublasLt has no symbol %s", name ? name : "(null)");
    t_err = t_buf;
    return nullptr;
}

extern "C" char *cudaemu_dlerror(void) {
    if (t_err) {
        t_err = nullptr;
        return t_buf;
    }
    return dlerror();
}

extern "C" int cudaemu_dlclose(void *handle) { return handle == &g_lt_handle ? 0 : dlclose(handle); }
