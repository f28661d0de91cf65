/* tests/cudaemu/selftest/test_runtime_trap.cu: CUDAEMU_HOST_ACCESS (src/hostaccess.cpp):
 * host code that touches cudaMalloc memory aborts, as it would misbehave on a GPU.
 *
 * Run without arguments, the driver runs each case below in a child process (this
 * program again, with the case's name and environment) and checks how the child ended
 * and what it wrote to stderr. Returns the number of failed checks.
 *   host_read    (the default mode) a host read of byte 12 of a 400-byte cudaMalloc:
 *                SIGABRT; the message names the address, "byte 12 of a cudaMalloc of 400
 *                bytes", the offending function and its line (addr2line)
 *   host_write   trap: a host write to byte 5000 of a 10000-byte allocation (third page)
 *   past_end     trap: a host read just past a 400-byte allocation's end
 *   freed        trap: a host read of freed device memory
 *   work_read    trap: pinned, registered and managed memory are read and written on the
 *                host; kernels (from two host threads at once), memcpy (sync, async, 2D,
 *                device to device), memset and cuBLASLt give the right values; then a host
 *                read of device memory still aborts (every entry closed what it opened)
 *   allow        CUDAEMU_HOST_ACCESS=allow: the host read goes through (the 0xFF fill)
 *   other_fault  trap: a fault outside device memory still dies of SIGSEGV, without
 *                the message (the previous handler: the default action)
 * Under AddressSanitizer (test_runtime_trap_asan) past_end and freed are ASan's
 * use-after-poison reports (the arena poisons padding and freed ranges), other_fault is
 * ASan's SEGV report, and one more case:
 *   kernel_overrun  a kernel writing one float past a 100-float allocation is reported
 *                   (ASan use-after-poison), as heap redzones did before the arena. */
#include <cublasLt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "selftest.h"

/* Each host access sits on its own marked line; the parent looks the line up. */
__attribute__((noinline)) float trap_host_read(const float *d) {
    return ((const volatile float *)d)[3]; /* @host_read */
}
__attribute__((noinline)) void trap_host_write(char *d) {
    ((volatile char *)d)[5000] = 1; /* @host_write */
}

__global__ void fill_kernel(float *out, int n, float v) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = v + (float)i;
    __syncthreads();
}

__global__ void overrun_kernel(float *out, int n) {
    if (threadIdx.x == 0) out[n] = 1.0f; /* @overrun */
}

/* Slow enough that two host threads' launches overlap: each thread sums the buffer. */
__global__ void busy_kernel(float *out, const float *in, int n) {
    __shared__ float s[64];
    float acc = 0;
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < n; i++) acc += in[i];
        __syncthreads();
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = s[blockDim.x - 1];
}

#define DIE(...)                                                                                                    \
    do {                                                                                                            \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                        \
        fprintf(stderr, __VA_ARGS__);                                                                               \
        fprintf(stderr, "\n");                                                                                      \
        exit(3);                                                                                                    \
    } while (0)
#define OK(call)                                                                                                    \
    do {                                                                                                            \
        if ((call) != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(cudaGetLastError()));                   \
    } while (0)

static void *dev(size_t bytes) {
    void *p = NULL;
    OK(cudaMalloc(&p, bytes));
    return p;
}

