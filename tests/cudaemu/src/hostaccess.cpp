/* tests/cudaemu/src/hostaccess.cpp: CUDAEMU_HOST_ACCESS=trap: cudaMalloc memory that
 * host code cannot touch, as on a GPU.
 *
 * On a device, host code that dereferences a cudaMalloc pointer reads garbage or faults;
 * here "device" memory is host memory, so such code works and its bug passes CI. In trap
 * mode every cudaMalloc allocation is carved, page-aligned, out of one arena of reserved
 * address space that is PROT_NONE except while the emulator itself does device work (a
 * kernel's whole grid, a copy or memset, a cuBLASLt matmul). Those entry points bracket
 * the work with cudaemu_device_open / _close: a counter under a mutex (open on 0 -> 1,
 * close on 1 -> 0), so nested or concurrent entries are safe. One arena makes opening
 * and closing one mprotect of its used span each, however many allocations there are
 * (a mapping per allocation would cost a system call and a VMA split per allocation and
 * launch). The kernel's cost is in the span's page-table entries, so the arena asks for
 * transparent huge pages and never splits one (spans end on 2 MiB, freed memory goes
 * back in whole huge pages): one entry per 2 MiB.
 *
 * A host access faults. The SIGSEGV handler, installed with the arena (first cudaMalloc
 * in trap mode), names the address, the allocation and the offset, prints a backtrace
 * whose first frame is the faulting instruction, runs addr2line on it (file:line, when
 * binutils is installed and the code has -g) and aborts. Faults outside the arena go to
 * the handler installed before (ASan's, an MPI library's, or the default crash).
 *
 * Pinned (cudaMallocHost), registered and managed memory are host-accessible on a device
 * and stay ordinary heap memory (src/runtime.cpp). Under AddressSanitizer the padding
 * after each allocation and freed ranges are poisoned, so a kernel's overrun of a device
 * buffer is still reported (as use-after-poison instead of heap-buffer-overflow).
 * What it cannot see: host code on another thread while a launch or copy has the arena
 * open (mprotect is per process). */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "cudaemu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDAEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDAEMU_ASAN 1
#endif
#endif
#ifdef CUDAEMU_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace {

std::mutex g_mu;                 /* the arena, its tables and the open count */
char *g_lo;                      /* arena base; NULL until the first allocation */
size_t g_reserved;               /* bytes of address space reserved at g_lo */
size_t g_hw;                     /* [g_lo, g_lo + g_hw) holds every live allocation */
size_t g_rw_end;                 /* while open: [g_lo, g_lo + g_rw_end) is readable */
int g_open;                      /* entries doing device work now */
std::map<size_t, size_t> g_free; /* offset -> bytes: free page runs below g_hw */
std::map<size_t, size_t> g_live; /* offset -> requested bytes: live allocations */
struct sigaction g_prev;         /* the SIGSEGV action before ours */
char g_exe[4096];                /* /proc/self/exe, for addr2line */

size_t page() {
    static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}
size_t round_pages(size_t b) { return (b + page() - 1) & ~(page() - 1); }

/* The span opened and closed: g_hw rounded up to a 2 MiB huge page, so that mprotect
 * never splits one (the arena asks for transparent huge pages: mprotect then changes
 * one entry per 2 MiB instead of 512, the cost of opening and closing). */
constexpr size_t kHuge = (size_t)2 << 20;
size_t span(size_t end) {
    end = (end + kHuge - 1) & ~(kHuge - 1);
    return end < g_reserved ? end : g_reserved;
}

void protect(char *p, size_t n, int prot) {
    if (n && mprotect(p, n, prot) != 0) {
        perror("cudaemu: CUDAEMU_HOST_ACCESS=trap: mprotect of device memory");
        abort();
    }
}

/* ---- the SIGSEGV handler: async-signal-safe output (write(2) from stack buffers) ---- */
struct line_buf {
    char b[768];
    size_t n = 0;
    void s(const char *t) {
        while (*t && n < sizeof b) b[n++] = *t++;
    }
    void u(unsigned long long v) {
        char d[24];
        int k = 0;
        do d[k++] = (char)('0' + v % 10); while ((v /= 10) && k < 24);
        while (k && n < sizeof b) b[n++] = d[--k];
    }
    void x(uintptr_t v) {
        s("0x");
        char d[20];
        int k = 0;
        do d[k++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) && k < 20);
        while (k && n < sizeof b) b[n++] = d[--k];
    }
    void flush() {
        for (size_t o = 0; o < n;) {
            const ssize_t w = write(2, b + o, n - o);
            if (w <= 0 && errno != EINTR) break;
            if (w > 0) o += (size_t)w;
        }
        n = 0;
    }
};

