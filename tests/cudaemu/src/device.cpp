/* tests/cudaemu/src/device.cpp: the device half of the CUDA emulator: fibers, block
 * barriers, warp collectives, shared memory, launch checks and thread orders.
 *
 * A launch runs its blocks one after another on the calling OS thread. Each CUDA thread
 * of a block is a fiber: started on a stack from a pool (reused across threads, blocks
 * and launches), it runs until it blocks (barrier, warp op) or exits. A thread that never
 * blocks gives its stack back as it exits, so a kernel without barriers uses one stack.
 * The scheduler resumes runnable fibers in the chosen order (CUDAEMU_ORDER); when none is
 * runnable and some have not exited, the block is stuck and the waiters are diagnosed
 * (barrier divergence, warp-op divergence, deadlock, bad masks). Errors are recorded
 * sticky (cudaErrorLaunchFailure) and the launch is abandoned: suspended fibers are
 * dropped (their stacks go back to the pool; no destructors run, kernels hold none).
 *
 * Switching: a 20-instruction x86-64 switch (callee-saved registers, rsp, MXCSR and the
 * x87 control word) by default; ucontext when CUDAEMU_UCONTEXT is defined (sanitizer
 * builds, with AddressSanitizer fiber annotations) or on other architectures. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "cudaemu.h"
#include "cudaemu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDAEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDAEMU_ASAN 1
#endif
#endif
#if (defined(CUDAEMU_ASAN) || !defined(__x86_64__)) && !defined(CUDAEMU_UCONTEXT)
#define CUDAEMU_UCONTEXT 1
#endif
#ifdef CUDAEMU_UCONTEXT
#include <ucontext.h>
#endif
#ifdef CUDAEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

__thread const cudaemu_thread_view *cudaemu_self;

namespace cudaemu {
namespace {

constexpr size_t kStaticSmem = 48 * 1024;   /* static __shared__ per block */
constexpr size_t kDefaultSmem = 48 * 1024;  /* dynamic without the opt-in attribute */
constexpr size_t kMaxSmem = 227 * 1024;     /* static + dynamic with the opt-in (sm_90) */

enum fstate { F_NEW, F_RUN, F_BAR, F_WARP, F_DONE };

struct cp_pending {
    void *dst;
    unsigned char data[16];
    size_t bytes;
    int group; /* -1 until committed */
};

struct fiber {
    cudaemu_thread_view view;
    int index; /* linear thread index in the block */
    int state;
    char *stack;
    const char *file, *what; /* where it waits */
    int line;
    unsigned mask;
    combine_fn fn;
    std::vector<cp_pending> cp;
    int cp_groups;
#ifdef CUDAEMU_UCONTEXT
    ucontext_t uc;
    void *fake_stack;
#else
    void *sp;
#endif
};

struct warp_state {
    lane_slot lanes[32];
    unsigned arrived, exited;
};

/* One block being run (reused for every block of every launch on this OS thread). */
struct block_run {
    const launch_site *site;
    void (*body)(void *);
    void *ctx;
    uint3 bid;
    int n, done, failed;
    std::vector<fiber> f;
    std::vector<warp_state> w;
    std::vector<int> order;
    /* the barrier being filled */
    int bar_arrived, bar_mismatch, bar_count, bar_and, bar_or, bar_result;
    const char *bar_file;
    int bar_line;
    /* shared memory */
    struct smem_entry {
        const void *site;
        size_t off;
    };
    std::vector<smem_entry> smap;
    std::vector<unsigned char> sarena;
    size_t sused;
    unsigned char *dyn;
    size_t dyn_bytes;
};

__thread block_run *t_blk;
__thread fiber *t_cur;
thread_local block_run t_run;

/* ---- orders ---- */
enum { ORD_FORWARD, ORD_REVERSE, ORD_RANDOM };
struct orders {
    int parsed, threads, blocks;
    unsigned long long rng;
};
orders g_ord;

