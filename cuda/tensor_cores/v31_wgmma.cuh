// v31: Hopper's warpgroup MMA. One warpgroup (4 warps, 128 threads) computes a 64×128 tile of C
// with wgmma.mma_async m64n128k16: one instruction for all four warps, both operands read by the
// tensor cores straight from shared memory (no ldmatrix, no fragments in registers but the
// accumulators), named by matrix descriptors (start address, leading and stride byte offsets,
// swizzle). The instruction is asynchronous: issued, committed as a group, and waited for.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v31.cu -o /tmp/v31.cubin
// The tiles are staged as v23 stages them, but in the layout the descriptors describe: the 128B
// swizzle, rows of 64 elements (128 bytes), 8 rows to a 1024-byte atom. A K-major operand (rows
// along m or n, k contiguous) advances 32 bytes per k-step of 16; an MN-major one (A of the tn
// layout, B of nn: rows along k) 16 rows, 2048 bytes, and its 64-wide blocks along m or n lie
// 8192 bytes apart (the descriptor's LBO). Shared memory is written by ordinary stores here, which
// the tensor cores' "async proxy" sees only after fence.proxy.async.
#pragma once

#include "../kernels/hopper_instructions.cuh"
#include "v22_v23_ldmatrix.cuh"  // v22_offset: v23's swizzle is the 128B swizzle

namespace {

constexpr int kV31BM = 64, kV31BN = 128, kV31BK = 64;

// Stage the BX × 64 tile of P at (x0, k0) as 64-element rows, 128B-swizzled: rows along x
// (contig_k: one 128-byte row per x) or along k (one row per k, in blocks of 64 x, 8 KiB apart).
template <typename T, int BX>
__device__ __forceinline__ void v31_stage(unsigned char* S, const T* P, bool contig_k, int64_t x0, int64_t k0,
                                          int64_t X, int64_t K, bool vec) {
  for (int u = threadIdx.x; u < BX * kV31BK / 8; u += 128) {
    // chunk u: row r of 64 elements and its first column c
    const int r = contig_k ? u / 8 : u / (BX / 8) % kV31BK, c = contig_k ? (u % 8) * 8 : (u % (BX / 8)) * 8;
    const int64_t gr = contig_k ? x0 + r : k0 + r, gc = contig_k ? k0 + c : x0 + c;
    const int64_t rows = contig_k ? X : K, cols = contig_k ? K : X;
    const T* src = P + gr * cols + gc;
    uint4 chunk;
    if (vec && gr < rows && gc + 8 <= cols) {
      chunk = *reinterpret_cast<const uint4*>(src);
    } else {
      T v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = gr < rows && gc + j < cols ? src[j] : zero<T>();
      memcpy(&chunk, v, 16);
    }
    const int block = contig_k ? 0 : c / 64;  // x-rows: one block; k-rows: a block per 64 columns of x
    *reinterpret_cast<uint4*>(S + block * (kV31BK * 128) + v22_offset<true>(r, c % 64)) = chunk;
  }
}

// D's fragment (PTX ISA, "Register Fragments" of wgmma m64nNk16, matrix D): register i of thread
// `thread` of the warpgroup (0 to 127) holds row 16·warp + g (+8 for i % 4 ≥ 2) and column
// 8·(i/4) + 2t + i % 2 of the warpgroup's 64×N tile of D. f(row, column, value) for each of the
// thread's R = N/2 registers, rows and columns counted from the tile's origin (r0, c0).
template <int R, typename F>
__device__ __forceinline__ void for_each_d(const float (&acc)[R], unsigned thread, int64_t r0, int64_t c0, F&& f) {
  const int warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < R; ++i) f(r0 + 16 * warp + g + 8 * ((i / 2) % 2), c0 + 8 * (i / 4) + 2 * t + i % 2, acc[i]);
}
// The epilogue from the registers: C(m, n) = epilogue(D) for the tile of D at (m0, n0), inside C.
template <typename T, int R>
__device__ __forceinline__ void store_d(const float (&acc)[R], unsigned thread, T* C, const T* bias, int64_t M,
                                        int64_t N, int64_t m0, int64_t n0, int kind) {
  for_each_d(acc, thread, m0, n0, [&](int64_t m, int64_t n, float v) {
    if (m < M && n < N) C[m * N + n] = from_acc<T>(epilogue(v, bias, n, kind));
  });
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v31(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  alignas(1024) __shared__ unsigned char smem[(kV31BM + kV31BN) * kV31BK * 2];
  unsigned char *As = smem, *Bs = smem + kV31BM * kV31BK * 2;
  shared_window(smem);
  const int64_t m0 = int64_t(blockIdx.y) * kV31BM, n0 = int64_t(blockIdx.x) * kV31BN;
  const bool a_vec = aligned16(A) && (TA ? M : K) % 8 == 0, b_vec = aligned16(B) && (TB ? K : N) % 8 == 0;
  float acc[kV31BN / 2] = {};
  // region v31
  for (int64_t k0 = 0; k0 < K; k0 += kV31BK) {
    v31_stage<T, kV31BM>(As, A, !TA, m0, k0, M, K, a_vec);
    v31_stage<T, kV31BN>(Bs, B, TB, n0, k0, N, K, b_vec);
    fence_proxy_async();  // the stores above, visible to the tensor cores' reads
    __syncthreads();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kV31BK; kk += 16) {
      // K-major: 32 bytes further along the rows; MN-major: 16 rows (2048 bytes) further down
      const uint64_t da = TA ? smem_desc(As + kk * 128, 8192, 1024, kSwizzle128B) : smem_desc(As + kk * 2, 16, 1024, kSwizzle128B);
      const uint64_t db = TB ? smem_desc(Bs + kk * 2, 16, 1024, kSwizzle128B) : smem_desc(Bs + kk * 128, 8192, 1024, kSwizzle128B);
      wgmma_m64k16<kV31BN, T, TA, !TB>(acc, da, db, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();  // the accumulators are ours again, and the tiles may be overwritten
    __syncthreads();
  }
  // endregion
  store_d(acc, threadIdx.x, C, bias, M, N, m0, n0, kind);
}

}  // namespace
