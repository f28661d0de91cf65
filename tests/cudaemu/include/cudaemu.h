/* tests/cudaemu/include/cudaemu.h: the device-language prelude of the CUDA emulator.
 *
 * Force-included (-include cudaemu.h) when a .cu file is compiled as host C++17 after
 * tools/cudaemu_rewrite has turned its `k<<<...>>>(...)` launches and `__shared__`
 * declarations into calls of the functions below. Every CUDA thread of a block is a
 * fiber (src/device.cpp); threadIdx & co. read the running fiber's state, and every
 * synchronising intrinsic (barriers, warp operations) may switch fibers. Each macro
 * passes __FILE__/__LINE__ so that an error names the .cu line (the rewrite emits
 * #line directives, so these are the original file and line).
 * Errors (barrier or warp divergence, deadlock, bad masks, bad launches) are reported
 * through cudaemu_record_error (src/cudaemu_internal.h) with the kernel's name; the
 * block is then abandoned and the launch returns. See tests/cudaemu/README.md. */
#ifndef CUDAEMU_H
#define CUDAEMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cudaemu_types.h"

/* ---- qualifiers: nothing on the host ---- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* __restrict__ is a GNU C++ keyword already. __shared__ is deliberately not defined:
 * the rewrite replaces every declaration, so one it missed fails to compile. */

/* What a fiber sees of itself: its indices and the launch shape. */
struct cudaemu_thread_view {
    uint3 tid, bid;
    dim3 bdim, gdim;
};
/* The running fiber's view (NULL outside a kernel); one per OS thread (__thread, not
 * thread_local: no TLS wrapper call on every threadIdx). */
extern __thread const cudaemu_thread_view *cudaemu_self;

#define threadIdx (cudaemu_self->tid)
#define blockIdx (cudaemu_self->bid)
#define blockDim (cudaemu_self->bdim)
#define gridDim (cudaemu_self->gdim)
static constexpr int warpSize = 32; /* a constant, as in CUDA (not a macro: cudaDeviceProp has a field of that name) */

