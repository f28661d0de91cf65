/* tests/cudaemu/selftest/bugs.cu: kernels with one planted bug each; the emulator must
 * report it with the kernel's name and the .cu line(s) marked "@name" here.
 * usage: cudaemu_bugs CASE (one process per case: a sticky error ends a process's
 * device). Exit 0 when the bug was reported as expected. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "selftest.h"

/* Threads of one block wait at two different barriers. */
__global__ void barrier_divergence_kernel(int *out) {
    if (threadIdx.x < 32) {
        __syncthreads(); /* @bar_a */
    } else {
        __syncthreads(); /* @bar_b */
    }
    out[threadIdx.x] = 1;
}

/* Half a warp shuffles at one line, half at another. */
__global__ void warp_divergence_kernel(int *out) {
    int v = threadIdx.x;
    if ((threadIdx.x & 31) < 16)
        v = __shfl_xor_sync(0xffffffffu, v, 1); /* @shfl_a */
    else
        v = __shfl_xor_sync(0xffffffffu, v, 2); /* @shfl_b */
    out[threadIdx.x] = v;
}

/* Warp 1 leaves early; warp 0 waits at a barrier for it forever. */
__global__ void deadlock_kernel(int *out) {
    if (threadIdx.x >= 32) return;
    __syncthreads(); /* @dead */
    out[threadIdx.x] = 1;
}

/* The upper half of the warp has exited but the mask still names it. */
__global__ void exited_lanes_kernel(int *out) {
    if ((threadIdx.x & 31) >= 16) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1); /* @mask_exit */
}

/* Every lane votes with a mask naming only lane 0. */
__global__ void mask_self_kernel(unsigned *out) {
    out[threadIdx.x] = __ballot_sync(0x1u, 1); /* @mask_self */
}

/* Lanes 0..15 read lane 31, outside their mask. */
__global__ void shfl_source_kernel(int *out) {
    if ((threadIdx.x & 31) < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, 7, 31); /* @shfl_src */
}

__global__ void big_smem_kernel(float *out) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

__global__ void dims_kernel(int *out) { out[0] = 1; }

__global__ void host_ptr_kernel(int *out, const int *in) { out[threadIdx.x] = in[threadIdx.x]; }

/* The race: no barrier between the write and the neighbour's read. In forward order
 * thread t - 1 has finished before thread t starts, so the answer is right; any other
 * order reads the fill bytes. */
__global__ void race_kernel(int *out) {
    __shared__ int sh[64];
    const int t = threadIdx.x;
    sh[t] = t + 1;
    /* missing: __syncthreads(); */
    out[t] = t > 0 ? sh[t - 1] : 0;
}

/* A __syncthreads inside a data-dependent branch taken by some blocks only is legal
 * when it is uniform within each block: must NOT be reported. */
__global__ void uniform_branch_kernel(int *out) {
    __shared__ int s;
    if (blockIdx.x & 1) {
        if (threadIdx.x == 0) s = 5;
        __syncthreads();
        out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    } else {
        out[blockIdx.x * blockDim.x + threadIdx.x] = 0;
    }
}

/* Recursion far deeper than a fiber's stack (CUDAEMU_STACK_KIB). */
__device__ __noinline__ int deep(int n) {
    volatile char pad[1024];
    pad[n & 1023] = (char)n;
    return n == 0 ? pad[0] : deep(n - 1) + pad[(n * 7) & 1023];
}
__global__ void stack_overflow_kernel(int *out) { out[threadIdx.x] = deep(4096); }

