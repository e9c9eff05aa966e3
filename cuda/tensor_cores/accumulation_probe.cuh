//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a cuda/tensor_cores/accumulation_probe.cu -o /tmp/probe.cubin
// The tensor cores' accumulation, probed: one test vector (C and K operand pairs a_k, b_k) a
// block, run through one instruction, through the same wrappers the kernels use
// (cuda/kernels/instructions.cuh, hopper_instructions.cuh): on a GPU (accumulation_probe.cu) the
// hardware's sum, in the emulation (emulate.cpp's emu_tc_accumulation_run) the selected model's
// (cuda/emulate/tc_accumulate.h). cuda/tensor_cores/accumulation_vectors.py writes the vectors and
// both models' expected bits, and compares.
//
// Every row of A holds the vector's a and every column of B its b; every accumulator starts at C:
// so every output element is the same block C + Σ a_k·b_k, and each is written out (a lane or
// thread whose element differs from the others shows a fragment mistake, not arithmetic).
// Operand words: a[K·v + k], b[K·v + k] hold element k of vector v (a 16-bit pattern in the low
// half for bfloat16 and float16, the float32 pattern for tf32), K = 16 (8 for tf32).
#pragma once

#include "../kernels/hopper_instructions.cuh"

namespace dense_kernels {

enum ProbeKind : int {
  kProbeMmaBf16 = 0,    // mma.sync.m16n8k16 bf16
  kProbeMmaF16 = 1,     // mma.sync.m16n8k16 f16
  kProbeMmaTf32 = 2,    // mma.sync.m16n8k8 tf32
  kProbeWgmmaBf16 = 3,  // wgmma m64n32k16 bf16
  kProbeWgmmaF16 = 4,   // wgmma m64n32k16 f16
  kProbeWgmmaTf32 = 5,  // wgmma m64n128k8 tf32
  kProbeKinds
};
__host__ __device__ constexpr bool probe_is_wgmma(int kind) { return kind >= kProbeWgmmaBf16; }
__host__ __device__ constexpr bool probe_is_tf32(int kind) { return kind == kProbeMmaTf32 || kind == kProbeWgmmaTf32; }
__host__ __device__ constexpr int probe_k(int kind) { return probe_is_tf32(kind) ? 8 : 16; }
__host__ __device__ constexpr int probe_threads(int kind) { return probe_is_wgmma(kind) ? 128 : 32; }
__host__ __device__ constexpr int probe_n(int kind) { return !probe_is_wgmma(kind) ? 8 : kind == kProbeWgmmaTf32 ? 128 : 32; }
// The floats a vector's block writes: every thread's accumulators (mma: 4 a lane; wgmma: N/2).
__host__ __device__ constexpr int probe_outputs(int kind) { return probe_threads(kind) * (probe_is_wgmma(kind) ? probe_n(kind) / 2 : 4); }
// wgmma's tiles: A 64 rows, B N rows, 128 bytes a row (K-major, 128-byte swizzle, as v31 and v34 stage them).
constexpr int kProbeSmem = (64 + 128) * 128;

}  // namespace dense_kernels