namespace cudaemu {

/* ---- synchronisation (src/device.cpp) ---- */

/* Block barrier. kind 0: __syncthreads (returns 0); 1: _count (number of threads with
 * pred != 0); 2: _and (1 if every pred != 0); 3: _or (1 if any). Every thread of the
 * block must arrive at the same call site; otherwise (different sites, or some threads
 * exited) the launch fails with cudaErrorLaunchFailure naming the lines. */
int barrier(int kind, int pred, const char *file, int line);

/* One lane's part of a warp collective: up to 64 bytes in, up to 64 bytes out. */
struct lane_slot {
    alignas(16) unsigned char in[64];
    alignas(16) unsigned char out[64];
};
/* Computes every lane's `out` from the `in` of the lanes in `mask` (lanes[32]). Returns
 * NULL, or a message naming what is wrong (e.g. a source lane outside the mask). */
typedef const char *(*combine_fn)(lane_slot *lanes, unsigned mask);

/* Warp collective: deposits `nin` bytes of `in`, waits until every lane in `mask` has
 * arrived at the same site with the same mask, runs `fn` once for the warp and copies
 * this lane's `nout` result bytes to `out`. `what` names the intrinsic in messages.
 * Errors (the calling lane not in mask, lanes at another site, exited lanes in mask)
 * fail the launch with cudaErrorLaunchFailure. */
void warp_collective(unsigned mask, const void *in, size_t nin, void *out, size_t nout, combine_fn fn,
                     const char *what, const char *file, int line);

/* Mask of this warp's lanes that have not exited (the emulator's __activemask). */
unsigned active_mask();
/* This thread's lane (0..31) in its warp. */
unsigned lane_id();

/* Per-block static shared storage for declaration site `site` (a distinct address per
 * `__shared__` declaration): `bytes` filled with cudaemu_fill_byte() when first asked
 * for in a block, the same storage for every thread of that block. */
void *static_shared(const void *site, size_t bytes, size_t align, const char *file, int line);
/* This block's dynamic shared memory (the launch's smem bytes, filled per block). */
void *dynamic_shared();

template <class T>
inline T &static_shared_ref(const void *site, const char *file, int line) {
    return *static_cast<T *>(static_shared(site, sizeof(T), alignof(T), file, line));
}
template <class A>
using dyn_elem_t = typename std::remove_extent<A>::type;

/* cp.async emulation (kernels/cuda/ptx.cuh): the `bytes` (<= 16) at src are read now
 * and land at dst only when a later cp_async_wait retires their group (or the thread
 * exits), so a kernel that reads them without waiting sees the old contents. */
void cp_async(void *dst, const void *src, size_t bytes);
/* Closes the calling thread's current group of cp_async copies. */
void cp_async_commit();
/* Completes every committed group but the newest `n`. */
void cp_async_wait(int n);

/* Override CUDAEMU_ORDER / CUDAEMU_BLOCK_ORDER for later launches of this process
 * (same syntax; NULL leaves one unchanged). Returns 0 for a spec it does not know. */
int set_orders(const char *thread_order, const char *block_order);

/* ---- warp intrinsics ---- */
enum shfl_mode { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
/* Lane layout of a shuffle's `in`: value bytes, then mode, then the lane argument and width. */
struct shfl_in {
    unsigned char v[48];
    int mode, arg, width;
};
const char *shfl_combine(lane_slot *lanes, unsigned mask);
const char *vote_combine(lane_slot *lanes, unsigned mask);
const char *sync_combine(lane_slot *lanes, unsigned mask);

template <class T>
inline T shfl(const char *file, int line, const char *what, int mode, unsigned mask, T v, int arg, int width = 32) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 48, "shuffle of an unsupported type");
    shfl_in in;
    memcpy(in.v, &v, sizeof(T));
    in.mode = mode;
    in.arg = arg;
    in.width = width;
    T r;
    warp_collective(mask, &in, sizeof in, &r, sizeof r, shfl_combine, what, file, line);
    return r;
}
/* kind 0 ballot, 1 any, 2 all. */
inline unsigned vote(const char *file, int line, const char *what, int kind, unsigned mask, int pred) {
    int in[2] = {pred != 0, kind};
    unsigned r;
    warp_collective(mask, in, sizeof in, &r, sizeof r, vote_combine, what, file, line);
    return r;
}

/* ---- kernel launch (what the rewrite turns `k<<<cfg>>>(args)` into) ---- */
struct launch_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
inline launch_cfg config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
    return launch_cfg{grid, block, smem, stream};
}
struct launch_site {
    const void *func;   /* the kernel, as cudaFuncSetAttribute keys it */
    const char *name;   /* the kernel expression as written (e.g. "k<float>") */
    const char *file;   /* launch site (.cu file and line) */
    int line;
};
/* 0 if the launch must not run: a sticky error is set, or the configuration is bad
 * (recorded: cudaErrorInvalidConfiguration / cudaErrorInvalidValue, not sticky). */
int launch_check(const launch_site &s, const launch_cfg &c);
/* Records cudaErrorIllegalAddress (sticky) for argument `index` (0-based) `p`, a
 * non-null pointer that is not device memory; returns 0 then, else 1. */
int check_pointer_arg(const launch_site &s, int index, const void *p);
/* Runs every block of the grid, each thread calling body(ctx); returns after the last
 * block or after the first error (recorded, sticky). */
void run_grid(const launch_site &s, const launch_cfg &c, void (*body)(void *), void *ctx);

template <class T>
inline int check_arg(const launch_site &s, int i, const T &v) {
    if constexpr (std::is_pointer<T>::value && !std::is_function<std::remove_pointer_t<T>>::value)
        return check_pointer_arg(s, i, (const void *)v);
    else
        return 1;
}

template <class... P>
struct launcher {
    void (*fn)(P...);
    launch_site site;
    launch_cfg cfg;

