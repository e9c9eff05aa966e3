// v25 and v26: float32 on tensor cores. mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
// multiplies tf32 operands: float32's exponent with 10 bits of mantissa (float32 has 23), rounded
// from float32 by cvt.rna.tf32.f32 (to nearest, ties away from zero), accumulating in float32.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v25.cu -o /tmp/v25.cubin
// v25 rounds each operand once: an error of up to 2^-11 relative on every product, a thousand
// times float32's. v26 (split-TF32, "3xTF32") keeps float32-class accuracy: each operand x is a
// big part b = tf32(x) plus a small one s = tf32(x − b), which holds most of the bits b lost, and
//   x·y ≈ b_x·b_y + b_x·s_y + s_x·b_y          (s_x·s_y, about 2^-22 of x·y, is dropped)
// in three mma's, the small products first. The block is v24's (8 warps, 128×128, cp.async in
// flight while the warps compute), with k-steps of 16 in 2 stages (float tiles are twice as large),
// rows padded by 16 or 32 bytes instead of swizzled: ldmatrix moves 16-bit elements, so the
// 32-bit fragments come by plain shared-memory loads, and padding keeps their 32 lanes on 32 banks.
#pragma once

#include "v24_pipeline.cuh"  // kV24BM, kV24BN, kV24Threads

namespace {

constexpr int kV25BK = 16, kV25Stages = 2;

// One operand's float tile of a stage, X (128) by K (16), stored as it lies in global memory,
// each row padded (k-rows by 4 floats, x-rows by 8) so that a fragment's loads hit 32 banks.
template <bool ContigK>
struct V25Tile {
  static constexpr int kRows = ContigK ? kV24BM : kV25BK, kCols = ContigK ? kV25BK : kV24BM;
  static constexpr int kLd = kCols + (ContigK ? 4 : 8), kFloats = kRows * kLd;
  __device__ __forceinline__ static void load(float* S, const float* P, int64_t x0, int64_t k0, int64_t X, int64_t K,
                                              bool vec) {
    for (int u = threadIdx.x; u < kRows * kCols / 4; u += kV24Threads) {
      const int r = u / (kCols / 4), c = (u % (kCols / 4)) * 4;
      const int64_t gr = (ContigK ? x0 : k0) + r, gc = (ContigK ? k0 : x0) + c;
      const int64_t rows = ContigK ? X : K, cols = ContigK ? K : X;
      float* dst = S + r * kLd + c;
      if (vec && gr < rows && gc + 4 <= cols) {
        cp_async16(dst, P + gr * cols + gc);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = gr < rows && gc + j < cols ? P[gr * cols + gc + j] : 0.0f;
      }
    }
  }
  // Element (x, k) of the tile.
  __device__ __forceinline__ static float at(const float* S, int x, int k) { return ContigK ? S[x * kLd + k] : S[k * kLd + x]; }
};

// A fragment's value as tf32, whole (v25) or split into big and small parts (v26).
struct Tf32Parts {
  uint32_t big, small;
};
// ±inf and NaN: small is 0 (x − big would be NaN), and `finite` (below) is 0 in the cross products,
// so that inf · w is ±inf (from big · big) and not inf · 0 = NaN from a cross product.
__device__ __forceinline__ bool tf32_finite(uint32_t v) { return (v & 0x7f800000u) != 0x7f800000u; }
__device__ __forceinline__ Tf32Parts split_tf32(float x) {
  const uint32_t big = cvt_rna_tf32(x);
  float b;
  memcpy(&b, &big, 4);
  return {big, tf32_finite(big) ? cvt_rna_tf32(x - b) : 0u};
}
__device__ __forceinline__ uint32_t finite(uint32_t v) { return tf32_finite(v) ? v : 0u; }

template <bool TA, bool TB, bool Split>
__device__ void gemm_v25_v26(const float* A, const float* B, float* C, const float* bias, int64_t M, int64_t N, int64_t K,
                         int kind) {
  using TileA = V25Tile<!TA>;
  using TileB = V25Tile<TB>;
  alignas(16) __shared__ float As[kV25Stages][TileA::kFloats], Bs[kV25Stages][TileB::kFloats];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
  const int64_t m0 = int64_t(blockIdx.y) * kV24BM, n0 = int64_t(blockIdx.x) * kV24BN;
  const bool a_vec = aligned16(A) && (TA ? M : K) % 4 == 0, b_vec = aligned16(B) && (TB ? K : N) % 4 == 0;
  const int64_t steps = (K + kV25BK - 1) / kV25BK;
  float acc[4][4][4] = {};
  auto load = [&](int stage, int64_t step) {
    if (step < steps) {
      TileA::load(As[stage], A, m0, step * kV25BK, M, K, a_vec);
      TileB::load(Bs[stage], B, n0, step * kV25BK, N, K, b_vec);
    }
    cp_async_commit();
  };
  load(0, 0);
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<0>();
    __syncthreads();
    load((step + 1) % kV25Stages, step + 1);  // in flight during this step's mma's
    const float *as = As[step % kV25Stages], *bs = Bs[step % kV25Stages];
    // region v26
#pragma unroll
    for (int kk = 0; kk < kV25BK; kk += 8) {
      Tf32Parts a[4][4], b[4][2];  // fragments: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = TileA::at(as, wm + 16 * i + g + 8 * (e % 2), kk + t + 4 * (e / 2));
          a[i][e] = Split ? split_tf32(x) : Tf32Parts{cvt_rna_tf32(x), 0};
        }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = TileB::at(bs, wn + 8 * j + g, kk + t + 4 * e);
          b[j][e] = Split ? split_tf32(x) : Tf32Parts{cvt_rna_tf32(x), 0};
        }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t ab[4] = {a[i][0].big, a[i][1].big, a[i][2].big, a[i][3].big};
          const uint32_t bb[2] = {b[j][0].big, b[j][1].big};
          if (Split) {  // the small products first: they are the least likely to be absorbed
            const uint32_t as_[4] = {a[i][0].small, a[i][1].small, a[i][2].small, a[i][3].small};
            const uint32_t bs_[2] = {b[j][0].small, b[j][1].small};
            const uint32_t af[4] = {finite(ab[0]), finite(ab[1]), finite(ab[2]), finite(ab[3])};
            const uint32_t bf[2] = {finite(bb[0]), finite(bb[1])};
            mma_m16n8k8_tf32(acc[i][j], as_, bf, acc[i][j]);
            mma_m16n8k8_tf32(acc[i][j], af, bs_, acc[i][j]);
          }
          mma_m16n8k8_tf32(acc[i][j], ab, bb, acc[i][j]);
        }
    }
    // endregion
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + wm + 16 * i + g + 8 * (e / 2), n = n0 + wn + 8 * j + 2 * t + e % 2;
        if (m < M && n < N) C[m * N + n] = epilogue(acc[i][j][e], bias, n, kind);
      }
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v25(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  gemm_v25_v26<TA, TB, false>(A, B, C, bias, M, N, K, kind);
}
template <typename T, bool TA, bool TB>
__device__ void gemm_v26(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  gemm_v25_v26<TA, TB, true>(A, B, C, bias, M, N, K, kind);
}

}  // namespace
