// The tensor cores' roofs on the card at hand: how fast each instruction multiplies when nothing else
// is asked of it. Two micro-benchmarks, one per instruction the tensor-core versions use, each a
// loop of that instruction on operands already in place, with no memory traffic inside the loop:
//   roof_mma_sync   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (part 1's v21-v24)
//   roof_wgmma      wgmma.mma_async m64n256k16 bf16, operands in shared memory (part 2's v31-v33, v35)
// cuda/bench_gpu.py roof times them beside those versions and cuBLAS; each version is judged against
// its own instruction's roof, measured on the same card in the same run.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_roof.cu -o /tmp/roof.cubin
//
// Every operand element is bfloat16 1.0 and the accumulators start at 0, so after n iterations a
// thread's accumulators add up to its share of the multiply-adds, half its FLOPs: the result
// says the loop ran as many instructions as the FLOP count claims (tests/test_roof.py, in the
// emulation; cuda/bench_gpu.py on the GPU). With n a power of two, up to 2^20, every partial sum
// is exact in float32.
//
// Predictions for an H100 SXM (made before any timing; the chapter quotes them):
// - wgmma: NVIDIA's datasheet gives 989.4 TFLOP/s dense bfloat16, which is 132 SMs × 4,096 FLOP
//   a clock at 1.83 GHz (nvidia-smi's maximum SM clock on the H100 of docs/results/cuda_gpu_h100.json
//   is 1,980 MHz, where the same count would give 1,070). Predicted: 900-990 TFLOP/s, the clock the
//   card holds under this load deciding where. A public microbenchmark study of Hopper (arXiv
//   2402.13499, as quoted in NVIDIA/cutlass issue 2373; not read here, unverified) reports about
//   970 TFLOP/s for wgmma on an H800, whose SMs and clocks are the H100 SXM's.
// - mma.sync: predicted about half the wgmma roof, 450-550 TFLOP/s (unverified: no published
//   measurement of this instruction alone on an H100 was found, and public reports of mma.sync
//   kernels on Hopper range from a third to two thirds of wgmma's peak). The reasoning: Hopper doubled
//   each SM's tensor-core work per clock over the A100 (1,024 dense bfloat16 multiply-adds a clock
//   an SM there, 2,048 here, each from its datasheet's peak, SM count and clock), but mma.sync is
//   the A100's instruction: one warp's 16×8×16 product, its operands read from and its results
//   written to that warp's registers, one instruction for every 2,048 multiply-adds. wgmma hands a
//   64×N×16 product of operands in shared memory to the tensor cores of all four sub-partitions
//   at once (128 times the work of one mma.sync at N = 256) and returns before it completes.
//   The public figures around it (unverified here): FlashAttention-2, built on mma.sync, reaches
//   about 35% of an H100's peak (the FlashAttention-3 paper); one public H100 study measured
//   mma.sync in TF32 at about a third of wgmma's rate (95 against 301 TFLOP/s).
// - H200: the same GH100 chip, 132 SMs and maximum clock (docs/results/triton_gpu_h200_4096.json),
//   so the same two roofs.
#pragma once

#include "../kernels/hopper_instructions.cuh"

namespace dense_kernels {

enum RoofKind : int { kRoofMmaSync = 0, kRoofWgmma = 1, kRoofKinds };
constexpr int kRoofThreads = 256;  // both: 8 warps; two warpgroups for wgmma
// mma.sync: independent accumulator chains a warp. An m16n8k16 is 2,048 multiply-adds; a
// sub-partition's tensor core does 512 a clock (2,048 an SM), so it could finish one every 4
// clocks, while one mma.sync's result comes back tens of clocks after its issue (its latency, not
// measured here). A chain waits for each of its results; independent chains do not wait for each
// other. With 8 chains in each of a block's 8 warps (2 warps a sub-partition) and several blocks
// an SM, 16 or more mma's can be in flight on each sub-partition: a latency of up to 64 clocks is
// covered at one mma every 4.
constexpr int kRoofMmaChains = 8;
// wgmma: each of the two warpgroups keeps its own 64×256 accumulator (128 registers a thread) and
// one group of 4 wgmma's (k = 64) in flight while it issues the next, as v33's consumers do.
constexpr int kRoofWgmmaGroups = 2, kRoofWgmmaN = 256, kRoofWgmmaK = 64;
constexpr int kRoofWgmmaSmem = (64 + kRoofWgmmaN) * kRoofWgmmaK * 2;  // A 64×64 and B 256×64, bfloat16

// The FLOPs of one block's iteration (2 a multiply-add); -1 for no such kind.
constexpr int64_t roof_flops(int kind) {
  return kind == kRoofMmaSync ? int64_t(kRoofThreads / 32) * kRoofMmaChains * 2 * 16 * 8 * 16
         : kind == kRoofWgmma ? int64_t(kRoofWgmmaGroups) * 2 * 64 * kRoofWgmmaN * kRoofWgmmaK
                              : -1;
}

// The kernels' entries, registered by the unit that holds them (cuda/units/tc_roof.cu), as
// entries.cuh's registry does for the GEMMs: a build without that unit says "not built" at launch.
inline const void*& roof_entry(int kind) {
  static const void* entries[kRoofKinds] = {};
  return entries[kind];
}
struct RoofRegistration {
  RoofRegistration(int kind, const void* fn) { roof_entry(kind) = fn; }
};

}  // namespace dense_kernels