/* The faulting instruction's address (0 where the ucontext layout is not known here). */
uintptr_t fault_pc(void *uc) {
#if defined(__x86_64__)
    return (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)((ucontext_t *)uc)->uc_mcontext.pc;
#else
    (void)uc;
    return 0;
#endif
}

/* Runs addr2line (or llvm-addr2line) on frames [0, n) of `pcs`, the first being the
 * faulting instruction and the others return addresses (looked up at pc - 1, the call),
 * one run per run of frames in the same module; output on stderr. dladdr is what
 * backtrace_symbols_fd calls too. */
void symbolize(void *const *pcs, int n) {
    int i = 0;
    while (i < n) {
        Dl_info di;
        if (!dladdr(pcs[i], &di) || !di.dli_fname) {
            i++;
            continue;
        }
        const char *mod = di.dli_fname;
        if ((!mod[0] || !strcmp(mod, program_invocation_name)) && g_exe[0]) mod = g_exe;
        const bool pie = ((const ElfW(Ehdr) *)di.dli_fbase)->e_type == ET_DYN;
        static char hex[32][24];
        const char *argv[48] = {"addr2line", "-f", "-C", "-i", "-p", "-e", mod};
        int a = 7, k = 0;
        for (; i < n && k < 32; i++, k++) {
            Dl_info dj;
            if (!dladdr(pcs[i], &dj) || dj.dli_fbase != di.dli_fbase) break;
            uintptr_t pc = (uintptr_t)pcs[i] - (i > 0);
            if (pie) pc -= (uintptr_t)di.dli_fbase;
            line_buf h;
            h.x(pc);
            memcpy(hex[k], h.b, h.n);
            hex[k][h.n] = '\0';
            argv[a++] = hex[k];
        }
        argv[a] = nullptr;
        const pid_t pid = fork();
        if (pid == 0) {
            dup2(2, 1);
            execvp("addr2line", (char *const *)argv);
            argv[0] = "llvm-addr2line";
            execvp("llvm-addr2line", (char *const *)argv);
            _exit(127);
        }
        if (pid > 0)
            while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
            }
    }
}

void chain(int sig, siginfo_t *si, void *uc) {
    if (g_prev.sa_flags & SA_SIGINFO) {
        if (g_prev.sa_sigaction) {
            g_prev.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
        g_prev.sa_handler(sig);
        return;
    }
    /* the default action: return and fault again (a sent signal is raised again) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    if (si->si_code <= 0) raise(sig);
}

void on_segv(int sig, siginfo_t *si, void *uc) {
    const uintptr_t a = (uintptr_t)si->si_addr, lo = (uintptr_t)g_lo;
    if (si->si_code <= 0 || !lo || a < lo || a - lo >= g_reserved) {
        chain(sig, si, uc);
        return;
    }
    line_buf o;
    o.s("cudaemu: host code touched device memory at ");
    o.x(a);
    /* the table, unless another thread holds it (it never does for long) */
    bool locked = false;
    for (int i = 0; i < 200 && !(locked = g_mu.try_lock()); i++) {
        const struct timespec ts = {0, 1000000};
        nanosleep(&ts, nullptr);
    }
    if (locked) {
        const size_t off = a - lo;
        auto it = g_live.upper_bound(off);
        if (it != g_live.begin() && off - (--it)->first < round_pages(it->second)) {
            o.s(" (byte ");
            o.u(off - it->first);
            o.s(" of a cudaMalloc of ");
            o.u(it->second);
            o.s(off - it->first < it->second ? " bytes)" : " bytes: past its end)");
        } else {
            o.s(" (in no live cudaMalloc allocation: freed, or never allocated)");
        }
        g_mu.unlock();
    }
    o.s(": on a GPU this reads garbage or faults; copy it with cudaMemcpy or do it in a kernel "
        "(CUDAEMU_HOST_ACCESS, tests/cudaemu/README.md)\n");
    o.flush();
    void *pcs[64];
    const int n = backtrace(pcs, 64);
    int first = 0;
    const uintptr_t pc = fault_pc(uc);
    for (int i = 0; i < n; i++)
        if ((uintptr_t)pcs[i] == pc) {
            first = i;
            break;
        }
    o.s("cudaemu: backtrace, first the faulting host code:\n");
    o.flush();
    backtrace_symbols_fd(pcs + first, n - first, 2);
    o.s("cudaemu: source lines (addr2line; -g needed):\n");
    o.flush();
    symbolize(pcs + first, n - first < 16 ? n - first : 16);
    abort();
}

void install_handler() {
    void *warm[2];
    backtrace(warm, 2); /* loads the unwinder now: the first backtrace() may allocate */
    const ssize_t k = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    g_exe[k > 0 ? k : 0] = '\0';
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev);
}

