// The stage-3 kernels, unchanged, run on the CPU: cuda/kernels/*.cuh compiled by the host compiler
// on top of cuda_emu.h, with the launch geometry of cuda/dense_kernels.h (the CUDA stage's own).
// A plain shared library with a C interface, for ctypes (cuda/emulated.py) and the sanitizer
// driver (cuda/emulate/driver.cpp).
//   c++ -std=c++17 -O2 -pthread -shared -fPIC -Icuda cuda/emulate/emulate.cpp -o /tmp/libdense_emu.so
#include "emulate/cuda_emu.h"
// (cuda_emu.h first: it defines what the kernels' CUDA keywords mean here)
#include "kernels/all.cuh"

namespace {

using namespace dense_kernels;

dim3 d3(Dim3 d) { return {d.x, d.y, d.z}; }

template <typename T>
int gemm_t(int version, const char* layout, const void* A, const void* B, void* C, const void* bias, int64_t M,
           int64_t N, int64_t K, int epilogue) {
  if (version == 0) version = choose_version(M, N);
  const GemmFn<T> fn = gemm_entry<T>(version, layout);
  if (fn == nullptr) return 1;
  const Geometry geo = gemm_geometry(version, sizeof(T), M, N);
  const T *a = static_cast<const T*>(A), *b = static_cast<const T*>(B), *bi = static_cast<const T*>(bias);
  T* c = static_cast<T*>(C);
  emu::launch(d3(geo.grid), d3(geo.block), [&] { fn(a, b, c, bi, M, N, K, epilogue); });
  return 0;
}

}  // namespace

extern "C" {

// The same contract as dense_kernels::launch_gemm; returns 0, or 1 for an unknown version/layout/type.
int emu_gemm(int version, const char* layout, int element_bytes, const void* A, const void* B, void* C,
             const void* bias, int64_t M, int64_t N, int64_t K, int epilogue) {
  if (element_bytes == 4) return gemm_t<float>(version, layout, A, B, C, bias, M, N, K, epilogue);
  if (element_bytes == 8) return gemm_t<double>(version, layout, A, B, C, bias, M, N, K, epilogue);
  return 1;
}

int emu_sigmoid_grad(int element_bytes, int x4, const void* g, const void* y, void* dz, void* db, int64_t rows,
                     int64_t cols) {
  const Geometry geo = sigmoid_grad_geometry(cols, x4 ? 4 : 1);
  if (element_bytes == 4) {
    auto fn = x4 ? dense_sigmoid_grad_x4_f32 : dense_sigmoid_grad_f32;
    emu::launch(d3(geo.grid), d3(geo.block), [&] {
      fn(static_cast<const float*>(g), static_cast<const float*>(y), static_cast<float*>(dz),
         static_cast<float*>(db), rows, cols);
    });
    return 0;
  }
  if (element_bytes == 8 && !x4) {
    emu::launch(d3(geo.grid), d3(geo.block), [&] {
      dense_sigmoid_grad_f64(static_cast<const double*>(g), static_cast<const double*>(y), static_cast<double*>(dz),
                             static_cast<double*>(db), rows, cols);
    });
    return 0;
  }
  return 1;
}

}  // extern "C"