static int run(const char *c) {
    int *d = st_dev<int>(4096);
    if (!strcmp(c, "barrier_divergence")) {
        barrier_divergence_kernel<<<2, 64>>>(d);
        st_expect_error(cudaErrorLaunchFailure, "barrier_divergence_kernel", __FILE__, "bar_a", "bar_b", NULL);
        ST_CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "not sticky");
    } else if (!strcmp(c, "warp_divergence")) {
        warp_divergence_kernel<<<1, 32>>>(d);
        st_expect_error(cudaErrorLaunchFailure, "warp_divergence_kernel", __FILE__, "shfl_a", "shfl_b", NULL);
    } else if (!strcmp(c, "deadlock")) {
        deadlock_kernel<<<1, 64>>>(d);
        st_expect_error(cudaErrorLaunchFailure, "deadlock_kernel", __FILE__, "dead", NULL);
        ST_CHECK(strstr(cudaGetErrorString(cudaPeekAtLastError()), "deadlock") != NULL, "not called a deadlock");
    } else if (!strcmp(c, "exited_lanes")) {
        exited_lanes_kernel<<<1, 32>>>(d);
        st_expect_error(cudaErrorLaunchFailure, "exited_lanes_kernel", __FILE__, "mask_exit", NULL);
        ST_CHECK(strstr(cudaGetErrorString(cudaPeekAtLastError()), "exited") != NULL, "exit not named");
    } else if (!strcmp(c, "mask_self")) {
        mask_self_kernel<<<1, 32>>>((unsigned *)d);
        st_expect_error(cudaErrorLaunchFailure, "mask_self_kernel", __FILE__, "mask_self", NULL);
    } else if (!strcmp(c, "shfl_source")) {
        shfl_source_kernel<<<1, 32>>>(d);
        st_expect_error(cudaErrorLaunchFailure, "shfl_source_kernel", __FILE__, "shfl_src", NULL);
    } else if (!strcmp(c, "smem_optin")) {
        float *f = st_dev<float>(256);
        big_smem_kernel<<<1, 256, 64 * 1024>>>(f); /* @launch_smem */
        st_expect_error(cudaErrorInvalidValue, "big_smem_kernel", __FILE__, "launch_smem", NULL);
        ST_CHECK(cudaGetLastError() == cudaErrorInvalidValue, "not reported");
        ST_CHECK(cudaGetLastError() == cudaSuccess, "sticky, but a bad launch is not a fault");
        ST_CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
                     cudaSuccess, "attribute");
        big_smem_kernel<<<1, 256, 64 * 1024>>>(f);
        ST_CHECK(cudaGetLastError() == cudaSuccess, "opted-in launch failed");
        float h[256];
        cudaMemcpy(h, f, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(h[0] == 1.0f && h[255] == 0.0f, "opted-in launch computed %g %g", h[0], h[255]);
    } else if (!strcmp(c, "bad_dims")) {
        dims_kernel<<<1, 2048>>>(d); /* @launch_2048 */
        st_expect_error(cudaErrorInvalidConfiguration, "dims_kernel", __FILE__, "launch_2048", NULL);
        ST_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads accepted");
        dims_kernel<<<dim3(1, 70000), 1>>>(d);
        ST_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 70000 accepted");
        dims_kernel<<<1, dim3(1, 1, 65)>>>(d);
        ST_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block.z 65 accepted");
        dims_kernel<<<0, 32>>>(d);
        ST_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid accepted");
        int h = 0;
        dims_kernel<<<1, 1>>>(d);
        cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(cudaGetLastError() == cudaSuccess && h == 1, "good launch after bad ones failed");
    } else if (!strcmp(c, "host_ptr")) {
        static int host[32];
        host_ptr_kernel<<<1, 32>>>(d, host); /* @launch_host */
        st_expect_error(cudaErrorIllegalAddress, "host_ptr_kernel", __FILE__, "launch_host", NULL);
        ST_CHECK(strstr(cudaGetErrorString(cudaPeekAtLastError()), "argument 2") != NULL, "argument not named");
        ST_CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress, "not sticky");
    } else if (!strcmp(c, "race")) {
        int h[64];
        const char *orders[] = {"forward", "reverse", "random:7"};
        for (int o = 0; o < 3; o++) {
            cudaemu::set_orders(orders[o], NULL);
            race_kernel<<<1, 64>>>(d);
            cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
            int right = 1;
            for (int t = 0; t < 64; t++) right &= h[t] == t;
            ST_CHECK(right == (o == 0), "order %s: result %s", orders[o], right ? "right" : "wrong");
        }
    } else if (!strcmp(c, "stack_overflow")) { /* the child must die on the guard page */
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0) {
            stack_overflow_kernel<<<1, 2>>>(d);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        ST_CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "overflow went unnoticed");
    } else if (!strcmp(c, "uniform_branch")) {
        uniform_branch_kernel<<<4, 64>>>(d);
        int h[256];
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(cudaGetLastError() == cudaSuccess, "reported");
        ST_CHECK(h[64] == 5 && h[0] == 0, "wrong values");
    } else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    return st_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CASE\n", argv[0]);
        return 2;
    }
    const int r = run(argv[1]);
    cudaDeviceReset(); /* frees every allocation (a sticky error makes cudaFree refuse) */
    printf("%s %s\n", argv[1], r ? "FAILED" : "ok");
    return r;
}