/* The device work of work_read; exits 3 naming the first wrong value. */
static void device_work(void) {
    const int n = 100;
    float *d = (float *)dev(n * sizeof(float)), *d2 = (float *)dev(n * sizeof(float));
    float h[100];
    /* pinned, registered and managed memory: the host reads and writes them */
    float *pinned = NULL, *managed = NULL;
    OK(cudaMallocHost((void **)&pinned, n * sizeof(float)));
    for (int i = 0; i < n; i++) pinned[i] = (float)(2 * i);
    float *reg = (float *)malloc(n * sizeof(float));
    OK(cudaHostRegister(reg, n * sizeof(float), 0));
    for (int i = 0; i < n; i++) reg[i] = -1.0f;
    OK(cudaMallocManaged((void **)&managed, n * sizeof(float), 1));
    managed[0] = 5.0f;
    /* kernel, then copies of every kind */
    fill_kernel<<<1, 64>>>(d, n, 1.0f);
    OK(cudaGetLastError());
    OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    if (h[0] != 1.0f || h[99] != 100.0f) DIE("kernel + cudaMemcpy: %g %g", h[0], h[99]);
    fill_kernel<<<1, 64>>>(managed, n, 7.0f); /* managed: the kernel writes, the host reads */
    if (managed[0] != 7.0f || managed[99] != 106.0f) DIE("managed: %g %g", managed[0], managed[99]);
    OK(cudaMemcpyAsync(d2, pinned, n * sizeof(float), cudaMemcpyHostToDevice, 0));
    OK(cudaMemcpyAsync(d, d2, n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
    OK(cudaMemcpy(reg, d, n * sizeof(float), cudaMemcpyDefault));
    if (reg[10] != 20.0f) DIE("async / device-to-device copies: %g", reg[10]);
    OK(cudaMemset(d, 0, 10 * sizeof(float)));
    OK(cudaMemsetAsync(d + 10, 0, 10 * sizeof(float), 0));
    OK(cudaMemcpy2D(d + 20, 10 * sizeof(float), pinned, 5 * sizeof(float), 5 * sizeof(float), 2,
                    cudaMemcpyHostToDevice)); /* rows of 5 floats to a pitch of 10 */
    OK(cudaMemcpy2D(h, 5 * sizeof(float), d + 20, 10 * sizeof(float), 5 * sizeof(float), 2,
                    cudaMemcpyDeviceToHost));
    if (h[0] != 0.0f || h[4] != 8.0f || h[5] != 10.0f) DIE("cudaMemcpy2D: %g %g %g", h[0], h[4], h[5]);
    OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    if (h[0] != 0.0f || h[19] != 0.0f || h[30] != 10.0f || h[40] != 80.0f)
        DIE("cudaMemset / cudaMemcpy2D: %g %g %g %g", h[0], h[19], h[30], h[40]);
    /* cuBLASLt: D (2x2) = A (2x3) B (3x2), column-major */
    const float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 1, 0, 1, 1}, one = 1, zero = 0;
    float *dA = (float *)dev(sizeof A), *dB = (float *)dev(sizeof B), *dD = (float *)dev(4 * sizeof(float));
    OK(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice));
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    if (cublasLtCreate(&lt) || cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 3, 2) || cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 3, 2, 3) ||
        cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 2, 2))
        DIE("cuBLASLt setup");
    if (cublasLtMatmul(lt, desc, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0))
        DIE("cublasLtMatmul failed");
    OK(cudaMemcpy(h, dD, 4 * sizeof(float), cudaMemcpyDeviceToHost));
    /* column 0 of B = (1,0,1): A[:,0] + A[:,2] = (6, 8); column 1 = (0,1,1): (8, 10) */
    if (h[0] != 6.0f || h[1] != 8.0f || h[2] != 8.0f || h[3] != 10.0f)
        DIE("cublasLtMatmul: %g %g %g %g", h[0], h[1], h[2], h[3]);
    /* two host threads launching at once: neither closes the memory under the other */
    float *in = (float *)dev(4096 * sizeof(float)), *o1 = (float *)dev(64), *o2 = (float *)dev(64);
    OK(cudaMemset(in, 0, 4096 * sizeof(float)));
    auto launches = [in](float *o) {
        for (int i = 0; i < 40; i++) busy_kernel<<<4, 64>>>(o, in, 4096);
    };
    std::thread t1(launches, o1), t2(launches, o2);
    t1.join();
    t2.join();
    OK(cudaMemcpy(h, o1, 16, cudaMemcpyDeviceToHost));
    if (h[0] != 0.0f) DIE("busy_kernel: %g", h[0]);
    OK(cudaFreeHost(pinned));
    OK(cudaHostUnregister(reg));
    free(reg);
    OK(cudaFree(managed));
}

/* The child: one case. */
static int child(const char *c) {
    if (!strcmp(c, "host_read") || !strcmp(c, "allow")) {
        float *d = (float *)dev(400);
        fprintf(stderr, "device address %p\n", (void *)((char *)d + 12));
        const float v = trap_host_read(d);
        fprintf(stderr, "host read %s\n", isnan(v) ? "NaN" : "a number");
        return 0;
    }
    if (!strcmp(c, "host_write")) {
        char *d = (char *)dev(400);
        char *big = (char *)dev(10000);
        (void)d;
        fprintf(stderr, "device address %p\n", (void *)(big + 5000));
        trap_host_write(big);
        return 0;
    }
    if (!strcmp(c, "past_end")) {
        char *d = (char *)dev(400);
        fprintf(stderr, "device address %p\n", (void *)(d + 400));
        fprintf(stderr, "read %d\n", ((volatile char *)d)[400]);
        return 0;
    }
    if (!strcmp(c, "freed")) {
        float *keep = (float *)dev(400), *d = (float *)dev(400);
        (void)keep;
        OK(cudaFree(d));
        fprintf(stderr, "device address %p\n", (void *)((char *)d + 12));
        trap_host_read(d);
        return 0;
    }
    if (!strcmp(c, "work_read")) {
        device_work();
        float *d = (float *)dev(400);
        fprintf(stderr, "work ok\ndevice address %p\n", (void *)((char *)d + 12));
        trap_host_read(d);
        return 0;
    }
    if (!strcmp(c, "kernel_overrun")) {
        float *d = (float *)dev(100 * sizeof(float));
        fprintf(stderr, "device address %p\n", (void *)(d + 100));
        overrun_kernel<<<1, 32>>>(d, 100);
        return 0;
    }
    if (!strcmp(c, "other_fault")) {
        (void)dev(400);
        volatile uintptr_t wild = 16; /* not device memory */
        *(volatile int *)wild = 1;
        return 0;
    }
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}

/* Runs this program on `c` with CUDAEMU_HOST_ACCESS=`mode` (NULL: unset); returns the
 * wait status and the child's stderr. */