int parse_thread_order(const char *s) {
    if (!s || !*s || !strcmp(s, "forward")) return g_ord.threads = ORD_FORWARD, 1;
    if (!strcmp(s, "reverse")) return g_ord.threads = ORD_REVERSE, 1;
    if (!strncmp(s, "random", 6) && (s[6] == 0 || s[6] == ':')) {
        g_ord.threads = ORD_RANDOM;
        g_ord.rng = s[6] ? strtoull(s + 7, nullptr, 0) : 0x5eedULL;
        return 1;
    }
    return 0;
}
int parse_block_order(const char *s) {
    if (!s || !*s || !strcmp(s, "forward")) return g_ord.blocks = ORD_FORWARD, 1;
    if (!strcmp(s, "reverse")) return g_ord.blocks = ORD_REVERSE, 1;
    return 0;
}
void load_orders() {
    if (g_ord.parsed) return;
    g_ord.parsed = 1;
    cudaemu_env_check();
    const char *t = getenv("CUDAEMU_ORDER"), *b = getenv("CUDAEMU_BLOCK_ORDER");
    if (!parse_thread_order(t)) {
        fprintf(stderr, "cudaemu: CUDAEMU_ORDER=%s unknown (forward|reverse|random[:seed]); using forward\n", t);
        g_ord.threads = ORD_FORWARD;
    }
    if (!parse_block_order(b)) {
        fprintf(stderr, "cudaemu: CUDAEMU_BLOCK_ORDER=%s unknown (forward|reverse); using forward\n", b);
        g_ord.blocks = ORD_FORWARD;
    }
}
unsigned long long next_rand() { /* splitmix64: seeded, reproducible */
    unsigned long long z = (g_ord.rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- stacks: mmap'd with a PROT_NONE guard page below, pooled per OS thread ---- */
size_t stack_bytes() {
    static size_t bytes = [] {
        cudaemu_env_check();
        const char *e = getenv("CUDAEMU_STACK_KIB");
#ifdef CUDAEMU_ASAN
        size_t kib = 256; /* ASan's redzones need more */
#else
        size_t kib = 64;
#endif
        if (e && atoi(e) >= 16) kib = (size_t)atoi(e);
        return kib * 1024;
    }();
    return bytes;
}
size_t page_bytes() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}
struct stack_pool {
    std::vector<char *> free;
    ~stack_pool() {
        for (char *s : free) munmap(s - page_bytes(), stack_bytes() + page_bytes());
    }
};
thread_local stack_pool t_stacks;

char *stack_get() {
    if (!t_stacks.free.empty()) {
        char *s = t_stacks.free.back();
        t_stacks.free.pop_back();
        return s;
    }
    const size_t pg = page_bytes(), sz = stack_bytes();
    void *m = mmap(nullptr, sz + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || mprotect(m, pg, PROT_NONE) != 0) {
        perror("cudaemu: fiber stack");
        abort();
    }
    return (char *)m + pg;
}
void stack_put(char *s) {
#ifdef CUDAEMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(s, stack_bytes()); /* frames of abandoned fibers */
#endif
    t_stacks.free.push_back(s);
}

/* ---- context switching ---- */
void fiber_main(fiber *f);

#ifdef CUDAEMU_UCONTEXT
__thread ucontext_t *t_sched_uc;
__thread fiber *t_starting;
#ifdef CUDAEMU_ASAN
__thread const void *t_sched_bottom;
__thread size_t t_sched_size;
#endif

void uc_entry() {
    fiber *f = t_starting;
#ifdef CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &t_sched_bottom, &t_sched_size);
#endif
    fiber_main(f);
}
/* scheduler -> fiber (starting it if new) */
void enter(fiber *f) {
    ucontext_t sched;
    t_sched_uc = &sched;
    if (f->state == F_NEW) {
        f->stack = stack_get();
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = stack_bytes();
        f->uc.uc_link = nullptr;
        makecontext(&f->uc, uc_entry, 0);
        t_starting = f;
        f->state = F_RUN;
    }
#ifdef CUDAEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, stack_bytes());
#endif
    swapcontext(&sched, &f->uc);
#ifdef CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
/* fiber -> scheduler; returns when resumed */
void leave(fiber *f) {
#ifdef CUDAEMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, t_sched_bottom, t_sched_size);
#endif
    swapcontext(&f->uc, t_sched_uc);
#ifdef CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &t_sched_bottom, &t_sched_size);
#endif
}
/* fiber -> scheduler for good */
[[noreturn]] void finish(fiber *) {
#ifdef CUDAEMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, t_sched_bottom, t_sched_size);
#endif
    setcontext(t_sched_uc);
    abort();
}
#else
extern "C" void cudaemu_ctx_switch(void **save_sp, void *to_sp);
extern "C" void cudaemu_ctx_start();
/* cudaemu_ctx_switch(save, to): push the callee-saved registers, MXCSR and the x87
 * control word, store rsp in *save, load `to`, pop the same, return into the other
 * context (loading MXCSR / the control word only when they differ: both loads are slow).
 * A new fiber's frame "returns" into cudaemu_ctx_start, which calls r13(r12). */
asm(R"(
    .text
    .globl cudaemu_ctx_switch
    .hidden cudaemu_ctx_switch
    .type cudaemu_ctx_switch, @function
cudaemu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movl (%rsp), %eax
    movzwl 4(%rsp), %ecx
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    cmpl (%rsp), %eax
    je 1f
    ldmxcsr (%rsp)
1:  cmpw 4(%rsp), %cx
    je 2f
    fldcw 4(%rsp)
2:  addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudaemu_ctx_switch, .-cudaemu_ctx_switch
    .globl cudaemu_ctx_start
    .hidden cudaemu_ctx_start
    .type cudaemu_ctx_start, @function
cudaemu_ctx_start:
    xorl %ebp, %ebp
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cudaemu_ctx_start, .-cudaemu_ctx_start
)");
__thread void *t_sched_sp;

void enter(fiber *f) {
    if (f->state == F_NEW) {
        f->stack = stack_get();
        void **top = (void **)(f->stack + stack_bytes()); /* 16-byte aligned */
        top[-1] = (void *)cudaemu_ctx_start;              /* return address */
        top[-2] = nullptr;                                /* rbp */
        top[-3] = nullptr;                                /* rbx */
        top[-4] = (void *)f;                              /* r12: argument */
        top[-5] = (void *)fiber_main;                     /* r13: function */
        top[-6] = nullptr;                                /* r14 */
        top[-7] = nullptr;                                /* r15 */
        unsigned csr[2];
        __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
        memcpy(&top[-8], csr, 8); /* the launcher's MXCSR and x87 control word */
        f->sp = &top[-8];
        f->state = F_RUN;
    }
    cudaemu_ctx_switch(&t_sched_sp, f->sp);
}
void leave(fiber *f) { cudaemu_ctx_switch(&f->sp, t_sched_sp); }
[[noreturn]] void finish(fiber *f) {
    cudaemu_ctx_switch(&f->sp, t_sched_sp);
    __builtin_unreachable();
}
#endif

/* ---- errors ---- */
bool same_site(const char *fa, int la, const char *fb, int lb) {
    return la == lb && (fa == fb || !strcmp(fa, fb));
}

/* Records a device-side fault of the running block (sticky). */
void block_error(block_run *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void block_error(block_run *b, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cudaemu_record_error(cudaErrorLaunchFailure, 1, "kernel %s (launched at %s:%d), block (%u,%u,%u): %s",
                         b->site->name, b->site->file, b->site->line, b->bid.x, b->bid.y, b->bid.z, msg);
    b->failed = 1;
}

/* From inside a fiber: record and never come back. */
[[noreturn]] void fiber_fail(fiber *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void fiber_fail(fiber *f, const char *fmt, ...) {
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    block_error(t_blk, "thread %d: %s", f->index, msg);
    finish(f);
}

block_run *need_block(const char *what) {
    if (!t_blk) {
        fprintf(stderr, "cudaemu: %s called outside a kernel\n", what);
        abort();
    }
    return t_blk;
}

void cp_apply(fiber *f, int upto) { /* copies of groups < upto; upto < 0: everything */
    size_t keep = 0;
    for (size_t i = 0; i < f->cp.size(); i++) {
        cp_pending &p = f->cp[i];
        if (upto < 0 || (p.group >= 0 && p.group < upto)) memcpy(p.dst, p.data, p.bytes);
        else f->cp[keep++] = p;
    }
    f->cp.resize(keep);
}

void fiber_main(fiber *f) {
    block_run *b = t_blk;
    b->body(b->ctx);
    cp_apply(f, -1);
    f->state = F_DONE;
    b->done++;
    b->w[f->index >> 5].exited |= 1u << (f->index & 31);
    finish(f);
}


/* No fiber can run and some have not exited: say why. */
void diagnose(block_run *b) {
    for (fiber &f : b->f) {
        if (f.state != F_WARP) continue;
        const int w0 = f.index & ~31;
        for (int l = 0; l < 32; l++) {
            if (!(f.mask >> l & 1) || w0 + l == f.index) continue;
            if (w0 + l >= b->n) {
                block_error(b, "%s at %s:%d: mask 0x%08x names lane %d, which does not exist (block of %d threads)",
                            f.what, f.file, f.line, f.mask, l, b->n);
                return;
            }
            fiber &g = b->f[w0 + l];
            if (g.state == F_DONE) {
                block_error(b, "%s at %s:%d (thread %d): mask 0x%08x names lane %d (thread %d), which has exited",
                            f.what, f.file, f.line, f.index, f.mask, l, g.index);
                return;
            }
            if (g.state == F_BAR || (g.state == F_WARP && !(same_site(f.file, f.line, g.file, g.line) &&
                                                            f.mask == g.mask && f.fn == g.fn))) {
                block_error(b,
                            "warp divergence: thread %d waits at %s %s:%d (mask 0x%08x) while thread %d waits at "
                            "%s %s:%d (mask 0x%08x)",
                            f.index, f.what, f.file, f.line, f.mask, g.index, g.what, g.file, g.line,
                            g.state == F_WARP ? g.mask : 0xffffffffu);
                return;
            }
        }
    }
    fiber *a = nullptr, *ex = nullptr;
    int waiting = 0;
    for (fiber &f : b->f) {
        if (f.state == F_DONE && !ex) ex = &f;
        if (f.state != F_BAR) continue;
        waiting++;
        if (!a) a = &f;
        else if (!same_site(a->file, a->line, f.file, f.line) || a->what != f.what) {
            block_error(b, "barrier divergence: thread %d waits at %s %s:%d while thread %d waits at %s %s:%d",
                        a->index, a->what, a->file, a->line, f.index, f.what, f.file, f.line);
            return;
        }
    }
    if (a && ex) {
        block_error(b,
                    "deadlock: %d threads wait at %s %s:%d but %d threads of the block have exited (thread %d "
                    "first); every thread must reach a __syncthreads that any thread reaches",
                    waiting, a->what, a->file, a->line, b->done, ex->index);
        return;
    }
    block_error(b, "stuck block (emulator bug?): %d of %d threads exited", b->done, b->n);
}

void run_block(block_run *b) {
    const int n = b->n;
    b->order.resize(n);
    for (int i = 0; i < n; i++) b->order[i] = g_ord.threads == ORD_REVERSE ? n - 1 - i : i;
    t_blk = b;
    while (!b->failed && b->done < n) {
        if (g_ord.threads == ORD_RANDOM)
            for (int i = n - 1; i > 0; i--) std::swap(b->order[i], b->order[next_rand() % (unsigned long long)(i + 1)]);
        int ran = 0;
        for (int k = 0; k < n && !b->failed; k++) {
            fiber *f = &b->f[b->order[k]];
            if (f->state != F_NEW && f->state != F_RUN) continue;
            t_cur = f;
            cudaemu_self = &f->view;
            enter(f);
            ran++;
            if (f->state == F_DONE) {
                stack_put(f->stack);
                f->stack = nullptr;
            }
        }
        if (!ran && !b->failed) diagnose(b);
    }
    for (fiber &f : b->f)
        if (f.stack) { /* abandoned after an error */
            stack_put(f.stack);
            f.stack = nullptr;
        }
    t_blk = nullptr;
    t_cur = nullptr;
    cudaemu_self = nullptr;
}

} /* namespace */

/* ---- barriers ---- */
int barrier(int kind, int pred, const char *file, int line) {
    static const char *names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
    block_run *b = need_block("__syncthreads");
    fiber *f = t_cur;
    if (b->bar_arrived == 0) {
        b->bar_file = file;
        b->bar_line = line;
        b->bar_mismatch = 0;
        b->bar_count = 0;
        b->bar_and = 1;
        b->bar_or = 0;
    } else if (!same_site(b->bar_file, b->bar_line, file, line)) {
        b->bar_mismatch = 1;
    }
    b->bar_count += pred != 0;
    b->bar_and &= pred != 0;
    b->bar_or |= pred != 0;
    f->state = F_BAR;
    f->file = file;
    f->line = line;
    f->what = names[kind & 3];
    if (++b->bar_arrived == b->n && !b->bar_mismatch) { /* the last one releases everybody */
        b->bar_result = kind == 1 ? b->bar_count : kind == 2 ? b->bar_and : kind == 3 ? b->bar_or : 0;
        b->bar_arrived = 0;
        for (fiber &g : b->f)
            if (g.state == F_BAR) g.state = F_RUN;
        return b->bar_result;
    }
    leave(f);
    return b->bar_result;
}

/* ---- warp collectives ---- */
void warp_collective(unsigned mask, const void *in, size_t nin, void *out, size_t nout, combine_fn fn,
                     const char *what, const char *file, int line) {
    block_run *b = need_block(what);
    fiber *f = t_cur;
    const int lane = f->index & 31, w0 = f->index & ~31;
    warp_state &w = b->w[f->index >> 5];
    if (!(mask >> lane & 1))
        fiber_fail(f, "%s at %s:%d: mask 0x%08x does not contain the calling lane %d", what, file, line, mask, lane);
    if (nin) memcpy(w.lanes[lane].in, in, nin);
    f->state = F_WARP;
    f->file = file;
    f->line = line;
    f->what = what;
    f->mask = mask;
    f->fn = fn;
    w.arrived |= 1u << lane;
    if ((w.arrived & mask) == mask) {
        bool same = true;
        for (int l = 0; l < 32 && same; l++) {
            if (!(mask >> l & 1)) continue;
            const fiber &g = b->f[w0 + l];
            same = g.fn == fn && g.mask == mask && same_site(g.file, g.line, file, line);
        }
        if (same) { /* the last lane computes for all and goes on */
            if (const char *err = fn(w.lanes, mask)) fiber_fail(f, "%s at %s:%d: %s", what, file, line, err);
            for (int l = 0; l < 32; l++)
                if (mask >> l & 1) b->f[w0 + l].state = F_RUN;
            w.arrived &= ~mask;
            if (nout) memcpy(out, w.lanes[lane].out, nout);
            return;
        }
    }
    leave(f);
    if (nout) memcpy(out, w.lanes[lane].out, nout);
}

unsigned active_mask() {
    block_run *b = need_block("__activemask");
    return ~b->w[t_cur->index >> 5].exited;
}

unsigned lane_id() {
    need_block("lane_id");
    return (unsigned)t_cur->index & 31u;
}

const char *shfl_combine(lane_slot *lanes, unsigned mask) {
    static __thread char err[160];
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        const shfl_in *s = (const shfl_in *)lanes[l].in;
        const int wd = s->width;
        if (wd < 1 || wd > 32 || (wd & (wd - 1))) {
            snprintf(err, sizeof err, "width %d is not a power of two in [1, 32]", wd);
            return err;
        }
        const int base = l & ~(wd - 1);
        int src = l;
        switch (s->mode) {
        case SHFL_IDX: src = base + (s->arg & (wd - 1)); break;
        case SHFL_UP: src = l - s->arg >= base ? l - s->arg : l; break;
        case SHFL_DOWN: src = l + s->arg < base + wd ? l + s->arg : l; break;
        default: src = ((l ^ s->arg) & ~(wd - 1)) == base ? (l ^ s->arg) : l; break;
        }
        if (!(mask >> src & 1)) {
            snprintf(err, sizeof err, "lane %d reads lane %d, which is not in mask 0x%08x", l, src, mask);
            return err;
        }
        memcpy(lanes[l].out, ((const shfl_in *)lanes[src].in)->v, sizeof s->v);
    }
    return nullptr;
}

const char *vote_combine(lane_slot *lanes, unsigned mask) {
    unsigned bits = 0;
    int kind = 0;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) {
            const int *in = (const int *)lanes[l].in;
            bits |= (unsigned)(in[0] != 0) << l;
            kind = in[1];
        }
    const unsigned r = kind == 0 ? bits : kind == 1 ? bits != 0 : bits == mask;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) memcpy(lanes[l].out, &r, sizeof r);
    return nullptr;
}

