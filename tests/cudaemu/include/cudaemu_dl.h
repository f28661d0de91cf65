/* tests/cudaemu/include/cudaemu_dl.h: the dlopen shim of the CUDA emulator.
 *
 * kernels/cuda/gemm.cu loads cuBLASLt with dlopen("libcublasLt.so.<major>") and dlsym.
 * Under emulation (CUDAEMU defined by the emu build) that must reach the emulator's CPU
 * cuBLASLt (tests/cudaemu/src/cublaslt.cpp), never a toolkit library installed on the
 * machine. This header includes <dlfcn.h> first (so a later #include of it is a no-op)
 * and then renames dlopen / dlsym / dlerror / dlclose to the cudaemu_ versions below.
 * Included by cuda_runtime.h and cublasLt.h; does nothing unless CUDAEMU is defined. */
#ifndef CUDAEMU_DL_H
#define CUDAEMU_DL_H

#ifdef CUDAEMU
#include <dlfcn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dlopen: a name containing "libcublasLt" returns the emulator's library handle (no
 * file is loaded); any other name (or NULL) goes to the real dlopen. */
void *cudaemu_dlopen(const char *file, int mode);
/* dlsym: on the emulator's handle, the emulated cublasLt* function of that name, or
 * NULL with a message for cudaemu_dlerror; other handles go to the real dlsym. */
void *cudaemu_dlsym(void *handle, const char *name);
/* dlerror: the emulator's pending message (then cleared), else the real dlerror(). */
char *cudaemu_dlerror(void);
/* dlclose: 0 on the emulator's handle, else the real dlclose. */
int cudaemu_dlclose(void *handle);

#ifdef __cplusplus
}
#endif

#define dlopen cudaemu_dlopen
#define dlsym cudaemu_dlsym
#define dlerror cudaemu_dlerror
#define dlclose cudaemu_dlclose
#endif /* CUDAEMU */

#endif
