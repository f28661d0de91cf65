/* tests/cudaemu/src/runtime.cpp: the runtime half of the CUDA emulator (see
 * include/cuda_runtime.h for the model): the table of allocations, the error state,
 * streams, events, the device description and per-kernel attributes. cudaMalloc memory
 * comes from src/hostaccess.cpp's arena in CUDAEMU_HOST_ACCESS=trap mode, and copies and
 * memsets open it around their bytes.
 * One mutex guards the tables; the last error is per host thread, the sticky error is
 * per process (one context), as on a real device. */
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "cudaemu_internal.h"
#include "cudaemu_stats.h"

/* cudaemu.h (the device prelude, pulled in by cuda_runtime.h) makes warpSize a macro,
 * which would rename cudaDeviceProp::warpSize here. */
#undef warpSize

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    bool recorded;
    std::chrono::steady_clock::time_point t;
};

namespace {

enum Kind { DEVICE, MANAGED, PINNED, REGISTERED };

struct Alloc {
    size_t bytes;
    Kind kind;
    bool arena; /* in the trap arena (src/hostaccess.cpp): cudaMalloc with CUDAEMU_HOST_ACCESS=trap */
};

constexpr size_t kSmemOptin = 227 * 1024;

std::mutex g_mu;
std::map<uintptr_t, Alloc> g_allocs; /* base -> allocation (every kind; ranges never overlap) */
size_t g_device_bytes;                /* live DEVICE + MANAGED bytes */
std::set<cudaStream_t> g_streams;
std::set<cudaEvent_t> g_events;
std::map<const void *, size_t> g_func_smem;

std::atomic<int> g_sticky{cudaSuccess};
std::string g_sticky_msg; /* under g_mu */

thread_local cudaError_t t_last = cudaSuccess;
thread_local cudaError_t t_msg_code = cudaSuccess; /* the code t_msg describes */
thread_local std::string t_msg;
thread_local int t_device = 0;

long env_long(const char *name, long dflt) {
    cudaemu_env_check();
    const char *v = getenv(name);
    return v && *v ? strtol(v, nullptr, 10) : dflt;
}

size_t mem_total() { return (size_t)env_long("CUDAEMU_MEM_GIB", 141) << 30; }

/* Gives an allocation's memory back to where it came from. */
void give_back(void *p, const Alloc &a) {
    if (a.arena)
        cudaemu_arena_free(p);
    else if (a.kind != REGISTERED)
        free(p);
}

void vrecord(cudaError_t e, int sticky, const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (!env_long("CUDAEMU_QUIET", 0)) fprintf(stderr, "cudaemu: %s\n", buf);
    t_last = e;
    t_msg_code = e;
    t_msg = buf;
    if (sticky) {
        std::lock_guard<std::mutex> lk(g_mu);
        int none = cudaSuccess;
        if (g_sticky.compare_exchange_strong(none, e)) g_sticky_msg = buf; /* first fault wins */
    }
}

/* A call's own failure with a detailed message: sets the last error, returns e. */
cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord(e, 0, fmt, ap);
    va_end(ap);
    return e;
}

/* A call's own failure with the standard text only. */
cudaError_t fail_quiet(cudaError_t e) {
    t_last = e;
    t_msg_code = cudaSuccess; /* an older detailed message no longer describes the error */
    return e;
}

/* The allocation containing p (one past the end counts when `end_ok`); caller holds g_mu. */
const std::pair<const uintptr_t, Alloc> *find(const void *p, bool end_ok) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    if (a < it->first + it->second.bytes || (end_ok && a == it->first + it->second.bytes)) return &*it;
    return nullptr;
}

bool is_dev(Kind k) { return k == DEVICE || k == MANAGED; }

const char *kind_name(Kind k) {
    static const char *n[] = {"device", "managed", "pinned host", "registered host"};
    return n[k];
}

bool stream_ok(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
    std::lock_guard<std::mutex> lk(g_mu);
    return g_streams.count(s) != 0;
}

bool event_ok(cudaEvent_t e) {
    std::lock_guard<std::mutex> lk(g_mu);
    return e && g_events.count(e) != 0;
}

/* The counters of cudaemu_stats.h. */
struct Stats {
    std::atomic<uint64_t> d2h{0}, h2d{0}, device{0}, stream{0}, event{0}, copy{0}, free_{0};
};
Stats g_stats;

/* Where p lies: 0 pageable host memory, 1 pinned or registered host memory, 2 device. */
int side_of(const void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto *in = find(p, false);
    return !in ? 0 : is_dev(in->second.kind) ? 2 : 1;
}