static int run_child(const char *self, const char *c, const char *mode, std::string *err) {
    int fd[2];
    if (pipe(fd) != 0) DIE("pipe");
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        if (mode)
            setenv("CUDAEMU_HOST_ACCESS", mode, 1);
        else
            unsetenv("CUDAEMU_HOST_ACCESS");
        execl(self, self, c, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0) err->append(buf, (size_t)k);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* The value after `key` up to the end of its line ("" if absent). */
static std::string after(const std::string &s, const char *key) {
    const size_t at = s.find(key);
    if (at == std::string::npos) return "";
    const size_t b = at + strlen(key), e = s.find('\n', b);
    return s.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

/* A trap case: the child died of SIGABRT with the message naming its own address and
 * `where`; `func`, `line_marker` (if given): the backtrace names that function and the
 * marked source line. Returns the child's stderr. */
static std::string expect_trap(const char *self, const char *c, const char *mode, const char *where, const char *func,
                        const char *line_marker) {
    std::string err;
    const int st = run_child(self, c, mode, &err);
    ST_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: not aborted (status 0x%x); stderr:\n%s", c, st,
             err.c_str());
    const std::string addr = after(err, "device address ");
    ST_CHECK(!addr.empty() && err.find("cudaemu: host code touched device memory at " + addr + " (" + where + ")") !=
                                  std::string::npos,
             "%s: no message for address %s with (%s); stderr:\n%s", c, addr.c_str(), where, err.c_str());
    ST_CHECK(err.find("on a GPU this reads garbage or faults; copy it with cudaMemcpy or do it in a kernel") !=
                 std::string::npos,
             "%s: advice missing; stderr:\n%s", c, err.c_str());
    if (func)
        ST_CHECK(err.find(func) != std::string::npos, "%s: backtrace does not name %s; stderr:\n%s", c, func,
                 err.c_str());
    if (line_marker) {
        char at[128];
        snprintf(at, sizeof at, "test_runtime_trap.cu:%d", st_line_of(__FILE__, line_marker));
        ST_CHECK(st_line_of(__FILE__, line_marker) > 0 && err.find(at) != std::string::npos,
                 "%s: backtrace does not name %s; stderr:\n%s", c, at, err.c_str());
    }
    return err;
}

/* An ASan build's case: ASan reported `what` (followed by the child's address, if it
 * printed one) and the child failed, without the emulator's message. */
__attribute__((unused)) static std::string expect_asan(const char *self, const char *c, const char *what) {
    std::string err;
    const int st = run_child(self, c, "trap", &err);
    const std::string addr = after(err, "device address ");
    ST_CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "%s: the child succeeded", c);
    ST_CHECK(err.find(std::string("AddressSanitizer: ") + what + addr) != std::string::npos &&
                 err.find("host code touched") == std::string::npos,
             "%s: no ASan report \"%s%s\"; stderr:\n%s", c, what, addr.c_str(), err.c_str());
    return err;
}

int main(int argc, char **argv) {
    if (argc == 2) return child(argv[1]);
    char exe[4096];
    const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) DIE("readlink /proc/self/exe");
    exe[k] = '\0';
    expect_trap(exe, "host_read", NULL, "byte 12 of a cudaMalloc of 400 bytes", "trap_host_read", "host_read");
    expect_trap(exe, "host_write", "trap", "byte 5000 of a cudaMalloc of 10000 bytes", "trap_host_write",
                "host_write");
#ifdef __SANITIZE_ADDRESS__
    expect_asan(exe, "past_end", "use-after-poison on address ");
    expect_asan(exe, "freed", "use-after-poison on address ");
#else
    expect_trap(exe, "past_end", "trap", "byte 400 of a cudaMalloc of 400 bytes: past its end", NULL, NULL);
    expect_trap(exe, "freed", "trap", "in no live cudaMalloc allocation: freed, or never allocated", NULL, NULL);
#endif
    std::string err = expect_trap(exe, "work_read", "trap", "byte 12 of a cudaMalloc of 400 bytes", "trap_host_read", NULL);
    ST_CHECK(err.find("work ok") != std::string::npos, "work_read: the device work failed; stderr:\n%s", err.c_str());
    err.clear();
    int st = run_child(exe, "allow", "allow", &err);
    ST_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && err.find("host read NaN") != std::string::npos,
             "allow: status 0x%x; stderr:\n%s", st, err.c_str());
#ifdef __SANITIZE_ADDRESS__
    expect_asan(exe, "other_fault", "SEGV on unknown address 0x000000000010");
    err = expect_asan(exe, "kernel_overrun", "use-after-poison on address ");
    char at[128];
    snprintf(at, sizeof at, "test_runtime_trap.cu:%d", st_line_of(__FILE__, "overrun"));
    ST_CHECK(err.find(at) != std::string::npos, "kernel_overrun: ASan does not name %s; stderr:\n%s", at, err.c_str());
#else
    err.clear();
    st = run_child(exe, "other_fault", "trap", &err);
    ST_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV && err.find("host code touched") == std::string::npos,
             "other_fault: status 0x%x; stderr:\n%s", st, err.c_str());
#endif
    if (st_failures) fprintf(stderr, "%d check(s) failed\n", st_failures);
    return st_failures;
}