namespace {

// Two 16-bit operands in one register, the lower index in the lower half.
__device__ __forceinline__ uint32_t probe_pair(const uint32_t* x, int k) { return (x[k] & 0xffffu) | (x[k + 1] << 16); }

// mma.sync m16n8k16: lane (g, t) = (lane / 4, lane % 4) holds A's columns 2t, 2t+1 and 2t+8, 2t+9
// (rows g and g+8) and B's rows 2t, 2t+1 and 2t+8, 2t+9: the PTX ISA's fragment tables.
template <typename T>
__device__ __forceinline__ void probe_mma16(const uint32_t* a, const uint32_t* b, const float* c, float* out) {
  const int v = int(blockIdx.x), t = int(threadIdx.x % 4);
  const uint32_t *av = a + 16 * v, *bv = b + 16 * v;
  const uint32_t ra[4] = {probe_pair(av, 2 * t), probe_pair(av, 2 * t), probe_pair(av, 2 * t + 8), probe_pair(av, 2 * t + 8)};
  const uint32_t rb[2] = {probe_pair(bv, 2 * t), probe_pair(bv, 2 * t + 8)};
  const float rc[4] = {c[v], c[v], c[v], c[v]};
  float d[4];
  mma_m16n8k16<T>(d, ra, rb, rc);
  for (int i = 0; i < 4; ++i) out[(int64_t(v) * 32 + threadIdx.x) * 4 + i] = d[i];
}

// mma.sync m16n8k8 tf32: lane (g, t) holds A's columns t and t+4, B's rows t and t+4.
__device__ __forceinline__ void probe_mma_tf32(const uint32_t* a, const uint32_t* b, const float* c, float* out) {
  const int v = int(blockIdx.x), t = int(threadIdx.x % 4);
  const uint32_t *av = a + 8 * v, *bv = b + 8 * v;
  const uint32_t ra[4] = {av[t], av[t], av[t + 4], av[t + 4]}, rb[2] = {bv[t], bv[t + 4]};
  const float rc[4] = {c[v], c[v], c[v], c[v]};
  float d[4];
  mma_m16n8k8_tf32(d, ra, rb, rc);
  for (int i = 0; i < 4; ++i) out[(int64_t(v) * 32 + threadIdx.x) * 4 + i] = d[i];
}

// Byte `byte` of row `row` of a K-major tile of 128-byte rows, 128-byte swizzle: 16-byte chunk c of
// row r lies at chunk c ^ (r % 8) (the PTX ISA's swizzle; rows of 8 make a 1024-byte atom).
__device__ __forceinline__ int probe_swizzled(int row, int byte) {
  return row * 128 + (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
}

// wgmma m64nNk16 (bfloat16, float16; N = 32) or m64n128k8 (tf32), one warpgroup: A and B staged in
// shared memory with every row the vector's a (b), the accumulators all C.
template <int Kind>
__device__ __forceinline__ void probe_wgmma(const uint32_t* a, const uint32_t* b, const float* c, float* out) {
  constexpr int K = dense_kernels::probe_k(Kind), N = dense_kernels::probe_n(Kind);
  constexpr int bytes = dense_kernels::probe_is_tf32(Kind) ? 4 : 2;
  alignas(1024) __shared__ unsigned char smem[dense_kernels::kProbeSmem];
  shared_window(smem);
  const int v = int(blockIdx.x), tid = int(threadIdx.x);
  unsigned char *As = smem, *Bs = smem + 64 * 128;
  for (int i = tid; i < dense_kernels::kProbeSmem / 4; i += 128) reinterpret_cast<uint32_t*>(smem)[i] = 0;
  __syncthreads();
  for (int i = tid; i < (64 + N) * K; i += 128) {
    const int row = i / K, k = i % K;
    const bool in_a = row < 64;
    const uint32_t word = (in_a ? a : b)[K * v + k];
    unsigned char* tile = in_a ? As : Bs;
    const int at = probe_swizzled(in_a ? row : row - 64, k * bytes);
    if constexpr (bytes == 4) *reinterpret_cast<uint32_t*>(tile + at) = word;
    else *reinterpret_cast<uint16_t*>(tile + at) = uint16_t(word);
  }
  fence_proxy_async();  // the stores above, visible to the tensor cores' reads
  __syncthreads();
  float acc[N / 2];
  for (int i = 0; i < N / 2; ++i) acc[i] = c[v];
  wgmma_fence();
  const uint64_t da = smem_desc(As, 16, 1024, kSwizzle128B), db = smem_desc(Bs, 16, 1024, kSwizzle128B);
  if constexpr (Kind == dense_kernels::kProbeWgmmaTf32) wgmma_m64n128k8_tf32(acc, da, db, 1);
  else if constexpr (Kind == dense_kernels::kProbeWgmmaBf16) wgmma_m64k16<N, __nv_bfloat16, 0, 0>(acc, da, db, 1);
  else wgmma_m64k16<N, __half, 0, 0>(acc, da, db, 1);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) out[(int64_t(v) * 128 + tid) * (N / 2) + i] = acc[i];
}

}  // namespace