const char *sync_combine(lane_slot *, unsigned) { return nullptr; }

/* ---- shared memory ---- */
void *static_shared(const void *site, size_t bytes, size_t align, const char *file, int line) {
    block_run *b = need_block("__shared__");
    for (const auto &e : b->smap)
        if (e.site == site) return b->sarena.data() + e.off;
    if (align < 16) align = 16;
    const size_t off = (b->sused + align - 1) & ~(align - 1);
    if (off + bytes > kStaticSmem)
        fiber_fail(t_cur, "__shared__ at %s:%d: static shared memory of the block exceeds 48 KiB (%zu bytes)", file,
                   line, off + bytes);
    if (off + bytes + b->dyn_bytes > kMaxSmem)
        fiber_fail(t_cur, "__shared__ at %s:%d: static (%zu) + dynamic (%zu) shared memory exceeds 227 KiB", file,
                   line, off + bytes, b->dyn_bytes);
    memset(b->sarena.data() + off, cudaemu_fill_byte(), bytes);
    b->smap.push_back({site, off});
    b->sused = off + bytes;
    return b->sarena.data() + off;
}

void *dynamic_shared() { return need_block("extern __shared__")->dyn; }

/* ---- cp.async ---- */
void cp_async(void *dst, const void *src, size_t bytes) {
    need_block("cp.async");
    cp_pending p;
    p.dst = dst;
    p.bytes = bytes > 16 ? 16 : bytes;
    memcpy(p.data, src, p.bytes);
    p.group = -1;
    t_cur->cp.push_back(p);
}
void cp_async_commit() {
    need_block("cp.async.commit_group");
    fiber *f = t_cur;
    for (cp_pending &p : f->cp)
        if (p.group < 0) p.group = f->cp_groups;
    f->cp_groups++;
}
void cp_async_wait(int n) {
    need_block("cp.async.wait_group");
    cp_apply(t_cur, t_cur->cp_groups - n);
}

