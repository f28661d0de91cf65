/* tests/cudaemu/include/cuda_runtime.h: the CUDA runtime API of the CPU emulator.
 *
 * "Device" memory is host memory in a table of allocations (tests/cudaemu/src/runtime.cpp),
 * so the kernels/cuda .cu files, parallel/comm_nccl.c and tests compile unchanged against it.
 * Names, enumerator values and signatures follow CUDA 13's cuda_runtime_api.h and
 * driver_types.h; only the subset meshtrain calls exists, and cudaDeviceProp holds only
 * the fields listed here (source-compatible, not ABI-compatible).
 *
 * Everything runs synchronously on the calling thread: streams and events are
 * bookkeeping with handle validation, and an "asynchronous" call has finished when it
 * returns. Error model as on a real device:
 *  - a call's own failure returns its code and sets the calling thread's last error;
 *  - a sticky (context) error, recorded by the device half for a kernel fault or by the
 *    CPU cuBLASLt for an out-of-range pointer, is returned by every later call that uses
 *    the context (memory, copies, streams, events, synchronisation, function attributes;
 *    not the device queries) until cudaDeviceReset; cudaGetLastError returns it without
 *    clearing it;
 *  - non-sticky errors recorded by the device half (bad launch configurations) are seen
 *    only by cudaGetLastError / cudaPeekAtLastError, as on a real device;
 *  - cudaGetErrorString(e) gives the emulator's detailed message (the call, sizes, the
 *    allocation, or the kernel and .cu file:line) while e is the latest error recorded,
 *    else the standard text. Each detailed message is printed once to stderr with a
 *    "cudaemu:" prefix unless CUDAEMU_QUIET=1.
 * Environment: CUDAEMU_DEVICES=n (device count, default 1; 0 -> cudaErrorNoDevice),
 * CUDAEMU_MEM_GIB=g (device memory, default 141), CUDAEMU_FILL=0 (zero-fill fresh memory
 * instead of 0xFF bytes, i.e. NaN floats), CUDAEMU_QUIET=1, CUDAEMU_HOST_ACCESS=trap|allow
 * (host code touching cudaMalloc memory aborts | works; README.md). */
#ifndef CUDAEMU_CUDA_RUNTIME_H
#define CUDAEMU_CUDA_RUNTIME_H

#include <stddef.h>

#include "cudaemu_dl.h"
#include "cudaemu_types.h"

#define CUDART_VERSION 13000

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4 /* direction inferred from the pointers */
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1, /* cudaMallocHost or cudaHostRegister */
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

/* What cudaPointerGetAttributes reports (the CUDA 13 struct). */
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;         /* 0 */
    void *devicePointer; /* the pointer itself for device/managed/host-registered memory, else NULL */
    void *hostPointer;   /* the pointer itself for host/managed memory, else NULL */
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrTotalConstantMemory = 9,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMaxRegistersPerBlock = 12,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrConcurrentKernels = 31,
    cudaDevAttrPciBusId = 33,
    cudaDevAttrGlobalMemoryBusWidth = 37,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrUnifiedAddressing = 41,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxRegistersPerMultiprocessor = 82,
    cudaDevAttrManagedMemory = 83,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

/* An H200-like sm_90 device (sizes in bytes). Only these fields exist. */
struct cudaDeviceProp {
    char name[256];                   /* "cudaemu H200 (CPU emulation)" */
    size_t totalGlobalMem;            /* CUDAEMU_MEM_GIB GiB */
    size_t sharedMemPerBlock;         /* 48 KiB: the default dynamic + static limit */
    size_t sharedMemPerBlockOptin;    /* 227 KiB: the cudaFuncSetAttribute ceiling */
    size_t sharedMemPerMultiprocessor; /* 228 KiB */
    size_t totalConstMem;             /* 64 KiB */
    int regsPerBlock, regsPerMultiprocessor; /* 65536 */
    int warpSize;                     /* 32 */
    int maxThreadsPerBlock;           /* 1024 */
    int maxThreadsDim[3];             /* 1024, 1024, 64 */
    int maxGridSize[3];               /* 2^31-1, 65535, 65535 */
    int maxThreadsPerMultiProcessor;  /* 2048 */
    int multiProcessorCount;          /* 132 */
    int major, minor;                 /* 9, 0 */
    int l2CacheSize;                  /* 50 MiB */
    int memoryBusWidth;               /* 6144 bits */
    int concurrentKernels, unifiedAddressing, managedMemory; /* 1 */
    int pciBusID, pciDeviceID, pciDomainID; /* the device index, 0, 0 */
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)    /* valid everywhere a stream is */
#define cudaStreamPerThread ((cudaStream_t)0x2) /* valid everywhere a stream is */
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02 /* cudaEventElapsedTime refuses such events */
#define cudaHostAllocDefault 0x00
#define cudaHostRegisterDefault 0x00
#define cudaMemAttachGlobal 0x01

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---- */
/* The last error of this thread, then reset to cudaSuccess (a sticky error stays). */
cudaError_t cudaGetLastError(void);
/* The last error of this thread (or the sticky error), not reset. */
cudaError_t cudaPeekAtLastError(void);
/* The detailed message of `e` while it is the latest recorded error, else the standard
 * text ("invalid argument", ...); never NULL; valid until a few later calls. */
const char *cudaGetErrorString(cudaError_t e);
/* The enumerator's name ("cudaErrorInvalidValue"); "unrecognized error code" otherwise. */
const char *cudaGetErrorName(cudaError_t e);