/* Count a copy that passed its checks (cudaemu_stats.h): its direction, and whether the
 * host waits for the device (a synchronous host <-> device copy, or an asynchronous one
 * from the device into pageable memory). */
void count_copy(const void *dst, const void *src, bool async) {
    const int d = side_of(dst), s = side_of(src);
    if (s == 2 && d < 2) g_stats.d2h++;
    if (s < 2 && d == 2) g_stats.h2d++;
    if ((d == 2) != (s == 2) && (!async || (s == 2 && d == 0))) g_stats.copy++;
}

#define STICKY_RETURN()                                                                   \
    do {                                                                                  \
        if (cudaError_t s_ = cudaemu_sticky_error()) return s_;                           \
    } while (0)

cudaError_t alloc(void **p, size_t bytes, Kind kind, const char *call) {
    STICKY_RETURN();
    if (!p) return fail(cudaErrorInvalidValue, "%s: NULL result pointer", call);
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (is_dev(kind) && bytes > mem_total() - g_device_bytes)
            return fail(cudaErrorMemoryAllocation, "%s(%zu bytes): out of memory (%zu of %zu bytes in use)", call,
                        bytes, g_device_bytes, mem_total());
    }
    void *q = nullptr;
    const bool arena = kind == DEVICE && cudaemu_host_trap();
    if (arena) { /* page-aligned, unreadable by host code (src/hostaccess.cpp) */
        if (!(q = cudaemu_arena_alloc(bytes, cudaemu_fill_byte())))
            return fail(cudaErrorMemoryAllocation, "%s(%zu bytes): the CUDAEMU_HOST_ACCESS=trap arena is full", call,
                        bytes);
    } else {
#ifdef __SANITIZE_ADDRESS__
        const size_t real = bytes; /* exact, so ASan's redzone starts at the end */
#else
        const size_t real = (bytes + 255) & ~(size_t)255;
#endif
        if (posix_memalign(&q, 256, real) != 0 || !q)
            return fail(cudaErrorMemoryAllocation, "%s(%zu bytes): host allocation failed", call, bytes);
        if (kind != PINNED) memset(q, cudaemu_fill_byte(), real);
    }
    std::lock_guard<std::mutex> lk(g_mu);
    g_allocs[(uintptr_t)q] = Alloc{bytes, kind, arena};
    if (is_dev(kind)) g_device_bytes += bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t release(void *p, bool host, const char *call) {
    STICKY_RETURN();
    if (!p) return cudaSuccess;
    std::unique_lock<std::mutex> lk(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || (host ? it->second.kind != PINNED : !is_dev(it->second.kind))) {
        auto *in = find(p, false);
        char what[160] = "not an allocation (never allocated or already freed)";
        if (in)
            snprintf(what, sizeof what, "%s %p (inside the %s allocation %p of %zu bytes)",
                     in->first == (uintptr_t)p ? "not freed this way:" : "interior pointer", p,
                     kind_name(in->second.kind), (void *)in->first, in->second.bytes);
        lk.unlock();
        return fail(cudaErrorInvalidValue, "%s(%p): %s", call, p, what);
    }
    if (is_dev(it->second.kind)) g_device_bytes -= it->second.bytes;
    const Alloc a = it->second;
    g_allocs.erase(it);
    lk.unlock();
    give_back(p, a);
    g_stats.free_++;
    return cudaSuccess;
}

/* Check one side of a copy: `want_dev` says what `kind` claims (-1: infer). */
cudaError_t check_side(const char *call, const char *side, const void *p, size_t bytes, int want_dev,
                       size_t total) {
    std::unique_lock<std::mutex> lk(g_mu);
    auto *in = find(p, true);
    const bool dev = in && is_dev(in->second.kind);
    if (want_dev == 0 && dev) {
        lk.unlock();
        return fail(cudaErrorInvalidValue, "%s(%zu bytes): %s %p is device memory but the kind says host", call,
                    total, side, p);
    }
    if (want_dev == 1 && !dev) {
        lk.unlock();
        return fail(cudaErrorInvalidValue, "%s(%zu bytes): %s %p is not in any live device allocation", call, total,
                    side, p);
    }
    if (dev && (uintptr_t)p + bytes > in->first + in->second.bytes) {
        const uintptr_t base = in->first;
        const size_t size = in->second.bytes;
        lk.unlock();
        return fail(cudaErrorInvalidValue,
                    "%s(%zu bytes): %s range [%p, +%zu) overruns the allocation %p of %zu bytes (offset %zu, %zu "
                    "bytes past its end)",
                    call, total, side, p, bytes, (void *)base, size, (size_t)((uintptr_t)p - base),
                    (size_t)((uintptr_t)p + bytes - base - size));
    }
    return cudaSuccess;
}

