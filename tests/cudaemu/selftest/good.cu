/* tests/cudaemu/selftest/good.cu: correct kernels that must give exact answers under
 * every thread and block order (ctest runs this under CUDAEMU_ORDER=forward, reverse
 * and random:<seed>): block reduction, all shuffles and votes, barriers with
 * predicates, atomics, static and dynamic shared memory, 3-D indices, cp.async, and
 * the bf16 mma / ldmatrix emulation of kernels/cuda/ptx.cuh against an fp32 matmul.
 * Exit 0 when every check passes. */
#include <math.h>

#include "kernels/cuda/ptx.cuh"
#include "selftest.h"

/* Fixed-order block sum, the shape of kernels/cuda/common.cuh's mt_block_sum. */
template <typename T>
__device__ T block_sum(T v, T *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : (T)0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* out[t] = pin[t] and pin[2 + t] = pin[t]: a kernel on page-locked host memory. */
__global__ void cp_pinned_kernel(int *out, int *pin) {
    out[threadIdx.x] = pin[threadIdx.x];
    pin[2 + threadIdx.x] = pin[threadIdx.x];
}

template <typename T>
__global__ void reduce_kernel(T *out, const T *in, int n) {
    __shared__ T sh[32];
    T v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += in[(size_t)blockIdx.x * n + i];
    v = block_sum(v, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

/* out[8 * t + j]: the results of every shuffle kind for thread t. */
__global__ void shuffle_kernel(long long *out) {
    const int t = threadIdx.x, lane = t & 31;
    long long *o = out + 8 * t;
    o[0] = __shfl_sync(0xffffffffu, (long long)t * 1000000007LL, 31 - lane);
    o[1] = __shfl_up_sync(0xffffffffu, t, 3);
    o[2] = __shfl_down_sync(0xffffffffu, t, 5);
    o[3] = (long long)__shfl_xor_sync(0xffffffffu, (double)t + 0.5, 7);
    o[4] = __shfl_sync(0xffffffffu, t, 2, 8); /* width 8: lane 2 of each group of 8 */
    o[5] = __ballot_sync(0xffffffffu, lane & 1);
    o[6] = __any_sync(0xffffffffu, lane == 9) + 2 * __all_sync(0xffffffffu, lane < 31);
    __syncwarp();
    o[7] = (lane < 16) ? __shfl_down_sync(0x0000ffffu, t, 1, 16) : -1; /* partial mask */
}

__global__ void votes_kernel(int *out) {
    const int t = threadIdx.x;
    out[0] = 0;
    const int c = __syncthreads_count(t % 3 == 0);
    const int a = __syncthreads_and(t >= 0);
    const int o = __syncthreads_or(t == 77);
    const int z = __syncthreads_or(0);
    if (t == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = z;
    }
}

__global__ void atomics_kernel(float *f, double *d, int *i, unsigned long long *u, int *mx) {
    atomicAdd(f, 0.5f);
    atomicAdd(d, 0.25f); /* converts, as CUDA */
    atomicAdd(i, 1);
    atomicAdd(u, 3ULL);
    atomicMax(mx, (int)(blockIdx.x * blockDim.x + threadIdx.x));
    atomicMin(mx + 1, -(int)threadIdx.x);
    atomicCAS(mx + 2, 0, 42);
    atomicExch(mx + 3, 7);
}

/* Reverses each block's slice through dynamic shared memory. */
__global__ void reverse_kernel(int *out, const int *in) {
    extern __shared__ int buf[];
    const int n = blockDim.x, base = blockIdx.x * n;
    buf[threadIdx.x] = in[base + threadIdx.x];
    __syncthreads();
    out[base + threadIdx.x] = buf[n - 1 - threadIdx.x];
}

/* 3-D blocks and grids: each thread writes its global linear index. */
__global__ void index3d_kernel(int *out) {
    const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nt + tx] = bx * nt + tx;
}

/* One warp: cp.async A (16x16) and B^T (8x16) bf16 tiles into shared memory, ldmatrix
 * the A fragment, build B's from shared memory, one mma. D is 16x8 fp32. */
__global__ void mma_kernel(float *D, const uint16_t *A, const uint16_t *Bt) {
    __shared__ __align__(16) uint16_t sA[16 * 16];
    __shared__ __align__(16) uint16_t sB[8 * 16];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    mt_cp_async_16(&sA[lane * 8], &A[lane * 8]); /* 32 x 16 bytes = the A tile */
    if (lane < 16) mt_cp_async_16(&sB[lane * 8], &Bt[lane * 8]);
    mt_cp_async_commit();
    mt_cp_async_wait<0>();
    __syncthreads();
    uint32_t a[4], b[2];
    /* matrix i = lane / 8: rows 8 (i & 1) .., columns 8 (i >> 1) .. of A */
    const int i = lane >> 3, r = lane & 7;
    mt_ldmatrix_x4(a, &sA[(8 * (i & 1) + r) * 16 + 8 * (i >> 1)]);
    for (int j = 0; j < 2; j++) { /* b[j] = B[2t + 8j (+1)][g] = Bt[g][2t + 8j (+1)] */
        b[j] = (uint32_t)sB[g * 16 + 2 * t + 8 * j] | ((uint32_t)sB[g * 16 + 2 * t + 8 * j + 1] << 16);
    }
    float c[4] = {1.0f, 2.0f, 3.0f, 4.0f}, d[4];
    mt_mma_bf16_16816(d, a, b, c);
    for (int e = 0; e < 4; e++) D[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
}

/* A cp.async read before its wait must see the old contents (the fill). */
__global__ void cp_async_late_kernel(int *out, const int *in) {
    __shared__ __align__(16) int s[4];
    mt_cp_async_16(s, in);
    mt_cp_async_commit();
    out[0] = s[0]; /* too early */
    mt_cp_async_wait<0>();
    out[1] = s[0];
}

static uint16_t to_bf16(float x) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

int main(void) {
    /* reductions: 3 blocks of 256 threads, exact in both types */
    {
        const int n = 1000, B = 3;
        double hin[B * n], hout[B];
        float fin[B * n], fout[B];
        for (int i = 0; i < B * n; i++) hin[i] = fin[i] = (float)(i % 17);
        double *din = st_dev<double>(B * n), *dout = st_dev<double>(B);
        float *fdin = st_dev<float>(B * n), *fdout = st_dev<float>(B);
        cudaMemcpy(din, hin, sizeof hin, cudaMemcpyHostToDevice);
        cudaMemcpy(fdin, fin, sizeof fin, cudaMemcpyHostToDevice);
        reduce_kernel<double><<<B, 256>>>(dout, din, n);
        reduce_kernel<float><<<B, 256>>>(fdout, fdin, n);
        cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost);
        cudaMemcpy(fout, fdout, sizeof fout, cudaMemcpyDeviceToHost);
        for (int b = 0; b < B; b++) {
            double want = 0;
            for (int i = 0; i < n; i++) want += hin[b * n + i];
            ST_CHECK(hout[b] == want && fout[b] == (float)want, "block %d: %g %g want %g", b, hout[b], fout[b], want);
        }
    }
    /* shuffles and warp votes: 64 threads */
    {
        long long h[64 * 8], *d = st_dev<long long>(64 * 8);
        shuffle_kernel<<<1, 64>>>(d);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        for (int t = 0; t < 64; t++) {
            const int lane = t & 31, w0 = t & ~31;
            const long long *o = h + 8 * t;
            ST_CHECK(o[0] == (long long)(w0 + 31 - lane) * 1000000007LL, "idx t=%d %lld", t, o[0]);
            ST_CHECK(o[1] == (lane >= 3 ? t - 3 : t), "up t=%d %lld", t, o[1]);
            ST_CHECK(o[2] == (lane + 5 < 32 ? t + 5 : t), "down t=%d %lld", t, o[2]);
            ST_CHECK(o[3] == (w0 + (lane ^ 7)), "xor t=%d %lld", t, o[3]);
            ST_CHECK(o[4] == (t & ~7) + 2, "width t=%d %lld", t, o[4]);
            ST_CHECK(o[5] == 0xaaaaaaaaLL, "ballot t=%d %llx", t, (unsigned long long)o[5]);
            ST_CHECK(o[6] == 1, "any/all t=%d %lld", t, o[6]);
            ST_CHECK(o[7] == (lane < 16 ? (lane + 1 < 16 ? t + 1 : t) : -1), "partial t=%d %lld", t, o[7]);
        }
    }
    /* predicated barriers: 96 threads */
    {
        int h[4], *d = st_dev<int>(4);
        votes_kernel<<<1, 96>>>(d);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(h[0] == 32 && h[1] == 1 && h[2] == 1 && h[3] == 0, "%d %d %d %d", h[0], h[1], h[2], h[3]);
    }
    /* atomics: 4 blocks x 128 threads */
    {
        float *f = st_dev<float>(1);
        double *dd = st_dev<double>(1);
        int *i = st_dev<int>(1), *mx = st_dev<int>(4);
        unsigned long long *u = st_dev<unsigned long long>(1);
        cudaMemset(f, 0, 4);
        cudaMemset(dd, 0, 8);
        cudaMemset(i, 0, 4);
        cudaMemset(u, 0, 8);
        cudaMemset(mx, 0, 16);
        atomics_kernel<<<4, 128>>>(f, dd, i, u, mx);
        float hf;
        double hd;
        int hi, hm[4];
        unsigned long long hu;
        cudaMemcpy(&hf, f, 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(&hd, dd, 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(&hi, i, 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(&hu, u, 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(hm, mx, 16, cudaMemcpyDeviceToHost);
        ST_CHECK(hf == 256.0f && hd == 128.0 && hi == 512 && hu == 1536, "%g %g %d %llu", hf, hd, hi, hu);
        ST_CHECK(hm[0] == 511 && hm[1] == -127 && hm[2] == 42 && hm[3] == 7, "%d %d %d %d", hm[0], hm[1], hm[2], hm[3]);
    }
    /* dynamic shared memory: 5 blocks x 200 threads */
    {
        int hin[1000], hout[1000], *din = st_dev<int>(1000), *dout = st_dev<int>(1000);
        for (int i = 0; i < 1000; i++) hin[i] = i * 3;
        cudaMemcpy(din, hin, sizeof hin, cudaMemcpyHostToDevice);
        reverse_kernel<<<5, 200, 200 * sizeof(int)>>>(dout, din);
        cudaMemcpy(hout, dout, sizeof hout, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int i = 0; i < 1000; i++) bad += hout[i] != hin[(i / 200) * 200 + 199 - i % 200];
        ST_CHECK(bad == 0, "%d wrong", bad);
    }
    /* 3-D indices */
    {
        const dim3 g(3, 2, 2), b(4, 3, 5);
        const int n = 12 * 60;
        int h[n], *d = st_dev<int>(n);
        index3d_kernel<<<g, b>>>(d);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int i = 0; i < n; i++) bad += h[i] != i;
        ST_CHECK(bad == 0, "%d wrong", bad);
    }
    /* mma: D = A B + C against fp32 sums of exact bf16 products */
    {
        uint16_t hA[16 * 16], hBt[8 * 16];
        for (int i = 0; i < 256; i++) hA[i] = to_bf16(sinf(0.37f * i) * 3.0f);
        for (int i = 0; i < 128; i++) hBt[i] = to_bf16(cosf(0.11f * i + 1.0f));
        uint16_t *dA = st_dev<uint16_t>(256), *dBt = st_dev<uint16_t>(128);
        float *dD = st_dev<float>(128), hD[128];
        cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
        cudaMemcpy(dBt, hBt, sizeof hBt, cudaMemcpyHostToDevice);
        mma_kernel<<<1, 32>>>(dD, dA, dBt);
        cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost);
        double maxerr = 0;
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                const float c = (float)(1 + (n & 1) + 2 * (m >= 8));
                double want = c, mag = fabs(c);
                for (int k = 0; k < 16; k++) {
                    const double p = (double)from_bf16(hA[m * 16 + k]) * from_bf16(hBt[n * 16 + k]);
                    want += p;
                    mag += fabs(p);
                }
                /* fp32 accumulation of 17 terms: |error| <= 17 u sum |terms| */
                const double err = fabs(hD[m * 8 + n] - want) / (mag * 17 * 5.97e-8);
                maxerr = err > maxerr ? err : maxerr;
            }
        ST_CHECK(maxerr <= 1.0, "mma off by %.2f of its bound", maxerr);
    }
    /* cp.async lands at the wait, not before */
    {
        int h[2], hin[4] = {11, 12, 13, 14}, *din = st_dev<int>(4), *d = st_dev<int>(2);
        cudaMemcpy(din, hin, sizeof hin, cudaMemcpyHostToDevice);
        cp_async_late_kernel<<<1, 1>>>(d, din);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(h[0] != 11 && h[1] == 11, "%d %d", h[0], h[1]);
    }
    /* page-locked host memory (cudaMallocHost) is a valid kernel argument under unified
     * addressing: read and written in place, in stream order (the host pool of
     * parameter / optimizer offload) */
    {
        int *pin = NULL, h[2];
        ST_CHECK(cudaMallocHost((void **)&pin, 4 * sizeof(int)) == cudaSuccess, "cudaMallocHost");
        pin[0] = 21, pin[1] = 22, pin[2] = 0, pin[3] = 0;
        int *d = st_dev<int>(2);
        cp_pinned_kernel<<<1, 2>>>(d, pin);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        ST_CHECK(cudaGetLastError() == cudaSuccess && h[0] == 21 && h[1] == 22, "pinned read: %d %d", h[0], h[1]);
        ST_CHECK(pin[2] == 21 && pin[3] == 22, "pinned write: %d %d", pin[2], pin[3]);
        cudaFreeHost(pin);
    }
    ST_CHECK(cudaDeviceSynchronize() == cudaSuccess, "error: %s", cudaGetErrorString(cudaGetLastError()));
    cudaDeviceReset(); /* frees every allocation */
    printf("good kernels: %s\n", st_failures ? "FAILED" : "ok");
    return st_failures ? 1 : 0;
}