    template <class Tuple, size_t... I>
    int check_args(const Tuple &t, std::index_sequence<I...>) const {
        int ok = 1;
        ((ok = ok && check_arg(site, (int)I, std::get<I>(t))), ...);
        return ok;
    }
    /* Converts the arguments to the kernel's parameter types (copied by value, as
     * CUDA's parameter space does) and runs the grid. */
    template <class... A>
    void operator()(A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        if (!launch_check(site, cfg)) return;
        std::tuple<P...> args(std::forward<A>(a)...);
        if (!check_args(args, std::index_sequence_for<P...>{})) return;
        struct ctx_t {
            void (*fn)(P...);
            std::tuple<P...> *args;
        } ctx{fn, &args};
        run_grid(site, cfg, [](void *p) { auto *c = static_cast<ctx_t *>(p); std::apply(c->fn, *c->args); }, &ctx);
    }
};
template <class... P>
inline launcher<P...> launch(void (*fn)(P...), const char *name, const char *file, int line, launch_cfg c) {
    return launcher<P...>{fn, launch_site{(const void *)fn, name, file, line}, c};
}

} /* namespace cudaemu */

/* ---- barriers and warp intrinsics ---- */
#define __syncthreads() ((void)::cudaemu::barrier(0, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) ::cudaemu::barrier(1, (p), __FILE__, __LINE__)
#define __syncthreads_and(p) ::cudaemu::barrier(2, (p), __FILE__, __LINE__)
#define __syncthreads_or(p) ::cudaemu::barrier(3, (p), __FILE__, __LINE__)
#define __syncwarp(...) ::cudaemu::syncwarp_at{__FILE__, __LINE__}(__VA_ARGS__)
#define __shfl_sync(m, ...) ::cudaemu::shfl(__FILE__, __LINE__, "__shfl_sync", ::cudaemu::SHFL_IDX, m, __VA_ARGS__)
#define __shfl_up_sync(m, ...) ::cudaemu::shfl(__FILE__, __LINE__, "__shfl_up_sync", ::cudaemu::SHFL_UP, m, __VA_ARGS__)
#define __shfl_down_sync(m, ...) \
    ::cudaemu::shfl(__FILE__, __LINE__, "__shfl_down_sync", ::cudaemu::SHFL_DOWN, m, __VA_ARGS__)
#define __shfl_xor_sync(m, ...) ::cudaemu::shfl(__FILE__, __LINE__, "__shfl_xor_sync", ::cudaemu::SHFL_XOR, m, __VA_ARGS__)
#define __ballot_sync(m, p) ::cudaemu::vote(__FILE__, __LINE__, "__ballot_sync", 0, m, (p))
#define __any_sync(m, p) ((int)::cudaemu::vote(__FILE__, __LINE__, "__any_sync", 1, m, (p)))
#define __all_sync(m, p) ((int)::cudaemu::vote(__FILE__, __LINE__, "__all_sync", 2, m, (p)))
#define __activemask() ::cudaemu::active_mask()

namespace cudaemu {
/* __syncwarp(mask = all lanes) at a call site. */
struct syncwarp_at {
    const char *file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const {
        warp_collective(mask, nullptr, 0, nullptr, 0, sync_combine, "__syncwarp", file, line);
    }
};
} /* namespace cudaemu */

/* Fences order memory between threads running at once; fibers never do, so no-ops.
 * (The emulator cannot show memory-model bugs: README.md.) */
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline void __nanosleep(unsigned) {}

/* ---- atomics: fibers switch only at synchronisation points, so a plain
 * read-modify-write is atomic here. Each returns the old value; the value argument
 * converts to *p's type, as CUDA's overloads do (atomicAdd(float *, 1.0)). ---- */
