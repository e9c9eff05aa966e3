// The host side, written once: which entry for (version, layout, type), and the launch sequence
// (split-K's reduction, the bias gradient's second pass). A "version" tune_id(I) is autotuning
// candidate I (float32 only; dense_kernels.h). cuda/dense_kernels.cu includes it with
// DENSE_LAUNCH = kernel<<<grid, block, 0, stream>>>, cuda/emulate/emulate.cpp with the emulator's
// launch; both take the geometry from dense_kernels.h.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense.cubin
// Needs, defined by the includer: DENSE_LAUNCH(fn, geometry, args...), DENSE_LAUNCH_STATUS()
// (0 or the error of the launch just made) and DENSE_INVALID (the error for a bad request).
#pragma once

#include <cstring>

#include "all.cuh"

namespace dense_kernels {
namespace {

template <typename T>
using GemmFn = void (*)(const T*, const T*, T*, const T*, int64_t, int64_t, int64_t, int);

int layout_index(const char* layout) {
  return std::strcmp(layout, "nt") == 0 ? 0 : std::strcmp(layout, "nn") == 0 ? 1 : std::strcmp(layout, "tn") == 0 ? 2 : -1;
}

#define DENSE_TABLE_ROW(V, SUFFIX) \
  {dense_gemm_v##V##_nt_##SUFFIX, dense_gemm_v##V##_nn_##SUFFIX, dense_gemm_v##V##_tn_##SUFFIX}
#define DENSE_TABLE(SUFFIX)                                                                                 \
  {DENSE_TABLE_ROW(1, SUFFIX), DENSE_TABLE_ROW(2, SUFFIX), DENSE_TABLE_ROW(3, SUFFIX), DENSE_TABLE_ROW(4, SUFFIX), \
   DENSE_TABLE_ROW(5, SUFFIX), DENSE_TABLE_ROW(6, SUFFIX), DENSE_TABLE_ROW(7, SUFFIX), DENSE_TABLE_ROW(8, SUFFIX), \
   DENSE_TABLE_ROW(9, SUFFIX), DENSE_TABLE_ROW(10, SUFFIX), DENSE_TABLE_ROW(11, SUFFIX), DENSE_TABLE_ROW(12, SUFFIX)}
#define DENSE_TUNE_ROW(I) {dense_gemm_tune##I##_nt_f32, dense_gemm_tune##I##_nn_f32, dense_gemm_tune##I##_tn_f32}

template <typename T>
GemmFn<T> gemm_entry(int version, const char* layout);
template <>
GemmFn<float> gemm_entry<float>(int version, const char* layout) {
  static const GemmFn<float> table[kVersions][3] = DENSE_TABLE(f32);
  static const GemmFn<float> tune[kTuneCount][3] = {DENSE_TUNE_ROW(0), DENSE_TUNE_ROW(1), DENSE_TUNE_ROW(2),
                                                    DENSE_TUNE_ROW(3), DENSE_TUNE_ROW(4), DENSE_TUNE_ROW(5),
                                                    DENSE_TUNE_ROW(6), DENSE_TUNE_ROW(7)};
  const int l = layout_index(layout);
  if (l < 0) return nullptr;
  if (is_tune(version)) return tune[version - kTuneBase][l];
  return (version >= 1 && version <= kVersions) ? table[version - 1][l] : nullptr;
}
template <>
GemmFn<double> gemm_entry<double>(int version, const char* layout) {
  static const GemmFn<double> table[kVersions][3] = DENSE_TABLE(f64);
  const int l = layout_index(layout);
  return (version >= 1 && version <= kVersions && l >= 0) ? table[version - 1][l] : nullptr;  // no f64 candidates
}

void (*splitk_reduce_entry(float*))(const float*, float*, const float*, int64_t, int64_t, int, int) {
  return dense_splitk_reduce_f32;
}
void (*splitk_reduce_entry(double*))(const double*, double*, const double*, int64_t, int64_t, int, int) {
  return dense_splitk_reduce_f64;
}

template <typename T>
int launch_gemm_t(int version, const char* layout, const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N,
                  int64_t K, int epilogue, int sm_count, T* workspace, Stream stream) {
  (void)stream;
  if (version == 0) version = choose_version(M, N, K, sizeof(T), sm_count);
  const GemmFn<T> fn = gemm_entry<T>(version, layout);
  if (fn == nullptr || M < 0 || N < 0 || K < 0) return DENSE_INVALID;
  if (M == 0 || N == 0) return 0;  // nothing to compute (K = 0 is computed: C = epilogue(0))
  const Geometry geo = gemm_geometry(version, sizeof(T), M, N, K, sm_count);
  if (geo.grid.z == 1) {
    DENSE_LAUNCH(fn, geo, A, B, C, bias, M, N, K, epilogue);
    return DENSE_LAUNCH_STATUS();
  }
  // split-K: partial products into the workspace, then their sum in slice order + the epilogue
  if (workspace == nullptr) return DENSE_INVALID;
  DENSE_LAUNCH(fn, geo, A, B, workspace, static_cast<const T*>(nullptr), M, N, K, int(kPlain));
  if (const int e = DENSE_LAUNCH_STATUS()) return e;
  const Geometry red = reduce_geometry(M, N);
  DENSE_LAUNCH(splitk_reduce_entry(static_cast<T*>(nullptr)), red, static_cast<const T*>(workspace), C, bias, M, N,
               static_cast<int>(geo.grid.z), epilogue);
  return DENSE_LAUNCH_STATUS();
}

template <typename T>
struct GradEntries;
template <>
struct GradEntries<float> {
  static constexpr void (*v[3])(const float*, const float*, float*, float*, int64_t, int64_t) = {
      dense_sigmoid_grad_v1_f32, dense_sigmoid_grad_v2_f32, dense_sigmoid_grad_v3_f32};
  static constexpr auto bias = dense_bias_grad_v3_f32;
};
template <>
struct GradEntries<double> {
  static constexpr void (*v[3])(const double*, const double*, double*, double*, int64_t, int64_t) = {
      dense_sigmoid_grad_v1_f64, dense_sigmoid_grad_v2_f64, dense_sigmoid_grad_v3_f64};
  static constexpr auto bias = dense_bias_grad_v3_f64;
};

template <typename T>
int launch_sigmoid_grad_t(int version, bool x4, const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols,
                          int sm_count, T* workspace, Stream stream) {
  (void)stream;
  if (version == 0) version = kDefaultGradVersion;
  if (version < 1 || version > kGradVersions || (x4 && (version != 1 || sizeof(T) != 4 || cols % 4 != 0)))
    return DENSE_INVALID;
  if (cols <= 0) return 0;
  const Geometry geo = sigmoid_grad_geometry(version, rows, cols, x4 ? 4 : 1, sm_count);
  auto fn = GradEntries<T>::v[version - 1];
  if constexpr (sizeof(T) == 4) {
    if (x4) fn = dense_sigmoid_grad_v1_x4_f32;
  }
  const bool second_pass = geo.grid.y > 1 && db != nullptr;
  if (second_pass && workspace == nullptr) return DENSE_INVALID;
  DENSE_LAUNCH(fn, geo, g, y, dz, second_pass ? workspace : db, rows, cols);
  if (const int e = DENSE_LAUNCH_STATUS()) return e;
  if (!second_pass) return 0;
  DENSE_LAUNCH(GradEntries<T>::bias, bias_grad_geometry(cols), static_cast<const T*>(workspace), db,
               static_cast<int64_t>(geo.grid.y), cols);
  return DENSE_LAUNCH_STATUS();
}

}  // namespace

int launch_gemm(int version, const char* layout, int element_bytes, const void* A, const void* B, void* C,
                const void* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace,
                Stream stream) {
  if (element_bytes == 4)
    return launch_gemm_t(version, layout, static_cast<const float*>(A), static_cast<const float*>(B),
                         static_cast<float*>(C), static_cast<const float*>(bias), M, N, K, epilogue, sm_count,
                         static_cast<float*>(workspace), stream);
  if (element_bytes == 8)
    return launch_gemm_t(version, layout, static_cast<const double*>(A), static_cast<const double*>(B),
                         static_cast<double*>(C), static_cast<const double*>(bias), M, N, K, epilogue, sm_count,
                         static_cast<double*>(workspace), stream);
  return DENSE_INVALID;
}

int launch_sigmoid_grad(int version, int element_bytes, bool x4, const void* g, const void* y, void* dz, void* db,
                        int64_t rows, int64_t cols, int sm_count, void* workspace, Stream stream) {
  if (element_bytes == 4)
    return launch_sigmoid_grad_t(version, x4, static_cast<const float*>(g), static_cast<const float*>(y),
                                 static_cast<float*>(dz), static_cast<float*>(db), rows, cols, sm_count,
                                 static_cast<float*>(workspace), stream);
  if (element_bytes == 8)
    return launch_sigmoid_grad_t(version, x4, static_cast<const double*>(g), static_cast<const double*>(y),
                                 static_cast<double*>(dz), static_cast<double*>(db), rows, cols, sm_count,
                                 static_cast<double*>(workspace), stream);
  return DENSE_INVALID;
}

}  // namespace dense_kernels
