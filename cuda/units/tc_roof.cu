// The cuda stage's translation unit for the tensor cores' roofs (cuda/tensor_cores/roof.cuh): the
// two micro-benchmarks' entries, registered for dense_kernels.cu's dense_roof_launch. Not GEMM
// versions: no layout, no element type but bfloat16, no epilogue.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_roof.cu -o /tmp/roof.cubin
#include "../tensor_cores/roof.cuh"

extern "C" __global__ void __launch_bounds__(dense_kernels::kRoofThreads) dense_roof_mma_bf16(float* out,
                                                                                              int iterations) {
  roof_mma_sync(out, iterations);
}
// One block an SM: 256 threads of 128 accumulators and more take over half the register file.
extern "C" __global__ void __launch_bounds__(dense_kernels::kRoofThreads, 1) dense_roof_wgmma_bf16(float* out,
                                                                                                 int iterations) {
  roof_wgmma(out, iterations);
}
static const dense_kernels::RoofRegistration dense_roof_mma_bf16_registered(
    dense_kernels::kRoofMmaSync, reinterpret_cast<const void*>(&dense_roof_mma_bf16));
static const dense_kernels::RoofRegistration dense_roof_wgmma_bf16_registered(
    dense_kernels::kRoofWgmma, reinterpret_cast<const void*>(&dense_roof_wgmma_bf16));
