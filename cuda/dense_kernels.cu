// Chapter 3: the host side of the Dense layer's kernels in plain CUDA (CUDA headers only, no torch):
// the kernels are in cuda/kernels/ (one file per GEMM version), each compiled in a unit of its own
// (cuda/units/), and found through the registry those units fill (cuda/kernels/entries.cuh); the
// launch sequence is cuda/kernels/launch.cuh.
//
// Compile check (no GPU needed), registers and spills per kernel of one unit:
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
// On the CPU (no nvcc either):  python grad_check.py cuda --emulate
// PTX for chapter 4:  bash ptx/regen.sh
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
#define DENSE_DEVICE_ARCH() dense_kernels::device_arch()
// With dynamic shared memory: above 48 KiB a kernel must be allowed it first.
#define DENSE_LAUNCH_SMEM(fn, geo, bytes, ...)                                                                     \
  (cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), \
   fn<<<dim3((geo).grid.x, (geo).grid.y, (geo).grid.z), dim3((geo).block.x, (geo).block.y, (geo).block.z), (bytes),  \
        stream>>>(__VA_ARGS__))
#define DENSE_TENSOR_MAP_2D(map, elem_bytes, base, dim0, dim1, stride_bytes, box0, box1, swizzle_bytes) \
  encode_tensor_map_2d((map), (elem_bytes), (base), (dim0), (dim1), (stride_bytes), (box0), (box1), (swizzle_bytes))
#define DENSE_INVALID static_cast<int>(cudaErrorInvalidValue)
// An entry this build left out (a unit not compiled in): the runtime's "no kernel image" error.
#define DENSE_NOT_BUILT static_cast<int>(cudaErrorNoKernelImageForDevice)

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "kernels/hopper_instructions.cuh"  // CUtensorMap

// cuTensorMapEncodeTiled, reached through the runtime's driver entry point (no -lcuda): a 2-D
// tensor of dim0 × dim1 elements (dim0 contiguous), rows stride_bytes apart, copied in boxes of
// box0 × box1 into shared memory swizzled by 128 or 64 bytes, zeros outside the tensor. 0, or a
// cudaError_t.
namespace {
int encode_tensor_map_2d(CUtensorMap* map, int elem_bytes, const void* base, uint64_t dim0, uint64_t dim1,
                         uint64_t stride_bytes, uint32_t box0, uint32_t box1, uint32_t swizzle_bytes) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return static_cast<int>(cudaErrorNotSupported);
  const CUtensorMapDataType type = elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {dim0, dim1}, strides[1] = {stride_bytes};
  const cuuint32_t box[2] = {box0, box1}, element_strides[2] = {1, 1};
  // (a 16-bit box is copied as bytes: bfloat16 and float16 alike)
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : static_cast<int>(cudaErrorInvalidValue);
}
}  // namespace

#include "kernels/launch.cuh"
#include "tensor_cores/roof.cuh"  // launch_roof: the tensor cores' roofs

// Writes 1 where this build's code for the device is sm_90a's (the Hopper versions' instructions).
__global__ void dense_sm90a_probe(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

int dense_kernels::device_arch() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const int arch = 10 * major + minor;
  if (arch != 90) return arch;
  static int hopper_built[64] = {};  // per device: 0 unknown, 1 yes, 2 no (asked once)
  int& known = hopper_built[device % 64];
  if (known == 0) {
    int* flag = nullptr;
    int found = 0;
    if (cudaMalloc(&flag, sizeof(int)) == cudaSuccess) {
      dense_sm90a_probe<<<1, 1>>>(flag);
      if (cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) found = 0;
      cudaFree(flag);
    }
    cudaGetLastError();  // a failed probe leaves no error behind for the next launch
    known = found ? 1 : 2;
  }
  return known == 1 ? 90 : 0;
}

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
// The backward's sigmoid-grad kernels one by one, for cuda/bench_gpu.py grad.
DENSE_EXPORT int dense_sigmoid_grad_launch(int version, int dtype, bool x4, const void* g, const void* y, void* dz,
                                           void* db, int64_t rows, int64_t cols, int sm_count, void* workspace,
                                           void* stream) {
  return dense_kernels::launch_sigmoid_grad(version, dtype, x4, g, y, dz, db, rows, cols, sm_count, workspace,
                                            static_cast<dense_kernels::Stream>(stream));
}
// The workspace of a resolved version (dense_gemm_resolve): -1 for version 0, whose choice depends
// on the operands, and for an unknown type.
DENSE_EXPORT int64_t dense_gemm_workspace(int version, int dtype, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (!dense_kernels::valid_dtype(dtype)) return -1;
  const auto t = static_cast<dense_kernels::DType>(dtype);
  return dense_kernels::gemm_workspace_elements(version, dense_kernels::acc_bytes(t), M, N, K, sm_count);
}
// What dense_gemm_launch runs for `version` on these operands on this device: dense_kernels::
// resolve_version (kernels only, as the launcher resolves; flags bit 1: the predicted table).
DENSE_EXPORT int dense_gemm_resolve(int version, const char* layout, int dtype, const void* A, const void* B,
                                    int64_t M, int64_t N, int64_t K, int sm_count, int flags) {
  if (!dense_kernels::valid_dtype(dtype) || dense_kernels::layout_index(layout) < 0) return -1;
  const auto t = static_cast<dense_kernels::DType>(dtype);
  return dense_kernels::resolve_version(
      version, M, N, K, t, sm_count, dense_kernels::device_arch(),
      dense_kernels::tma_compatible(layout, A, B, M, N, K, dense_kernels::dtype_bytes(t)), /*kernels_only=*/true,
      (flags & 2) ? dense_kernels::kPredicted : dense_kernels::kConfirmed);
}

// The tensor cores' roofs (cuda/tensor_cores/roof.cuh), for cuda/bench_gpu.py roof: kind 0 is
// mma.sync, 1 wgmma (sm_90a only). `blocks` blocks of kRoofThreads threads, each writing one float
// of `out`; 0 or a cudaError_t.
DENSE_EXPORT int dense_roof_launch(int kind, int blocks, int iterations, void* out, void* stream) {
  return dense_kernels::launch_roof(kind, blocks, iterations, static_cast<float*>(out),
                                    static_cast<dense_kernels::Stream>(stream));
}
// out[3]: a block's threads, the FLOPs of one block's iteration, and how many blocks an SM of this
// device holds at once (the occupancy calculator's: blocks × SMs is one full wave). 0 or a cudaError_t.
DENSE_EXPORT int dense_roof_info(int kind, int64_t* out) {
  if (kind < 0 || kind >= dense_kernels::kRoofKinds || out == nullptr) return DENSE_INVALID;
  const void* fn = dense_kernels::roof_entry(kind);
  if (fn == nullptr) return DENSE_NOT_BUILT;
  int per_sm = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, dense_kernels::kRoofThreads, 0);
  if (e != cudaSuccess) return static_cast<int>(e);
  out[0] = dense_kernels::kRoofThreads;
  out[1] = dense_kernels::roof_flops(kind);
  out[2] = per_sm;
  return 0;
}
