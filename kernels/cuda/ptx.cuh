/* kernels/cuda/ptx.cuh: every inline PTX of the CUDA backend, one wrapper each.
 *
 * No other file under kernels/cuda may contain `asm` (a ctest, cudaemu_no_asm, checks
 * it), so every instruction the CPU emulator must understand is here, next to its
 * emulation. Under the emulator (CUDAEMU defined, tests/cudaemu) each wrapper is
 * implemented from the PTX ISA's fragment tables: mma and ldmatrix are warp-collective
 * operations (all 32 lanes must call them at the same line, as `.sync.aligned` asks);
 * cp.async copies land only when their group is waited for.
 * Layouts below: PTX ISA 9.0, section 9.7.14 "Warp Level Matrix Multiply-Accumulate
 * Instructions": 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
 * type" (the A, B and C/D fragment figures for .bf16), 9.7.14.5.15 "ldmatrix";
 * section 9.7.9.25 "cp.async" (data movement). Notation: lane = %laneid,
 * g = lane >> 2 (groupID), t = lane & 3 (threadID_in_group); a b16 pair in a 32-bit
 * register holds the lower-indexed element in bits 0..15. */
#ifndef MT_KERNELS_CUDA_PTX_CUH
#define MT_KERNELS_CUDA_PTX_CUH

#include <stdint.h>

#ifndef CUDAEMU

/* D = A B + C on one warp: A 16x16 bf16 row-major, B 16x8 bf16 column-major (k x n),
 * C and D 16x8 fp32. Fragments per lane (element e of a register: low half e = 0):
 *   a[i]: A[g + 8 (i & 1)][2t + e + 8 (i >> 1)]    i = 0..3
 *   b[i]: B[2t + e + 8 i][g]                        i = 0..1  (k, n)
 *   c[i], d[i]: C/D[g + 8 (i >> 1)][2t + (i & 1)]   i = 0..3
 * Products are exact; the fp32 accumulation order is the hardware's. */
__device__ __forceinline__ void mt_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n" : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* Four 8x8 b16 matrices from shared memory: lanes 8i..8i+7 give the addresses of rows
 * 0..7 of matrix i (16 bytes each, 16-byte aligned); r[i] = row g, columns 2t and 2t + 1
 * of matrix i. With matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
 * (rows 8-15, k 8-15) of a row-major tile this is exactly mma's `a` fragment. */
__device__ __forceinline__ void mt_ldmatrix_x4(uint32_t r[4], const void *smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(smem_row)) : "memory");
}

/* Asynchronous 16-byte global -> shared copy (both 16-byte aligned), bypassing L1. */
__device__ __forceinline__ void mt_cp_async_16(void *smem_dst, const void *gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(smem_dst)), "l"(gmem_src) : "memory");
}

/* Close this thread's current group of cp.async copies. */
__device__ __forceinline__ void mt_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Wait until at most N of this thread's committed groups are pending. Other threads'
 * copies need a __syncthreads after it to be visible. */
template <int N>
__device__ __forceinline__ void mt_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

#else /* CUDAEMU: the same operations from the tables above */

namespace mt_ptx_emu {
inline float bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
inline float bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }
struct mma_in {
    uint32_t a[4], b[2];
    float c[4];
};
inline const char *mma_combine(cudaemu::lane_slot *lanes, unsigned) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const mma_in *in = (const mma_in *)lanes[lane].in;
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) {
            A[g + 8 * (i & 1)][2 * t + 8 * (i >> 1)] = bf16_lo(in->a[i]);
            A[g + 8 * (i & 1)][2 * t + 1 + 8 * (i >> 1)] = bf16_hi(in->a[i]);
            C[g + 8 * (i >> 1)][2 * t + (i & 1)] = in->c[i];
        }
        for (int i = 0; i < 2; i++) {
            B[2 * t + 8 * i][g] = bf16_lo(in->b[i]);
            B[2 * t + 1 + 8 * i][g] = bf16_hi(in->b[i]);
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        float d[4];
        for (int i = 0; i < 4; i++) {
            const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
            float acc = C[m][n];
            for (int k = 0; k < 16; k++) acc += A[m][k] * B[k][n]; /* exact products, fp32 sums in k order */
            d[i] = acc;
        }
        memcpy(lanes[lane].out, d, sizeof d);
    }
    return nullptr;
}
inline const char *ldmatrix_combine(cudaemu::lane_slot *lanes, unsigned) {
    for (int lane = 0; lane < 32; lane++) {
        uint32_t r[4];
        for (int i = 0; i < 4; i++) {
            const unsigned char *row;
            memcpy(&row, lanes[8 * i + (lane >> 2)].in, sizeof row);
            memcpy(&r[i], row + 4 * (lane & 3), 4);
        }
        memcpy(lanes[lane].out, r, sizeof r);
    }
    return nullptr;
}
} /* namespace mt_ptx_emu */

#define mt_mma_bf16_16816(d, a, b, c) mt_ptx_emu_mma(__FILE__, __LINE__, d, a, b, c)
inline void mt_ptx_emu_mma(const char *file, int line, float d[4], const uint32_t a[4], const uint32_t b[2],
                           const float c[4]) {
    mt_ptx_emu::mma_in in;
    memcpy(in.a, a, sizeof in.a);
    memcpy(in.b, b, sizeof in.b);
    memcpy(in.c, c, sizeof in.c);
    cudaemu::warp_collective(0xffffffffu, &in, sizeof in, d, 4 * sizeof(float), mt_ptx_emu::mma_combine,
                             "mma.sync.m16n8k16", file, line);
}
#define mt_ldmatrix_x4(r, p) mt_ptx_emu_ldmatrix(__FILE__, __LINE__, r, p)
inline void mt_ptx_emu_ldmatrix(const char *file, int line, uint32_t r[4], const void *smem_row) {
    cudaemu::warp_collective(0xffffffffu, &smem_row, sizeof smem_row, r, 4 * sizeof(uint32_t),
                             mt_ptx_emu::ldmatrix_combine, "ldmatrix.x4", file, line);
}
inline void mt_cp_async_16(void *smem_dst, const void *gmem_src) { cudaemu::cp_async(smem_dst, gmem_src, 16); }
inline void mt_cp_async_commit() { cudaemu::cp_async_commit(); }
template <int N>
inline void mt_cp_async_wait() { cudaemu::cp_async_wait(N); }

#endif /* CUDAEMU */
#endif
