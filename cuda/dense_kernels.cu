// Chapter 4: the host side of the Dense layer's kernels in plain CUDA (CUDA headers only, no torch):
// the kernels are in cuda/kernels/ (one file per GEMM version), each compiled in a unit of its own
// (cuda/units/), and found through the registry those units fill (cuda/kernels/entries.cuh); the
// launch sequence is cuda/kernels/launch.cuh.
//
// Compile check (no GPU needed), registers and spills per kernel of one unit:
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
// On the CPU (no nvcc either):  python grad_check.py cuda --emulate
// PTX for chapter 5:  bash ptx/regen.sh
//
// y = sigmoid(x Wᵀ + b) is one GEMM with a fused epilogue; the backward is one elementwise
// kernel (dz, and the bias gradient) and two more GEMMs of the same family. The versions and
// their one-line ideas: dense_kernels.h (kVersionIdeas); the chapter: cuda/README.md.
#include <cuda_runtime.h>

#include "dense_kernels.h"

// The CUDA runtime's launch for the shared host code.
#define DENSE_LAUNCH(fn, geo, ...)                                                                  \
  fn<<<dim3((geo).grid.x, (geo).grid.y, (geo).grid.z), dim3((geo).block.x, (geo).block.y, (geo).block.z), 0, \
       stream>>>(__VA_ARGS__)
#define DENSE_LAUNCH_STATUS() static_cast<int>(cudaGetLastError())
#define DENSE_INVALID static_cast<int>(cudaErrorInvalidValue)
// An entry this build left out (a unit not compiled in): the runtime's "no kernel image" error.
#define DENSE_NOT_BUILT static_cast<int>(cudaErrorNoKernelImageForDevice)

#include "kernels/launch.cuh"

// The autotuning candidates for cuda/bench_gpu.py candidates, which calls these through ctypes in
// the loaded extension (the cuda stage's own library: the same runtime, context and streams).
// dense_tune_launch runs candidate `candidate` (float32) on `stream` and returns a cudaError_t.
#define DENSE_EXPORT extern "C" __attribute__((visibility("default")))
DENSE_EXPORT int dense_tune_count() { return dense_kernels::kTuneCount; }
DENSE_EXPORT int dense_tune_launch(int candidate, const char* layout, const float* A, const float* B, float* C,
                                   const float* bias, int64_t M, int64_t N, int64_t K, int epilogue, void* stream) {
  if (candidate < 0 || candidate >= dense_kernels::kTuneCount) return DENSE_INVALID;
  return dense_kernels::launch_gemm(dense_kernels::tune_id(candidate), layout, dense_kernels::kF32, A, B, C, bias, M,
                                    N, K, epilogue,
                                    /*sm_count=*/1, /*workspace=*/nullptr, static_cast<dense_kernels::Stream>(stream));
}

// Any entry by (version, layout, type), for cuda/bench_gpu.py's exact comparison with the CPU
// emulation (the emulation's emu_gemm / emu_gemm_workspace take the same arguments): a DType
// code, a workspace of the accumulator's type as large as dense_gemm_workspace says.
DENSE_EXPORT int dense_gemm_launch(int version, const char* layout, int dtype, const void* A, const void* B, void* C,
                                   const void* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count,
                                   void* workspace, void* stream) {
  return dense_kernels::launch_gemm(version, layout, dtype, A, B, C, bias, M, N, K, epilogue, sm_count, workspace,
                                    static_cast<dense_kernels::Stream>(stream));
}
DENSE_EXPORT int64_t dense_gemm_workspace(int version, int dtype, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (!dense_kernels::valid_dtype(dtype)) return -1;
  const auto t = static_cast<dense_kernels::DType>(dtype);
  if (version == 0) version = dense_kernels::choose_version(M, N, K, t, sm_count);
  return dense_kernels::gemm_workspace_elements(version, dense_kernels::acc_bytes(t), M, N, K, sm_count);
}