namespace cudaemu {
template <class T>
struct same {
    typedef T type;
};
template <class T>
using same_t = typename same<T>::type; /* a non-deduced context */
} /* namespace cudaemu */
template <class T>
inline T atomicAdd(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o + v; return o; }
template <class T>
inline T atomicSub(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o - v; return o; }
template <class T>
inline T atomicMax(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o < v ? v : o; return o; }
template <class T>
inline T atomicMin(T *p, cudaemu::same_t<T> v) { T o = *p; *p = v < o ? v : o; return o; }
template <class T>
inline T atomicExch(T *p, cudaemu::same_t<T> v) { T o = *p; *p = v; return o; }
template <class T>
inline T atomicCAS(T *p, cudaemu::same_t<T> cmp, cudaemu::same_t<T> v) { T o = *p; if (o == cmp) *p = v; return o; }
template <class T>
inline T atomicAnd(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o & v; return o; }
template <class T>
inline T atomicOr(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o | v; return o; }
template <class T>
inline T atomicXor(T *p, cudaemu::same_t<T> v) { T o = *p; *p = o ^ v; return o; }
/* ((old >= v) ? 0 : old + 1), as CUDA's atomicInc. */
inline unsigned atomicInc(unsigned *p, unsigned v) { unsigned o = *p; *p = o >= v ? 0 : o + 1; return o; }

/* ---- float intrinsics: host libm, correctly rounded where CUDA's are (_rn), the
 * host function where CUDA's is approximate (__expf, __logf, ...): README.md says
 * why device numerics are out of reach. ---- */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return expf(a); }
inline float __exp10f(float a) { return powf(10.0f, a); }
inline float __logf(float a) { return logf(a); }
inline float __log2f(float a) { return log2f(a); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float a) { return sinf(a); }
inline float __cosf(float a) { return cosf(a); }
inline float __tanf(float a) { return tanf(a); }
inline float __tanhf(float a) { return tanhf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline double rsqrt(double a) { return 1.0 / sqrt(a); }
inline float __saturatef(float a) { return a >= 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f); } /* NaN -> 0 */
inline int __float2int_rn(float a) { return (int)nearbyintf(a); }
inline int __float2int_rz(float a) { return (int)a; }
inline int __float2int_rd(float a) { return (int)floorf(a); }
inline int __float2int_ru(float a) { return (int)ceilf(a); }
inline unsigned __float2uint_rn(float a) { return (unsigned)nearbyintf(a); }
inline long long __float2ll_rn(float a) { return (long long)nearbyintf(a); }
inline float __int2float_rn(int a) { return (float)a; }
inline float __uint2float_rn(unsigned a) { return (float)a; }
inline int __double2int_rn(double a) { return (int)nearbyint(a); }
inline float __double2float_rn(double a) { return (float)a; }
inline int __float_as_int(float a) { int r; memcpy(&r, &a, 4); return r; }
inline unsigned __float_as_uint(float a) { unsigned r; memcpy(&r, &a, 4); return r; }
inline float __int_as_float(int a) { float r; memcpy(&r, &a, 4); return r; }
inline float __uint_as_float(unsigned a) { float r; memcpy(&r, &a, 4); return r; }
inline long long __double_as_longlong(double a) { long long r; memcpy(&r, &a, 8); return r; }
inline double __longlong_as_double(long long a) { double r; memcpy(&r, &a, 8); return r; }
inline int __popc(unsigned a) { return __builtin_popcount(a); }
inline int __popcll(unsigned long long a) { return __builtin_popcountll(a); }
inline int __clz(int a) { return a ? __builtin_clz((unsigned)a) : 32; }
inline int __clzll(long long a) { return a ? __builtin_clzll((unsigned long long)a) : 64; }
inline int __ffs(int a) { return __builtin_ffs(a); }
inline int __ffsll(long long a) { return __builtin_ffsll(a); }
inline unsigned __brev(unsigned a) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((a >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <class T>
inline T __ldg(const T *p) { return *p; }
/* CUDA's integer min/max overloads (device code calls them unqualified). */
#define CUDAEMU_MINMAX(T)                                  \
    inline T min(T a, T b) { return b < a ? b : a; }      \
    inline T max(T a, T b) { return a < b ? b : a; }
CUDAEMU_MINMAX(int)
CUDAEMU_MINMAX(unsigned)
CUDAEMU_MINMAX(long)
CUDAEMU_MINMAX(unsigned long)
CUDAEMU_MINMAX(long long)
CUDAEMU_MINMAX(unsigned long long)
#undef CUDAEMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#endif