/* ---- devices ---- */
/* *count = CUDAEMU_DEVICES (default 1); cudaErrorNoDevice (count 0) when it is 0. */
cudaError_t cudaGetDeviceCount(int *count);
/* Select the calling thread's device; cudaErrorInvalidDevice outside [0, count). */
cudaError_t cudaSetDevice(int device);
/* The calling thread's device (0 unless set). */
cudaError_t cudaGetDevice(int *device);
/* Fill `prop` (see struct cudaDeviceProp); cudaErrorInvalidDevice for a bad index. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
/* One attribute of the description above; cudaErrorInvalidValue for others. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
/* Returns the sticky error, else cudaSuccess (all work is already done). */
cudaError_t cudaDeviceSynchronize(void);
/* Destroy the context: free every allocation, stream, event and function attribute,
 * clear the sticky and last errors. */
cudaError_t cudaDeviceReset(void);
/* 13000 both. */
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);

/* ---- memory ---- */
/* `bytes` of device memory, every byte cudaemu_fill_byte(); *p = NULL for 0 bytes.
 * cudaErrorMemoryAllocation past CUDAEMU_MEM_GIB or when the host refuses. With
 * CUDAEMU_HOST_ACCESS=trap (the default) page-aligned in an arena that host code cannot
 * read or write (src/hostaccess.cpp: it aborts naming the access); with allow 256-byte
 * aligned on the heap, exactly `bytes` under AddressSanitizer so overruns are reported. */
cudaError_t cudaMalloc(void **p, size_t bytes);
/* Managed memory: a device allocation that is also cudaMemoryTypeManaged. */
cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags);
/* Free a cudaMalloc/cudaMallocManaged pointer (NULL: no-op); anything else (interior,
 * freed, host) -> cudaErrorInvalidValue naming the pointer. */
cudaError_t cudaFree(void *p);
/* Pinned host memory (cudaMemoryTypeHost); not filled. */
cudaError_t cudaMallocHost(void **p, size_t bytes);
/* Free a cudaMallocHost pointer; anything else -> cudaErrorInvalidValue. */
cudaError_t cudaFreeHost(void *p);
/* Mark [p, p + bytes) as registered host memory; overlapping a registered range ->
 * cudaErrorHostMemoryAlreadyRegistered; device memory -> cudaErrorInvalidValue. */
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags);
/* Unregister a range's base pointer; else cudaErrorHostMemoryNotRegistered. */
cudaError_t cudaHostUnregister(void *p);
/* *free_bytes = CUDAEMU_MEM_GIB GiB minus live device bytes, *total_bytes = the total. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
/* The kind of memory `p` points into (unregistered for plain host memory). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p);

/* Copy `bytes`. The device side of `kind` must be a live allocation covering the whole
 * range and the host side must not be device memory (cudaMemcpyDefault infers each
 * side); otherwise cudaErrorInvalidValue with a message naming the call, the sizes and
 * the allocation. A kind outside the enum -> cudaErrorInvalidMemcpyDirection. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
/* cudaMemcpy after validating `stream` (cudaErrorInvalidResourceHandle). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
/* `height` rows of `width` bytes with row pitches dpitch / spitch (bytes); a width over
 * a pitch -> cudaErrorInvalidPitchValue; ranges checked as cudaMemcpy. */
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind);
/* Set `bytes` of device memory to (unsigned char)value; range checked as cudaMemcpy. */
cudaError_t cudaMemset(void *p, int value, size_t bytes);
/* cudaMemset after validating `stream`. */
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);

/* ---- streams and events (bookkeeping: all work is already done) ---- */
/* A new stream; flags cudaStreamDefault or cudaStreamNonBlocking, else InvalidValue. */
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
/* Destroy a created stream; 0, legacy, per-thread or unknown -> InvalidResourceHandle. */
cudaError_t cudaStreamDestroy(cudaStream_t s);
/* cudaSuccess (or the sticky error) for a valid stream. */
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
/* Validates both handles; flags must be 0. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
/* A new event; flags from cudaEventDefault / BlockingSync / DisableTiming. */
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
/* Destroy an event; unknown -> cudaErrorInvalidResourceHandle. */
cudaError_t cudaEventDestroy(cudaEvent_t e);
/* Take the host clock now (the event "completes" at once). */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
/* cudaSuccess for a valid event, recorded or not (as CUDA). */
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
/* Milliseconds of host time between two recordings; an event never recorded or made
 * with cudaEventDisableTiming -> cudaErrorInvalidResourceHandle. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- kernels ---- */
/* Record `value` bytes as the dynamic shared memory limit of kernel `func` (read back
 * by the device half with cudaemu_func_max_dynamic_smem); above 227 KiB or negative ->
 * cudaErrorInvalidValue; NULL func -> cudaErrorInvalidDeviceFunction. The carveout
 * attribute (0..100 or -1) is accepted and ignored. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}
/* C++ takes the kernel itself, as the real header's template does. */
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)func, attr, value);
}
#endif

/* The device language (threadIdx, __syncthreads, <<<>>>, ...) comes with the real
 * cuda_runtime.h, so the emulator's prelude comes with this one. */
#if defined(__cplusplus) && defined(__has_include)
#if __has_include("cudaemu.h")
#include "cudaemu.h"
#endif
#endif

#endif