int set_orders(const char *thread_order, const char *block_order) {
    load_orders();
    int ok = 1;
    if (thread_order) ok &= parse_thread_order(thread_order);
    if (block_order) ok &= parse_block_order(block_order);
    return ok;
}

/* ---- launch ---- */
/* CUDAEMU_FAIL_KERNEL=name[:n]: the n-th launch (1-based, default 1) of kernel `name`
 * faults as an illegal address would on a device (sticky), so tests can check that a
 * kernel failure reaches the caller's status and the trainer's exit code. The launches
 * of a kernel template, named as written (`name<T>`), count as launches of `name`. */
long long g_fail_seen = 0, g_fail_nth = 1; /* launches of the named kernel; the one to fault */
void fail_kernel_unused() {
    const char *spec = getenv("CUDAEMU_FAIL_KERNEL");
    if (g_fail_seen < g_fail_nth)
        fprintf(stderr, "cudaemu: CUDAEMU_FAIL_KERNEL=%s injected nothing: the kernel was launched %lld time(s)\n",
                spec, g_fail_seen);
}
int injected_fault(const launch_site &s) {
    cudaemu_env_check();
    static const char *spec = getenv("CUDAEMU_FAIL_KERNEL");
    static long long &seen = g_fail_seen;
    static int armed = spec && *spec && (atexit(fail_kernel_unused), 1);
    (void)armed;
    if (!spec || !*spec) return 0;
    const char *colon = strchr(spec, ':');
    const size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (strncmp(s.name, spec, len) != 0 || (s.name[len] != '\0' && s.name[len] != '<')) return 0;
    const long long nth = colon ? atoll(colon + 1) : 1;
    g_fail_nth = nth;
    if (++seen != nth) return 0;
    cudaemu_record_error(cudaErrorIllegalAddress, 1,
                         "kernel %s launched at %s:%d: an illegal memory access was encountered (fault injected by "
                         "CUDAEMU_FAIL_KERNEL=%s)",
                         s.name, s.file, s.line, spec);
    return 1;
}

