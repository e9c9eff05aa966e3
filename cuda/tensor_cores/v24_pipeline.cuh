// v24: a block of warps. 8 warps compute a 128×128 tile of C, each a 64×32 warp tile of 4 × 4
// mma's per k-step of 16; the tiles of A and B come in k-steps of 32 through a ring of 3 stages of
// shared memory, filled by cp.async while the warps compute on the stage before (chapter 4's v8,
// with copies in flight two steps ahead instead of one); the epilogue (bias, sigmoid, rounding to
// bfloat16) is applied to the accumulators in registers, as in chapter 4.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v24.cu -o /tmp/v24.cubin
// Per k-step of 16 a warp issues 6 ldmatrix.x4 and 16 mma's: 16·16·8·2·16 = 65,536 FLOPs for
// 3 KiB of shared-memory reads, where v23's 32×32 warp tile did 8 mma's for 2 KiB. Shared memory
// per block: 3 stages × (8 + 8) KiB = 48 KiB, the most a block may declare statically.
#pragma once

#include "v21_mma.cuh"

namespace {

constexpr int kV24BM = 128, kV24BN = 128, kV24BK = 32, kV24Stages = 3, kV24Threads = 256;

// Byte offset of 16-bit element (r, c) of a tile whose rows are RowBytes long, XOR-swizzled in
// chunks of 16 bytes so that 8 consecutive rows at the same column lie in 8 different groups of
// banks (v23's swizzle, for 64-, 128- and 256-byte rows).
template <int RowBytes>
__device__ __forceinline__ int v24_offset(int r, int c) {
  static_assert(RowBytes == 64 || RowBytes == 128 || RowBytes == 256, "rows of 4, 8 or 16 chunks");
  const int swz = RowBytes == 64 ? (r / 2) % 4 : r % 8;
  return r * RowBytes + ((c / 8) ^ swz) * 16 + (c % 8) * 2;
}

// One operand's tile of a stage: X (128) by K (32), stored as it lies in global memory.
template <typename T, bool ContigK>
struct V24Tile {
  static constexpr int kRows = ContigK ? kV24BM : kV24BK, kCols = ContigK ? kV24BK : kV24BM;
  static constexpr int kRowBytes = kCols * 2, kBytes = kRows * kRowBytes;
  // Issue this thread's copies of the tile at (x0, k0): cp.async for whole, aligned chunks inside
  // the matrix, a plain store of the zero-padded chunk elsewhere.
  __device__ __forceinline__ static void load(unsigned char* S, const T* P, int64_t x0, int64_t k0, int64_t X,
                                              int64_t K, bool vec) {
    for (int u = threadIdx.x; u < kRows * kCols / 8; u += kV24Threads) {
      const int r = u / (kCols / 8), c = (u % (kCols / 8)) * 8;
      const int64_t gr = (ContigK ? x0 : k0) + r, gc = (ContigK ? k0 : x0) + c;
      const int64_t rows = ContigK ? X : K, cols = ContigK ? K : X;
      unsigned char* dst = S + v24_offset<kRowBytes>(r, c);
      if (vec && gr < rows && gc + 8 <= cols) {
        cp_async16(dst, P + gr * cols + gc);
      } else {
        T v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = gr < rows && gc + j < cols ? P[gr * cols + gc + j] : zero<T>();
        memcpy(dst, v, 16);
      }
    }
  }
  // The four 8×8 matrices of one ldmatrix.x4 whose top-left is (x, k) in (x, k) terms: matrix q
  // covers x + 8·(q % 2 if XFirst else q / 2), k + 8·(the other). Lane l gives row l % 8 of matrix l / 8.
  template <bool XFirst>
  __device__ __forceinline__ static void fragments(uint32_t (&d)[4], const unsigned char* S, int x, int k) {
    const int lane = threadIdx.x % 32, q = lane / 8, r = lane % 8;
    const int xb = x + 8 * (XFirst ? q % 2 : q / 2), kb = k + 8 * (XFirst ? q / 2 : q % 2);
    if (ContigK) ldmatrix<4, false>(d, S + v24_offset<kRowBytes>(xb + r, kb));
    else ldmatrix<4, true>(d, S + v24_offset<kRowBytes>(kb + r, xb));
  }
};

template <typename T, bool TA, bool TB>
__device__ void gemm_v24(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using TileA = V24Tile<T, !TA>;
  using TileB = V24Tile<T, TB>;
  alignas(128) __shared__ unsigned char As[kV24Stages][TileA::kBytes], Bs[kV24Stages][TileB::kBytes];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // this warp's 64×32 of the 128×128 tile
  const int64_t m0 = int64_t(blockIdx.y) * kV24BM, n0 = int64_t(blockIdx.x) * kV24BN;
  const bool a_vec = aligned16(A) && (TA ? M : K) % 8 == 0, b_vec = aligned16(B) && (TB ? K : N) % 8 == 0;
  const int64_t steps = (K + kV24BK - 1) / kV24BK;
  float acc[4][4][4] = {};
  auto load = [&](int stage, int64_t step) {
    if (step < steps) {
      TileA::load(As[stage], A, m0, step * kV24BK, M, K, a_vec);
      TileB::load(Bs[stage], B, n0, step * kV24BK, N, K, b_vec);
    }
    cp_async_commit();  // a group for every step, empty past the end: the waits below count groups
  };
  // region v24
  for (int s = 0; s < kV24Stages - 1; ++s) load(s, s);
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kV24Stages - 2>();  // this thread's copies of `step` have landed...
    __syncthreads();                  // ...everyone's, and nobody reads the stage refilled next
    load((step + kV24Stages - 1) % kV24Stages, step + kV24Stages - 1);
    const unsigned char *as = As[step % kV24Stages], *bs = Bs[step % kV24Stages];
#pragma unroll
    for (int kk = 0; kk < kV24BK; kk += 16) {
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) TileA::template fragments<true>(a[i], as, wm + 16 * i, kk);
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t d[4];
        TileB::template fragments<false>(d, bs, wn + 8 * j, kk);
        b[j][0] = d[0], b[j][1] = d[1], b[j + 1][0] = d[2], b[j + 1][1] = d[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_m16n8k16<T>(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
  cp_async_wait<0>();
  // endregion
  // region v24-epilogue
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + wm + 16 * i + g + 8 * (e / 2), n = n0 + wn + 8 * j + 2 * t + e % 2;
        if (m < M && n < N) C[m * N + n] = from_acc<T>(epilogue(acc[i][j][e], bias, n, kind));
      }
  // endregion
}

}  // namespace
