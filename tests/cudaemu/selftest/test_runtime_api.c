/* tests/cudaemu/selftest/test_runtime_api.c: the emulator's CUDA runtime API (memory
 * table, copies, error model, devices, streams, events, function attributes), in C, as
 * parallel/comm_nccl.c uses it. Returns the number of failed checks. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu_internal.h"
#include "runtime_check.h"

static void test_fill(void) {
    float *d = NULL, h[100];
    CHECK_EQ_INT(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    CHECK(((uintptr_t)d & 255) == 0, "cudaMalloc pointer %p not 256-byte aligned", (void *)d);
    CHECK_EQ_INT(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    int nan = 0;
    for (int i = 0; i < 100; i++) nan += isnan(h[i]) != 0;
    CHECK(nan == 100, "%d of 100 fresh floats are NaN", nan);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    setenv("CUDAEMU_FILL", "0", 1);
    CHECK_EQ_INT(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(h[0] == 0.0f && h[99] == 0.0f, "CUDAEMU_FILL=0: %g %g", h[0], h[99]);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    unsetenv("CUDAEMU_FILL");
    CHECK_EQ_INT(cudaMalloc((void **)&d, 0), cudaSuccess);
    CHECK(d == NULL, "cudaMalloc(0) gave %p", (void *)d);
}

static void test_copies(void) {
    float *d = NULL, h[128] = {0};
    CHECK_EQ_INT(cudaMalloc((void **)&d, 100 * sizeof(float)), cudaSuccess);
    /* one float past the end, from the start and from an interior pointer */
    CHECK_EQ_INT(cudaMemcpy(d, h, 101 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    const char *msg = cudaGetErrorString(cudaErrorInvalidValue);
    CHECK(strstr(msg, "cudaMemcpy(404 bytes)") && strstr(msg, "400 bytes") && strstr(msg, "4 bytes past"),
          "message: %s", msg);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(h, d + 50, 51 * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(h, d + 50, 50 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    /* directions that contradict the pointers */
    CHECK_EQ_INT(cudaMemcpy(h, h + 64, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(d, h, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(d, d + 10, 16, cudaMemcpyHostToHost), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(d, h, 16, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    /* cudaMemcpyDefault infers both sides; device to device */
    for (int i = 0; i < 100; i++) h[i] = (float)i;
    CHECK_EQ_INT(cudaMemcpyAsync(d, h, 100 * sizeof(float), cudaMemcpyDefault, 0), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(d, d + 50, 50 * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(h, d, 100 * sizeof(float), cudaMemcpyDefault), cudaSuccess);
    CHECK(h[0] == 50.0f && h[49] == 99.0f && h[50] == 50.0f, "copies: %g %g %g", h[0], h[49], h[50]);
    CHECK_EQ_INT(cudaMemcpy(d, h, 101 * sizeof(float), cudaMemcpyDefault), cudaErrorInvalidValue);
    /* memset */
    CHECK_EQ_INT(cudaMemsetAsync(d, 0, 100 * sizeof(float), 0), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(d + 1, 0, 100 * sizeof(float)), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemset(h, 0, 16), cudaErrorInvalidValue);
    /* 2D: 10 rows of 8 floats with a device pitch of 10 floats: the last row ends at 98 */
    CHECK_EQ_INT(cudaMemcpy2D(d, 40, h, 32, 32, 10, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy2D(d, 44, h, 32, 32, 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy2D(d, 16, h, 32, 32, 2, cudaMemcpyHostToDevice), cudaErrorInvalidPitchValue);
    CHECK_EQ_INT(cudaMemcpy(h, d, 0, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    (void)cudaGetLastError();
}

static void test_free_and_info(void) {
    char host[64];
    void *d = NULL, *p = NULL;
    size_t free0, total, free1;
    CHECK_EQ_INT(cudaMemGetInfo(&free0, &total), cudaSuccess);
    CHECK(total == (size_t)141 << 30, "total %zu", total);
    CHECK_EQ_INT(cudaMalloc(&d, 1000), cudaSuccess);
    CHECK_EQ_INT(cudaMemGetInfo(&free1, &total), cudaSuccess);
    CHECK(free0 - free1 == 1000, "free dropped by %zu", free0 - free1);
    CHECK_EQ_INT(cudaFree(host), cudaErrorInvalidValue);
    CHECK(strstr(cudaGetErrorString(cudaErrorInvalidValue), "not an allocation"), "%s",
          cudaGetErrorString(cudaErrorInvalidValue));
    CHECK_EQ_INT(cudaFree((char *)d + 8), cudaErrorInvalidValue);
    CHECK(strstr(cudaGetErrorString(cudaErrorInvalidValue), "interior"), "%s", cudaGetErrorString(cudaErrorInvalidValue));
    CHECK_EQ_INT(cudaFreeHost(d), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    CHECK_EQ_INT(cudaFree(d), cudaErrorInvalidValue); /* double free */
    CHECK_EQ_INT(cudaFree(NULL), cudaSuccess);
    CHECK_EQ_INT(cudaMemGetInfo(&free1, &total), cudaSuccess);
    CHECK(free1 == free0, "free %zu after freeing, was %zu", free1, free0);
    setenv("CUDAEMU_MEM_GIB", "1", 1);
    CHECK_EQ_INT(cudaMalloc(&d, (size_t)2 << 30), cudaErrorMemoryAllocation);
    unsetenv("CUDAEMU_MEM_GIB");
    /* pointer kinds */
    struct cudaPointerAttributes a;
    CHECK_EQ_INT(cudaMalloc(&d, 64), cudaSuccess);
    CHECK_EQ_INT(cudaPointerGetAttributes(&a, (char *)d + 10), cudaSuccess);
    CHECK(a.type == cudaMemoryTypeDevice, "device type %d", a.type);
    CHECK_EQ_INT(cudaPointerGetAttributes(&a, host), cudaSuccess);
    CHECK(a.type == cudaMemoryTypeUnregistered, "host type %d", a.type);
    CHECK_EQ_INT(cudaMallocHost(&p, 64), cudaSuccess);
    CHECK_EQ_INT(cudaPointerGetAttributes(&a, p), cudaSuccess);
    CHECK(a.type == cudaMemoryTypeHost, "pinned type %d", a.type);
    CHECK_EQ_INT(cudaMemcpy(d, p, 64, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_EQ_INT(cudaFree(p), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaFreeHost(p), cudaSuccess);
    CHECK_EQ_INT(cudaHostRegister(host, sizeof host, 0), cudaSuccess);
    CHECK_EQ_INT(cudaHostRegister(host + 8, 8, 0), cudaErrorHostMemoryAlreadyRegistered);
    CHECK_EQ_INT(cudaPointerGetAttributes(&a, host + 4), cudaSuccess);
    CHECK(a.type == cudaMemoryTypeHost, "registered type %d", a.type);
    CHECK_EQ_INT(cudaHostRegister(d, 8, 0), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaHostUnregister(host), cudaSuccess);
    CHECK_EQ_INT(cudaHostUnregister(host), cudaErrorHostMemoryNotRegistered);
    CHECK_EQ_INT(cudaMallocManaged(&p, 32, cudaMemAttachGlobal), cudaSuccess);
    CHECK_EQ_INT(cudaPointerGetAttributes(&a, p), cudaSuccess);
    CHECK(a.type == cudaMemoryTypeManaged, "managed type %d", a.type);
    CHECK(cudaemu_device_range(p, 32) && !cudaemu_device_range(p, 33), "managed range");
    CHECK(cudaemu_is_device_ptr((char *)d + 64) && !cudaemu_is_device_ptr((char *)d + 65), "one past the end");
    CHECK(cudaemu_device_range((char *)d + 64, 0) && !cudaemu_device_range((char *)d + 63, 2), "range at the end");
    CHECK_EQ_INT(cudaFree(p), cudaSuccess);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);
    CHECK(!cudaemu_is_device_ptr(d), "freed pointer still a device pointer");
    (void)cudaGetLastError();
}

static void test_devices(void) {
    int n = -1, v = 0;
    struct cudaDeviceProp p;
    CHECK_EQ_INT(cudaGetDeviceCount(&n), cudaSuccess);
    CHECK_EQ_INT(n, 1);
    setenv("CUDAEMU_DEVICES", "0", 1);
    CHECK_EQ_INT(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorNoDevice);
    setenv("CUDAEMU_DEVICES", "2", 1);
    CHECK_EQ_INT(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ_INT(cudaGetDevice(&v), cudaSuccess);
    CHECK_EQ_INT(v, 1);
    CHECK_EQ_INT(cudaSetDevice(2), cudaErrorInvalidDevice);
    CHECK_EQ_INT(cudaSetDevice(0), cudaSuccess);
    unsetenv("CUDAEMU_DEVICES");
    CHECK_EQ_INT(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    CHECK(p.multiProcessorCount == 132 && p.warpSize == 32 && p.sharedMemPerBlock == 48 * 1024 &&
              p.sharedMemPerBlockOptin == 227 * 1024 && p.major == 9 && p.minor == 0,
          "properties %d %d %zu %zu %d.%d", p.multiProcessorCount, p.warpSize, p.sharedMemPerBlock,
          p.sharedMemPerBlockOptin, p.major, p.minor);
    CHECK_EQ_INT(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
    CHECK_EQ_INT(v, 227 * 1024);
    CHECK_EQ_INT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    CHECK_EQ_INT(v, 132);
    CHECK_EQ_INT(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 1), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
}

static void test_errors(void) {
    /* a non-sticky error (a bad launch): only the last-error calls see it */
    cudaemu_record_error(cudaErrorInvalidConfiguration, 0, "kernel k_bad (x.cu:3): 2048 threads per block");
    CHECK_EQ_INT(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    CHECK_EQ_INT(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(strstr(cudaGetErrorString(cudaErrorInvalidConfiguration), "x.cu:3"), "%s",
          cudaGetErrorString(cudaErrorInvalidConfiguration));
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK(strcmp(cudaGetErrorString(cudaErrorInvalidDevice), "invalid device ordinal") == 0, "%s",
          cudaGetErrorString(cudaErrorInvalidDevice));
    CHECK(strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress") == 0, "name");
    /* a sticky fault: every later call returns it, cudaGetLastError does not clear it */
    void *d = NULL;
    CHECK_EQ_INT(cudaMalloc(&d, 16), cudaSuccess);
    cudaemu_record_error(cudaErrorIllegalAddress, 1, "kernel k_oob (a.cu:10): thread (3,0,0) block (1,0,0) wrote %p", d);
    cudaemu_record_error(cudaErrorLaunchFailure, 1, "a second fault does not replace the first");
    CHECK_EQ_INT(cudaemu_sticky_error(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaMalloc(&d, 16), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaMemset(d, 0, 16), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaStreamSynchronize(0), cudaErrorIllegalAddress);
    CHECK(strstr(cudaGetErrorString(cudaErrorIllegalAddress), "k_oob (a.cu:10)"), "%s",
          cudaGetErrorString(cudaErrorIllegalAddress));
    CHECK_EQ_INT(cudaDeviceReset(), cudaSuccess);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK(!cudaemu_is_device_ptr(d), "reset left the allocation");
    CHECK(strcmp(cudaGetErrorString(cudaErrorIllegalAddress), "an illegal memory access was encountered") == 0,
          "after reset: %s", cudaGetErrorString(cudaErrorIllegalAddress));
}

static void test_streams_events(void) {
    cudaStream_t s = NULL;
    cudaEvent_t a = NULL, b = NULL, nt = NULL;
    float ms = -1.0f;
    CHECK_EQ_INT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_EQ_INT(cudaStreamCreateWithFlags(&s, 4), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaEventCreate(&a), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreate(&b), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming), cudaSuccess);
    CHECK_EQ_INT(cudaEventQuery(a), cudaSuccess); /* never recorded: complete */
    CHECK_EQ_INT(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaEventRecord(a, 0), cudaSuccess);
    CHECK_EQ_INT(cudaStreamWaitEvent(s, a, 0), cudaSuccess);
    CHECK_EQ_INT(cudaEventRecord(b, s), cudaSuccess);
    CHECK_EQ_INT(cudaEventRecord(nt, cudaStreamPerThread), cudaSuccess);
    CHECK_EQ_INT(cudaEventSynchronize(b), cudaSuccess);
    CHECK_EQ_INT(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    CHECK(ms >= 0.0f && ms < 1000.0f, "elapsed %g ms", ms);
    CHECK_EQ_INT(cudaEventElapsedTime(&ms, a, nt), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaStreamQuery(s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaMemsetAsync(NULL, 0, 0, s), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaEventRecord(a, s), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaStreamDestroy(0), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaEventDestroy(a), cudaSuccess);
    CHECK_EQ_INT(cudaEventQuery(a), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaStreamWaitEvent(0, a, 0), cudaErrorInvalidResourceHandle);
    CHECK_EQ_INT(cudaEventDestroy(b), cudaSuccess);
    CHECK_EQ_INT(cudaEventDestroy(nt), cudaSuccess);
    (void)cudaGetLastError();
}

static void k_fake(void) {}

static void test_func_attributes(void) {
    const void *f = (const void *)(uintptr_t)&k_fake;
    CHECK_EQ_INT(cudaemu_func_max_dynamic_smem(f), 0);
    CHECK_EQ_INT(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024), cudaSuccess);
    CHECK_EQ_INT(cudaemu_func_max_dynamic_smem(f), 100 * 1024);
    CHECK_EQ_INT(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 1),
                 cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaemu_func_max_dynamic_smem(f), 100 * 1024);
    CHECK_EQ_INT(cudaFuncSetAttribute(NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 1), cudaErrorInvalidDeviceFunction);
    CHECK_EQ_INT(cudaDeviceReset(), cudaSuccess);
    CHECK_EQ_INT(cudaemu_func_max_dynamic_smem(f), 0);
}

int main(void) {
    setenv("CUDAEMU_QUIET", "1", 1);
    unsetenv("CUDAEMU_FILL"); /* the defaults are what is tested */
    unsetenv("CUDAEMU_DEVICES");
    unsetenv("CUDAEMU_MEM_GIB");
    test_fill();
    test_copies();
    test_free_and_info();
    test_devices();
    test_errors();
    test_streams_events();
    test_func_attributes();
    printf("test_runtime_api: %d failure(s)\n", g_failures);
    return g_failures != 0;
}
