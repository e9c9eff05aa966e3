// Stage 3: the Dense layer's kernels in plain CUDA (CUDA headers only, no torch).
//
// Compile check (no GPU needed):
//   nvcc -c -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense_kernels.o
// PTX for stage 4:  bash ptx/regen.sh
//
// y = sigmoid(x Wᵀ + b) is one GEMM with an epilogue; the backward is one elementwise
// kernel (dz, and the bias gradient) and two more GEMMs of the same family. The GEMM comes
// in numbered versions, each a step of the usual progression:
//   v1  one thread per output, straight from global memory
//   v2  32×32 tiles staged in shared memory, one output per thread
//   v3  register tiles: each thread keeps TM×TN outputs in registers, operand tiles arrive
//       with 128-bit loads where the layout allows
//   v4  v3 with smaller tiles, for small batches (more blocks to fill the SMs)
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/all.cuh"

// ---------------------------------------------------------------------------------------
// Host launchers for the CUDA stage (the PTX stage launches the same entries by name).
// ---------------------------------------------------------------------------------------
namespace dense_kernels {

namespace {
template <typename T>
int launch_gemm_t(int version, const char* layout, const T* A, const T* B, T* C, const T* bias, int64_t M,
                  int64_t N, int64_t K, int epilogue, cudaStream_t stream) {
  if (version == 0) version = choose_version(M, N);
  const GemmFn<T> fn = gemm_entry<T>(version, layout);
  if (fn == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const Geometry geo = gemm_geometry(version, sizeof(T), M, N);
  fn<<<dim3(geo.grid.x, geo.grid.y, geo.grid.z), dim3(geo.block.x, geo.block.y, geo.block.z), 0, stream>>>(
      A, B, C, bias, M, N, K, epilogue);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace

int launch_gemm(int version, const char* layout, int element_bytes, const void* A, const void* B, void* C,
                const void* bias, int64_t M, int64_t N, int64_t K, int epilogue, Stream stream) {
  if (element_bytes == 4)
    return launch_gemm_t(version, layout, static_cast<const float*>(A), static_cast<const float*>(B),
                         static_cast<float*>(C), static_cast<const float*>(bias), M, N, K, epilogue, stream);
  if (element_bytes == 8)
    return launch_gemm_t(version, layout, static_cast<const double*>(A), static_cast<const double*>(B),
                         static_cast<double*>(C), static_cast<const double*>(bias), M, N, K, epilogue, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

int launch_sigmoid_grad(int element_bytes, bool x4, const void* g, const void* y, void* dz, void* db,
                        int64_t rows, int64_t cols, Stream stream) {
  const Geometry geo = sigmoid_grad_geometry(cols, x4 ? 4 : 1);
  const dim3 grid(geo.grid.x, geo.grid.y, geo.grid.z), block(geo.block.x, geo.block.y, geo.block.z);
  if (element_bytes == 4 && x4) {
    dense_sigmoid_grad_x4_f32<<<grid, block, 0, stream>>>(static_cast<const float*>(g), static_cast<const float*>(y),
                                                          static_cast<float*>(dz), static_cast<float*>(db), rows, cols);
  } else if (element_bytes == 4) {
    dense_sigmoid_grad_f32<<<grid, block, 0, stream>>>(static_cast<const float*>(g), static_cast<const float*>(y),
                                                       static_cast<float*>(dz), static_cast<float*>(db), rows, cols);
  } else if (element_bytes == 8 && !x4) {
    dense_sigmoid_grad_f64<<<grid, block, 0, stream>>>(static_cast<const double*>(g),
                                                       static_cast<const double*>(y), static_cast<double*>(dz),
                                                       static_cast<double*>(db), rows, cols);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dense_kernels