namespace {

constexpr uint32_t kRoofOnes = 0x3F803F80u;  // two bfloat16 1.0s in one register

// out[thread]: the sum of the thread's 8 × 4 accumulators after `iterations` rounds of
// kRoofMmaChains independent mma's, = 64 · kRoofMmaChains · iterations.
__device__ __forceinline__ void roof_mma_sync(float* out, int iterations) {
  const uint32_t a[4] = {kRoofOnes, kRoofOnes, kRoofOnes, kRoofOnes}, b[2] = {kRoofOnes, kRoofOnes};
  float acc[dense_kernels::kRoofMmaChains][4] = {};
  // region roof_mma_sync
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int c = 0; c < dense_kernels::kRoofMmaChains; ++c) mma_m16n8k16<__nv_bfloat16>(acc[c], a, b, acc[c]);
  }
  // endregion
  float sum = 0;
#pragma unroll
  for (int c = 0; c < dense_kernels::kRoofMmaChains; ++c) sum += (acc[c][0] + acc[c][1]) + (acc[c][2] + acc[c][3]);
  out[int64_t(blockIdx.x) * dense_kernels::kRoofThreads + threadIdx.x] = sum;
}

// out[thread]: the sum of the thread's 128 accumulators, = 64 · kRoofWgmmaK · iterations.
// A and B are K-major 128B-swizzled tiles as v31 stages them (rows of 64 elements, 8 rows to a
// 1024-byte atom); both warpgroups read the same tiles.
__device__ __forceinline__ void roof_wgmma(float* out, int iterations) {
  alignas(1024) __shared__ unsigned char smem[dense_kernels::kRoofWgmmaSmem];
  shared_window(smem);
  for (int i = threadIdx.x; i < dense_kernels::kRoofWgmmaSmem / 4; i += dense_kernels::kRoofThreads)
    reinterpret_cast<uint32_t*>(smem)[i] = kRoofOnes;
  fence_proxy_async();  // the stores above, visible to the tensor cores' reads
  __syncthreads();
  const unsigned char *As = smem, *Bs = smem + 64 * dense_kernels::kRoofWgmmaK * 2;
  float acc[dense_kernels::kRoofWgmmaN / 2] = {};
  // region roof_wgmma
  for (int it = 0; it < iterations; ++it) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < dense_kernels::kRoofWgmmaK; kk += 16)
      wgmma_m64k16<dense_kernels::kRoofWgmmaN, __nv_bfloat16, 0, 0>(
          acc, smem_desc(As + kk * 2, 16, 1024, kSwizzle128B), smem_desc(Bs + kk * 2, 16, 1024, kSwizzle128B), 1);
    wgmma_commit();
    wgmma_wait<1>();  // the previous group has completed; this one stays in flight
  }
  wgmma_wait<0>();
  // endregion
  float sum = 0;
#pragma unroll
  for (int i = 0; i < dense_kernels::kRoofWgmmaN / 2; ++i) sum += acc[i];
  out[int64_t(blockIdx.x) * dense_kernels::kRoofThreads + threadIdx.x] = sum;
}

}  // namespace

// The launch, for the host code that defines DENSE_LAUNCH (cuda/dense_kernels.cu on the GPU,
// cuda/emulate/emulate.cpp on the CPU; see cuda/kernels/launch.cuh): `blocks` blocks of
// kRoofThreads, each writing kRoofThreads floats of `out`. wgmma needs sm_90a's code.
#if defined(DENSE_LAUNCH)
namespace dense_kernels {
namespace {
int launch_roof(int kind, int blocks, int iterations, float* out, Stream stream) {
  (void)stream;
  if (kind < 0 || kind >= kRoofKinds || blocks < 1 || iterations < 1 || out == nullptr) return DENSE_INVALID;
  if (kind == kRoofWgmma && DENSE_DEVICE_ARCH() != 90) return DENSE_INVALID;
  using RoofFn = void (*)(float*, int);
  const RoofFn fn = reinterpret_cast<RoofFn>(const_cast<void*>(roof_entry(kind)));
  if (fn == nullptr) return DENSE_NOT_BUILT;
  Geometry geo;
  geo.grid.x = unsigned(blocks);
  geo.block.x = kRoofThreads;
  DENSE_LAUNCH(fn, geo, out, iterations);
  return DENSE_LAUNCH_STATUS();
}
}  // namespace
}  // namespace dense_kernels
#endif