int launch_check(const launch_site &s, const launch_cfg &c) {
    if (cudaemu_sticky_error() != cudaSuccess) return 0;
    if (injected_fault(s)) return 0;
    if (t_blk) {
        cudaemu_record_error(cudaErrorLaunchFailure, 1,
                             "kernel %s launched at %s:%d from device code: dynamic parallelism is not emulated",
                             s.name, s.file, s.line);
        return 0;
    }
    const dim3 g = c.grid, k = c.block;
    const char *why = nullptr;
    if (!g.x || !g.y || !g.z || !k.x || !k.y || !k.z) why = "a dimension is 0";
    else if ((unsigned long long)k.x * k.y * k.z > 1024) why = "more than 1024 threads per block";
    else if (k.x > 1024 || k.y > 1024 || k.z > 64) why = "block dimension over (1024, 1024, 64)";
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) why = "grid dimension over (2^31-1, 65535, 65535)";
    if (why) {
        cudaemu_record_error(cudaErrorInvalidConfiguration, 0,
                             "kernel %s launched at %s:%d with grid (%u,%u,%u) block (%u,%u,%u): %s", s.name, s.file,
                             s.line, g.x, g.y, g.z, k.x, k.y, k.z, why);
        return 0;
    }
    const size_t optin = cudaemu_func_max_dynamic_smem(s.func);
    if (c.smem > kMaxSmem || (c.smem > kDefaultSmem && c.smem > optin)) {
        cudaemu_record_error(cudaErrorInvalidValue, 0,
                             "kernel %s launched at %s:%d with %zu bytes of dynamic shared memory: over %s", s.name,
                             s.file, s.line, c.smem,
                             c.smem > kMaxSmem ? "the 227 KiB limit"
                             : optin ? "its cudaFuncAttributeMaxDynamicSharedMemorySize"
                                     : "48 KiB without cudaFuncSetAttribute(kernel, "
                                       "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)");
        return 0;
    }
    return 1;
}

