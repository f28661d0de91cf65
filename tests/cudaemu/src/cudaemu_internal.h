/* tests/cudaemu/src/cudaemu_internal.h: the contract between the emulator's runtime
 * half (runtime.cpp: device memory table, errors, streams; owner: the runtime API) and
 * its device half (launch.cpp, fibers: threads, barriers, warps, shared memory).
 * Not installed, not seen by kernels/cuda code. */
#ifndef CUDAEMU_INTERNAL_H
#define CUDAEMU_INTERNAL_H

#include <stddef.h>

#include "cudaemu_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- provided by the runtime half ---- */

/* 1 if [p, p + bytes) lies inside one live device allocation (cudaMalloc), else 0. */
int cudaemu_device_range(const void *p, size_t bytes);

/* 1 if p points into a live device allocation (or is one past its end), else 0. */
int cudaemu_is_device_ptr(const void *p);

/* 1 if a kernel may dereference p: a device pointer (cudaemu_is_device_ptr), or a
 * pointer into live page-locked memory from cudaMallocHost / cudaHostAlloc, which
 * unified addressing makes directly accessible from every device (CUDA Runtime API,
 * "Unified Addressing"); memory from cudaHostRegister and pageable memory are not. */
int cudaemu_is_kernel_accessible(const void *p);

/* Record an error from the device half (a kernel fault or a bad launch). `e` becomes
 * the value cudaGetLastError / cudaPeekAtLastError / the next synchronising call
 * return; `sticky` != 0 makes it a context error that every later call returns, as
 * a real device fault (cudaErrorIllegalAddress, cudaErrorLaunchFailure) does. The
 * formatted message (naming kernel and .cu file:line) is printed to stderr once and
 * is what cudaGetErrorString(e) returns while this error is current. */
void cudaemu_record_error(cudaError_t e, int sticky, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The current sticky error (cudaSuccess when none): a launch after a fault does nothing. */
cudaError_t cudaemu_sticky_error(void);

/* The dynamic shared memory limit set for `func` with cudaFuncSetAttribute(func,
 * cudaFuncAttributeMaxDynamicSharedMemorySize, v); 0 when never set. */
size_t cudaemu_func_max_dynamic_smem(const void *func);

/* Check every CUDAEMU_* environment variable once (src/env.cpp): a value out of its
 * range or an unknown CUDAEMU_ name prints what is expected and exits the process with
 * code 2. Each reader of a variable calls it first. */
void cudaemu_env_check(void);

/* Byte value fresh device and shared memory is filled with (0xFF: every float is a
 * NaN, every double too), unless CUDAEMU_FILL=0 (zero fill). */
unsigned char cudaemu_fill_byte(void);

/* Device memory size in bytes (CUDAEMU_MEM_GIB, default 141 GiB). */
size_t cudaemu_mem_total(void);

/* ---- host access to device memory (src/hostaccess.cpp, CUDAEMU_HOST_ACCESS) ---- */

/* 1 when cudaMalloc memory is kept unreadable by host code (CUDAEMU_HOST_ACCESS=trap,
 * the default), 0 for allow; read once. */
int cudaemu_host_trap(void);

/* Trap mode: `bytes` (> 0) of device memory from the protected arena, page-aligned,
 * every byte of its pages set to `fill`; NULL when the arena is full or cannot be
 * reserved (printed). The first call reserves the arena and installs the SIGSEGV
 * handler. cudaemu_arena_free gives an arena allocation back (others are ignored). */
void *cudaemu_arena_alloc(size_t bytes, unsigned char fill);
void cudaemu_arena_free(void *p);

/* Every emulator entry point that reads or writes device bytes on the host (a kernel's
 * grid, copies, memsets, the CPU cuBLASLt) brackets that work with these: the device
 * allocations are readable and writable from the first open to the last close (a
 * process-wide count under a mutex; nesting and concurrent entries are fine). No-ops in
 * allow mode. Checks that only consult the allocation table need neither. */
void cudaemu_device_open(void);
void cudaemu_device_close(void);

#ifdef __cplusplus
}

/* The scope of one entry's device work (C++ users of the functions above). */
struct cudaemu_device_access {
    cudaemu_device_access() { cudaemu_device_open(); }
    ~cudaemu_device_access() { cudaemu_device_close(); }
    cudaemu_device_access(const cudaemu_device_access &) = delete;
    cudaemu_device_access &operator=(const cudaemu_device_access &) = delete;
};
#endif
#endif