cudaError_t copy_check(const char *call, void *dst, size_t dbytes, const void *src, size_t sbytes, int kind,
                       size_t total) {
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d is not a cudaMemcpyKind", call, kind);
    if (!dst || !src) return fail(cudaErrorInvalidValue, "%s(%zu bytes): NULL %s", call, total, dst ? "src" : "dst");
    const int ddev = kind == cudaMemcpyDefault ? -1 : (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice);
    const int sdev = kind == cudaMemcpyDefault ? -1 : (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice);
    if (cudaError_t e = check_side(call, "dst", dst, dbytes, ddev, total)) return e;
    return check_side(call, "src", src, sbytes, sdev, total);
}

const char *std_text(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
    }
    return nullptr;
}

} // namespace

/* ---------------- the contract with the device half (cudaemu_internal.h) ---------------- */

extern "C" int cudaemu_device_range(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto *in = find(p, true);
    return in && is_dev(in->second.kind) && (uintptr_t)p + bytes <= in->first + in->second.bytes &&
           (uintptr_t)p + bytes >= (uintptr_t)p;
}

extern "C" int cudaemu_is_device_ptr(const void *p) { return cudaemu_device_range(p, 0); }

extern "C" int cudaemu_is_kernel_accessible(const void *p) {
    if (cudaemu_device_range(p, 0)) return 1;
    std::lock_guard<std::mutex> lk(g_mu);
    auto *in = find(p, false);
    return in && in->second.kind == PINNED;
}

extern "C" void cudaemu_record_error(cudaError_t e, int sticky, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord(e, sticky, fmt, ap);
    va_end(ap);
}

extern "C" cudaError_t cudaemu_sticky_error(void) { return (cudaError_t)g_sticky.load(); }

extern "C" size_t cudaemu_func_max_dynamic_smem(const void *func) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_func_smem.find(func);
    return it == g_func_smem.end() ? 0 : it->second;
}

extern "C" size_t cudaemu_mem_total(void) { return mem_total(); }

extern "C" unsigned char cudaemu_fill_byte(void) {
    cudaemu_env_check();
    const char *v = getenv("CUDAEMU_FILL");
    return v && strcmp(v, "0") == 0 ? 0x00 : 0xFF;
}

/* Used by cublaslt.cpp (not part of the device-half contract). */
extern "C" int cudaemu_stream_valid(cudaStream_t s) { return stream_ok(s); }

/* ---------------- counters (cudaemu_stats.h) ---------------- */

extern "C" void cudaemu_stats_get(cudaemu_stats *out) {
    out->d2h_copies = g_stats.d2h;
    out->h2d_copies = g_stats.h2d;
    out->device_syncs = g_stats.device;
    out->stream_syncs = g_stats.stream;
    out->event_syncs = g_stats.event;
    out->copy_syncs = g_stats.copy;
    out->free_syncs = g_stats.free_;
    out->syncs = out->device_syncs + out->stream_syncs + out->event_syncs + out->copy_syncs + out->free_syncs;
}

extern "C" void cudaemu_stats_reset(void) {
    for (auto *c : {&g_stats.d2h, &g_stats.h2d, &g_stats.device, &g_stats.stream, &g_stats.event, &g_stats.copy,
                    &g_stats.free_})
        *c = 0;
}

/* ---------------- errors ---------------- */

extern "C" cudaError_t cudaGetLastError(void) {
    if (cudaError_t s = cudaemu_sticky_error()) return s;
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) {
    if (cudaError_t s = cudaemu_sticky_error()) return s;
    return t_last;
}

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    static thread_local char ring[4][1024];
    static thread_local int next;
    std::string msg;
    if (e != cudaSuccess && e == cudaemu_sticky_error()) {
        std::lock_guard<std::mutex> lk(g_mu);
        msg = g_sticky_msg;
    } else if (e != cudaSuccess && e == t_msg_code) {
        msg = t_msg;
    }
    if (msg.empty()) {
        const char *s = std_text(e);
        return s ? s : "unrecognized error code";
    }
    char *r = ring[next++ & 3];
    snprintf(r, sizeof ring[0], "%s: %s", std_text(e), msg.c_str());
    return r;
}

extern "C" const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) case x: return #x;
    N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
    N(cudaErrorCudartUnloading) N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidPitchValue)
    N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection) N(cudaErrorInvalidDeviceFunction)
    N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady)
    N(cudaErrorIllegalAddress) N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchTimeout) N(cudaErrorAssert)
    N(cudaErrorHostMemoryAlreadyRegistered) N(cudaErrorHostMemoryNotRegistered) N(cudaErrorIllegalInstruction)
    N(cudaErrorLaunchFailure) N(cudaErrorNotSupported) N(cudaErrorUnknown)