int check_pointer_arg(const launch_site &s, int index, const void *p) {
    if (!p || cudaemu_is_kernel_accessible(p)) return 1;
    cudaemu_record_error(cudaErrorIllegalAddress, 1,
                         "kernel %s launched at %s:%d: argument %d (%p) is neither device memory nor page-locked "
                         "host memory (a host pointer passed to a kernel?)",
                         s.name, s.file, s.line, index + 1, p);
    return 0;
}

void run_grid(const launch_site &s, const launch_cfg &c, void (*body)(void *), void *ctx) {
    load_orders();
    cudaemu_device_access acc; /* the whole grid may touch device memory (src/hostaccess.cpp) */
    block_run *b = &t_run;
    const dim3 g = c.grid, k = c.block;
    const int n = (int)(k.x * k.y * k.z);
    b->site = &s;
    b->body = body;
    b->ctx = ctx;
    b->n = n;
    b->failed = 0;
    b->f.resize(n);
    b->w.resize((n + 31) / 32);
    b->sarena.resize(kStaticSmem);
    b->dyn_bytes = c.smem;
    std::vector<unsigned char> dyn(c.smem + 128);
    b->dyn = (unsigned char *)(((uintptr_t)dyn.data() + 127) & ~(uintptr_t)127);
    const unsigned long long nb = (unsigned long long)g.x * g.y * g.z;
    for (unsigned long long i = 0; i < nb && !b->failed; i++) {
        const unsigned long long lin = g_ord.blocks == ORD_REVERSE ? nb - 1 - i : i;
        b->bid = uint3{(unsigned)(lin % g.x), (unsigned)(lin / g.x % g.y), (unsigned)(lin / ((unsigned long long)g.x * g.y))};
        for (int t = 0; t < n; t++) {
            fiber &f = b->f[t];
            f.view.tid = uint3{(unsigned)t % k.x, (unsigned)t / k.x % k.y, (unsigned)t / (k.x * k.y)};
            f.view.bid = b->bid;
            f.view.bdim = k;
            f.view.gdim = g;
            f.index = t;
            f.state = F_NEW;
            f.stack = nullptr;
            f.cp.clear();
            f.cp_groups = 0;
        }
        for (size_t i2 = 0; i2 < b->w.size(); i2++) {
            const int live = n - 32 * (int)i2;
            b->w[i2].arrived = 0;
            b->w[i2].exited = live >= 32 ? 0u : ~((1u << live) - 1u);
        }
        b->done = 0;
        b->bar_arrived = 0;
        b->smap.clear();
        b->sused = 0;
        if (c.smem) memset(b->dyn, cudaemu_fill_byte(), c.smem);
        run_block(b);
    }
}

} /* namespace cudaemu */