/* Reserves the arena (caller holds g_mu): twice the device size plus 4 GiB of address
 * space (allocations are whole pages), at most 64 TiB; no memory until used. */
bool reserve() {
    size_t want = cudaemu_mem_total();
    want = want > ((size_t)1 << 45) ? (size_t)1 << 46 : 2 * want + ((size_t)4 << 30);
    void *m = mmap(nullptr, want + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr,
                "cudaemu: CUDAEMU_HOST_ACCESS=trap: cannot reserve %zu GiB of address space for device memory (%s; "
                "ulimit -v?): lower CUDAEMU_MEM_GIB or set CUDAEMU_HOST_ACCESS=allow\n",
                want >> 30, strerror(errno));
        return false;
    }
    g_reserved = want;
    g_lo = (char *)(((uintptr_t)m + kHuge - 1) & ~(uintptr_t)(kHuge - 1));
    madvise(g_lo, want, MADV_HUGEPAGE); /* where THP is "madvise"; harmless where not */
    install_handler();
    return true;
}

} // namespace

extern "C" int cudaemu_host_trap(void) {
    static const int on = [] {
        cudaemu_env_check();
        const char *v = getenv("CUDAEMU_HOST_ACCESS");
        return (int)(!v || !*v || strcmp(v, "trap") == 0); /* trap by default, ASan builds too */
    }();
    return on;
}

extern "C" void *cudaemu_arena_alloc(size_t bytes, unsigned char fill) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_lo && !reserve()) return nullptr;
    const size_t len = round_pages(bytes ? bytes : 1);
    size_t off = SIZE_MAX;
    for (auto it = g_free.begin(); it != g_free.end(); ++it) /* first fit: the span stays low */
        if (it->second >= len) {
            off = it->first;
            const size_t rest = it->second - len;
            g_free.erase(it);
            if (rest) g_free[off + len] = rest;
            break;
        }
    if (off == SIZE_MAX) {
        if (len > g_reserved - g_hw) return nullptr;
        off = g_hw;
        g_hw += len;
    }
    char *p = g_lo + off;
    /* the whole span, not [p, p + len): a partial mprotect would split huge pages */
    const size_t end = span(off + len);
    if (!g_open)
        protect(g_lo, end, PROT_READ | PROT_WRITE);
    else if (end > g_rw_end)
        protect(g_lo + g_rw_end, end - g_rw_end, PROT_READ | PROT_WRITE);
    UNPOISON(p, len);
    memset(p, fill, len);
    POISON(p + bytes, len - bytes);
    if (!g_open)
        protect(g_lo, end, PROT_NONE);
    else if (end > g_rw_end)
        g_rw_end = end;
    g_live[off] = bytes;
    return p;
}

extern "C" void cudaemu_arena_free(void *ptr) {
    std::lock_guard<std::mutex> lk(g_mu);
    char *p = (char *)ptr;
    if (!g_lo || p < g_lo || (size_t)(p - g_lo) >= g_hw) return;
    auto it = g_live.find((size_t)(p - g_lo));
    if (it == g_live.end()) return;
    size_t off = it->first, len = round_pages(it->second ? it->second : 1);
    g_live.erase(it);
    /* whole huge pages inside the range go back to the system (smaller parts stay for
     * reuse: giving them back would split a huge page) */
    const uintptr_t a = ((uintptr_t)p + kHuge - 1) & ~(uintptr_t)(kHuge - 1), b = ((uintptr_t)p + len) & ~(uintptr_t)(kHuge - 1);
    if (a < b) madvise((void *)a, b - a, MADV_DONTNEED);
    POISON(p, len);
    /* coalesce with the free runs on either side; the top run lowers the span */
    auto next = g_free.find(off + len);
    if (next != g_free.end()) {
        len += next->second;
        g_free.erase(next);
    }
    auto prev = g_free.lower_bound(off);
    if (prev != g_free.begin() && (--prev)->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        g_free.erase(prev);
    }
    if (off + len == g_hw)
        g_hw = off;
    else
        g_free[off] = len;
}

extern "C" void cudaemu_device_open(void) {
    if (!cudaemu_host_trap()) return;
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_open++ == 0) {
        g_rw_end = span(g_hw);
        protect(g_lo, g_rw_end, PROT_READ | PROT_WRITE);
    }
}

extern "C" void cudaemu_device_close(void) {
    if (!cudaemu_host_trap()) return;
    std::lock_guard<std::mutex> lk(g_mu);
    if (--g_open == 0) {
        protect(g_lo, g_rw_end > span(g_hw) ? g_rw_end : span(g_hw), PROT_NONE);
        g_rw_end = 0;
    }
}