#undef N
    }
    return "unrecognized error code";
}

/* ---------------- devices ---------------- */

extern "C" cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail_quiet(cudaErrorInvalidValue);
    long n = env_long("CUDAEMU_DEVICES", 1);
    *count = n > 0 ? (int)n : 0;
    return n > 0 ? cudaSuccess : fail_quiet(cudaErrorNoDevice);
}

static cudaError_t check_device(int device) {
    int n = 0;
    if (cudaError_t e = cudaGetDeviceCount(&n)) return e;
    return device >= 0 && device < n ? cudaSuccess : fail_quiet(cudaErrorInvalidDevice);
}

extern "C" cudaError_t cudaSetDevice(int device) {
    if (cudaError_t e = check_device(device)) return e;
    t_device = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail_quiet(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (!p) return fail_quiet(cudaErrorInvalidValue);
    if (cudaError_t e = check_device(device)) return e;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudaemu H200 (CPU emulation)");
    p->totalGlobalMem = mem_total();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = kSmemOptin;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->totalConstMem = 64 * 1024;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->maxThreadsPerMultiProcessor = 2048;
    p->multiProcessorCount = 132;
    p->major = 9;
    p->minor = 0;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 6144;
    p->concurrentKernels = p->unifiedAddressing = p->managedMemory = 1;
    p->pciBusID = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    struct cudaDeviceProp p;
    if (!value) return fail_quiet(cudaErrorInvalidValue);
    if (cudaError_t e = cudaGetDeviceProperties(&p, device)) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: case cudaDevAttrMaxBlockDimZ:
        *value = p.maxThreadsDim[attr - cudaDevAttrMaxBlockDimX]; break;
    case cudaDevAttrMaxGridDimX: case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ:
        *value = p.maxGridSize[attr - cudaDevAttrMaxGridDimX]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrTotalConstantMemory: *value = (int)p.totalConstMem; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = p.regsPerMultiprocessor; break;
    case cudaDevAttrManagedMemory: *value = p.managedMemory; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d not emulated", (int)attr);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
    if (cudaError_t e = cudaemu_sticky_error()) return e;
    g_stats.device++;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceReset(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto &a : g_allocs) give_back((void *)a.first, a.second);
    g_allocs.clear();
    g_device_bytes = 0;
    for (auto s : g_streams) delete s;
    for (auto e : g_events) delete e;
    g_streams.clear();
    g_events.clear();
    g_func_smem.clear();
    g_sticky = cudaSuccess;
    g_sticky_msg.clear();
    t_last = cudaSuccess;
    t_msg_code = cudaSuccess;
    return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { return v ? (*v = CUDART_VERSION, cudaSuccess) : fail_quiet(cudaErrorInvalidValue); }
extern "C" cudaError_t cudaDriverGetVersion(int *v) { return v ? (*v = CUDART_VERSION, cudaSuccess) : fail_quiet(cudaErrorInvalidValue); }

/* ---------------- memory ---------------- */

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) { return alloc(p, bytes, DEVICE, "cudaMalloc"); }
extern "C" cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int) {
    return alloc(p, bytes, MANAGED, "cudaMallocManaged");
}
extern "C" cudaError_t cudaMallocHost(void **p, size_t bytes) { return alloc(p, bytes, PINNED, "cudaMallocHost"); }
extern "C" cudaError_t cudaFree(void *p) { return release(p, false, "cudaFree"); }
extern "C" cudaError_t cudaFreeHost(void *p) { return release(p, true, "cudaFreeHost"); }

extern "C" cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int) {
    STICKY_RETURN();
    if (!p || !bytes) return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu bytes): empty range", p, bytes);
    std::unique_lock<std::mutex> lk(g_mu);
    auto it = g_allocs.lower_bound((uintptr_t)p);
    auto *in = find(p, false);
    if (in && in->second.kind != REGISTERED) {
        lk.unlock();
        return fail(cudaErrorInvalidValue, "cudaHostRegister(%p): inside a %s allocation", p, kind_name(in->second.kind));
    }
    if (in || (it != g_allocs.end() && it->first < (uintptr_t)p + bytes)) return fail_quiet(cudaErrorHostMemoryAlreadyRegistered);
    g_allocs[(uintptr_t)p] = Alloc{bytes, REGISTERED, false};
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void *p) {
    STICKY_RETURN();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != REGISTERED) return fail_quiet(cudaErrorHostMemoryNotRegistered);
    g_allocs.erase(it);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    STICKY_RETURN();
    if (!free_bytes || !total_bytes) return fail_quiet(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    *total_bytes = mem_total();
    *free_bytes = *total_bytes - g_device_bytes;
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    STICKY_RETURN();
    if (!a) return fail_quiet(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    auto *in = find(p, false);
    a->device = 0;
    a->type = !in ? cudaMemoryTypeUnregistered
                  : in->second.kind == DEVICE ? cudaMemoryTypeDevice
                  : in->second.kind == MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
    a->devicePointer = in ? (void *)p : nullptr;
    a->hostPointer = a->type == cudaMemoryTypeDevice || !in ? nullptr : (void *)p;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    STICKY_RETURN();
    if (bytes == 0) return cudaSuccess;
    if (cudaError_t e = copy_check("cudaMemcpy", dst, bytes, src, bytes, kind, bytes)) return e;
    count_copy(dst, src, false);
    cudaemu_device_access acc;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                                       cudaStream_t s) {
    STICKY_RETURN();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream %p is not a live stream", (void *)s);
    if (bytes == 0) return cudaSuccess;
    if (cudaError_t e = copy_check("cudaMemcpyAsync", dst, bytes, src, bytes, kind, bytes)) return e;
    count_copy(dst, src, true);
    cudaemu_device_access acc;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                    size_t height, enum cudaMemcpyKind kind) {
    STICKY_RETURN();
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > dpitch || width > spitch)
        return fail(cudaErrorInvalidPitchValue, "cudaMemcpy2D: width %zu over dpitch %zu or spitch %zu", width, dpitch,
                    spitch);
    if (cudaError_t e = copy_check("cudaMemcpy2D", dst, dpitch * (height - 1) + width, src,
                                   spitch * (height - 1) + width, kind, width * height))
        return e;
    count_copy(dst, src, false);
    cudaemu_device_access acc;
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    STICKY_RETURN();
    if (bytes == 0) return cudaSuccess;
    if (!p) return fail(cudaErrorInvalidValue, "cudaMemset(NULL, %zu bytes)", bytes);
    if (cudaError_t e = check_side("cudaMemset", "dst", p, bytes, 1, bytes)) return e;
    cudaemu_device_access acc;
    memset(p, value, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    STICKY_RETURN();
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream %p is not a live stream", (void *)s);
    return cudaMemset(p, value, bytes);
}

/* ---------------- streams and events ---------------- */

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    STICKY_RETURN();
    if (!s || flags > cudaStreamNonBlocking) return fail_quiet(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    *s = new CUstream_st{flags};
    g_streams.insert(*s);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    STICKY_RETURN();
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_streams.erase(s)) return fail_quiet(cudaErrorInvalidResourceHandle);
    delete s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) {
    STICKY_RETURN();
    return stream_ok(s) ? cudaSuccess : fail_quiet(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) g_stats.stream++;
    return e;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    STICKY_RETURN();
    if (flags) return fail_quiet(cudaErrorInvalidValue);
    return stream_ok(s) && event_ok(e) ? cudaSuccess : fail_quiet(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    STICKY_RETURN();
    if (!e || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))) return fail_quiet(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    *e = new CUevent_st{flags, false, {}};
    g_events.insert(*e);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
    STICKY_RETURN();
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_events.erase(e)) return fail_quiet(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    STICKY_RETURN();
    if (!event_ok(e) || !stream_ok(s)) return fail_quiet(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_mu);
    e->recorded = true;
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) {
    STICKY_RETURN();
    return event_ok(e) ? cudaSuccess : fail_quiet(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) g_stats.event++;
    return r;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    STICKY_RETURN();
    if (!ms) return fail_quiet(cudaErrorInvalidValue);
    if (!event_ok(a) || !event_ok(b)) return fail_quiet(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_mu);
    if (!a->recorded || !b->recorded || ((a->flags | b->flags) & cudaEventDisableTiming))
        return fail_quiet(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

/* ---------------- kernels ---------------- */

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    STICKY_RETURN();
    if (!func) return fail_quiet(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess : fail_quiet(cudaErrorInvalidValue);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d not emulated", (int)attr);
    if (value < 0 || (size_t)value > kSmemOptin)
        return fail(cudaErrorInvalidValue,
                    "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d bytes): over the %zu-byte opt-in limit", value,
                    kSmemOptin);
    std::lock_guard<std::mutex> lk(g_mu);
    g_func_smem[func] = (size_t)value;
    return cudaSuccess;
}
