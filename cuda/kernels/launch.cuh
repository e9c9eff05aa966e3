//   nvcc -c -std=c++17 -O3 -arch=sm_90a cuda/dense_kernels.cu -o /tmp/dense_kernels.o   (its GPU side)
// The host side, written once: which entry for (version, layout, type), and the launch sequence
// (split-K's reduction, the bias gradient's second pass). A "version" tune_id(I) is autotuning
// candidate I (float32 only; dense_kernels.h). cuda/dense_kernels.cu includes it with
// DENSE_LAUNCH = kernel<<<grid, block, 0, stream>>>, cuda/emulate/emulate.cpp with the emulator's
// launch; both take the geometry from dense_kernels.h and the entries from the registry that the
// units fill as they load (entries.cuh).
// Needs, defined by the includer: DENSE_LAUNCH(fn, geometry, args...) and DENSE_LAUNCH_SMEM(fn,
// geometry, dynamic shared bytes, args...), DENSE_LAUNCH_STATUS() (0 or the error of the launch
// just made), DENSE_INVALID (the error for a bad request), DENSE_NOT_BUILT (the error for an entry
// this build left out), DENSE_DEVICE_ARCH() (the current device's compute capability, 90 for sm_90)
// and DENSE_TENSOR_MAP_2D(map, element bytes, base, dim0, dim1, row stride bytes, box0, box1,
// swizzle bytes) (cuTensorMapEncodeTiled with the 128- or 64-byte swizzle: 0 or an error).
#pragma once

#include <cstring>

#include "entries.cuh"
#include "hopper_instructions.cuh"  // CUtensorMap

namespace dense_kernels {
namespace {

template <typename T>
using GemmFn = void (*)(const T*, const T*, T*, const T*, int64_t, int64_t, int64_t, int);
template <typename T>
using ReduceFn = void (*)(const acc_t<T>*, T*, const T*, int64_t, int64_t, int, int);
template <typename T>
using GradFn = void (*)(const T*, const T*, T*, T*, int64_t, int64_t);
template <typename T>
using BiasGradFn = void (*)(const acc_t<T>*, T*, int64_t, int64_t);
template <typename T>
using TmaGemmFn = void (*)(CUtensorMap, CUtensorMap, T*, const T*, int64_t, int64_t, int64_t, int);

int layout_index(const char* layout) {
  return std::strcmp(layout, "nt") == 0 ? 0 : std::strcmp(layout, "nn") == 0 ? 1 : std::strcmp(layout, "tn") == 0 ? 2 : -1;
}

template <typename Fn>
Fn entry(int kind, int version, int layout, DType dtype) {
  return reinterpret_cast<Fn>(const_cast<void*>(Registry::get().find(kind, version, layout, dtype)));
}

// A TMA version: the operands' tensor maps, made here per call. K-major operands (rows along m or
// n): boxes of 128 bytes of k × the tile's rows, 128B-swizzled. MN-major ones (rows along k):
// boxes of 64 (or 32, for 4-byte elements) rows of k × 128 bytes of m or n, or × the tile's width
// where it is narrower (v35's 32 m: 64 bytes), swizzled by a row's bytes (v32_tma.cuh's TmaTile).
template <typename T>
int launch_tma_t(int version, int l, const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K,
                 int epilogue, int sm_count, acc_t<T>* workspace, Stream stream) {
  (void)stream;
  const ReduceFn<T> reduce = entry<ReduceFn<T>>(kReduceEntry, 0, 0, dtype_of<T>());
  if (K == 0) {  // no tensor map has an empty dimension: C = epilogue(0) is a reduction of no slices
    if (reduce == nullptr) return DENSE_NOT_BUILT;
    DENSE_LAUNCH(reduce, reduce_geometry(M, N), static_cast<const acc_t<T>*>(nullptr), C, bias, M, N, 0, epilogue);
    return DENSE_LAUNCH_STATUS();
  }
  const bool ta = l == 2, tb = l == 0;
  constexpr uint32_t E = sizeof(T), inner = 128 / E;
  const Tile t = tile(version, 4);
  CUtensorMap ma, mb;
  const uint32_t wide_a = inner < uint32_t(t.BM) ? inner : uint32_t(t.BM);  // MN-major boxes' inner sides
  const uint32_t wide_b = inner < uint32_t(t.BN) ? inner : uint32_t(t.BN);
  const int ra = !ta ? DENSE_TENSOR_MAP_2D(&ma, E, A, K, M, K * E, inner, t.BM, 128)
                     : DENSE_TENSOR_MAP_2D(&ma, E, A, M, K, M * E, wide_a, inner, wide_a * E);
  const int rb = tb ? DENSE_TENSOR_MAP_2D(&mb, E, B, K, N, K * E, inner, t.BN, 128)
                    : DENSE_TENSOR_MAP_2D(&mb, E, B, N, K, N * E, wide_b, inner, wide_b * E);
  if (ra != 0 || rb != 0) return DENSE_INVALID;
  const TmaGemmFn<T> fn = entry<TmaGemmFn<T>>(kGemmEntry, version, l, dtype_of<T>());
  if (fn == nullptr) return DENSE_NOT_BUILT;
  const Geometry geo = gemm_geometry(version, 4, M, N, K, sm_count);
  if (geo.grid.z == 1) {
    DENSE_LAUNCH_SMEM(fn, geo, tma_smem_bytes(version), ma, mb, C, bias, M, N, K, epilogue);
    return DENSE_LAUNCH_STATUS();
  }
  // split-K (v35): partial products into the workspace, then their sum in slice order + the epilogue
  if (workspace == nullptr) return DENSE_INVALID;
  if (reduce == nullptr) return DENSE_NOT_BUILT;
  DENSE_LAUNCH_SMEM(fn, geo, tma_smem_bytes(version), ma, mb, reinterpret_cast<T*>(workspace),
                    static_cast<const T*>(nullptr), M, N, K, int(kPlain));
  if (const int e = DENSE_LAUNCH_STATUS()) return e;
  DENSE_LAUNCH(reduce, reduce_geometry(M, N), static_cast<const acc_t<T>*>(workspace), C, bias, M, N,
               static_cast<int>(geo.grid.z), epilogue);
  return DENSE_LAUNCH_STATUS();
}

template <typename T>
int launch_gemm_t(int version, const char* layout, const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N,
                  int64_t K, int epilogue, int sm_count, acc_t<T>* workspace, Stream stream) {
  (void)stream;
  constexpr DType dtype = dtype_of<T>();
  const int l = layout_index(layout);
  if (l < 0) return DENSE_INVALID;
  const int arch = DENSE_DEVICE_ARCH();
  const bool tma_ok = tma_compatible(layout, A, B, M, N, K, sizeof(T));
  // A launcher has kernels only: version 0 resolves as the PTX stage's does (never to kAten)
  version = resolve_version(version, M, N, K, dtype, sm_count, arch, tma_ok, /*kernels_only=*/true);
  if (M < 0 || N < 0 || K < 0 || !usable(version, arch, tma_ok) ||
      !((is_version(version) && version_builds(version, dtype)) || (is_tune(version) && dtype == kF32)))
    return DENSE_INVALID;
  if (uses_tma(version)) return M == 0 || N == 0 ? 0 : launch_tma_t(version, l, A, B, C, bias, M, N, K, epilogue,
                                                                     sm_count, workspace, stream);
  const GemmFn<T> fn = entry<GemmFn<T>>(kGemmEntry, version, l, dtype);
  if (fn == nullptr) return DENSE_NOT_BUILT;
  if (M == 0 || N == 0) return 0;  // nothing to compute (K = 0 is computed: C = epilogue(0))
  const Geometry geo = gemm_geometry(version, sizeof(acc_t<T>), M, N, K, sm_count);
  if (geo.grid.z == 1) {
    DENSE_LAUNCH(fn, geo, A, B, C, bias, M, N, K, epilogue);
    return DENSE_LAUNCH_STATUS();
  }
  // split-K: partial products into the workspace (the accumulator's type, passed where C goes),
  // then their sum in slice order + the epilogue
  const ReduceFn<T> reduce = entry<ReduceFn<T>>(kReduceEntry, 0, 0, dtype);
  if (workspace == nullptr) return DENSE_INVALID;
  if (reduce == nullptr) return DENSE_NOT_BUILT;
  DENSE_LAUNCH(fn, geo, A, B, reinterpret_cast<T*>(workspace), static_cast<const T*>(nullptr), M, N, K, int(kPlain));
  if (const int e = DENSE_LAUNCH_STATUS()) return e;
  DENSE_LAUNCH(reduce, reduce_geometry(M, N), static_cast<const acc_t<T>*>(workspace), C, bias, M, N,
               static_cast<int>(geo.grid.z), epilogue);
  return DENSE_LAUNCH_STATUS();
}

template <typename T>
int launch_sigmoid_grad_t(int version, bool x4, const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols,
                          int sm_count, acc_t<T>* workspace, Stream stream) {
  (void)stream;
  constexpr DType dtype = dtype_of<T>();
  if (version == 0) version = kDefaultGradVersion;
  if (version < 1 || version > kGradVersions || (x4 && (version != 1 || dtype != kF32 || cols % 4 != 0)))
    return DENSE_INVALID;
  const GradFn<T> fn = entry<GradFn<T>>(x4 ? kGradX4Entry : kGradEntry, version, 0, dtype);
  if (fn == nullptr) return DENSE_NOT_BUILT;
  if (cols <= 0) return 0;
  const Geometry geo = sigmoid_grad_geometry(version, rows, cols, x4 ? 4 : 1, sm_count);
  const bool second_pass = geo.grid.y > 1 && db != nullptr;
  const BiasGradFn<T> bias = entry<BiasGradFn<T>>(kBiasGradEntry, 3, 0, dtype);
  if (second_pass && workspace == nullptr) return DENSE_INVALID;
  if (second_pass && bias == nullptr) return DENSE_NOT_BUILT;
  // v3's partial column sums go to the workspace (the accumulator's type), passed where db goes
  DENSE_LAUNCH(fn, geo, g, y, dz, second_pass ? reinterpret_cast<T*>(workspace) : db, rows, cols);
  if (const int e = DENSE_LAUNCH_STATUS()) return e;
  if (!second_pass) return 0;
  DENSE_LAUNCH(bias, bias_grad_geometry(cols), static_cast<const acc_t<T>*>(workspace), db,
               static_cast<int64_t>(geo.grid.y), cols);
  return DENSE_LAUNCH_STATUS();
}

// Calls f(T{}) with T the element type `dtype` names; DENSE_INVALID for any other value.
template <typename F>
int with_type(int dtype, F&& f) {
  switch (dtype) {
    case kF32: return f(float{});
    case kF64: return f(double{});
    case kBF16: return f(__nv_bfloat16{});
    case kF16: return f(__half{});
    default: return DENSE_INVALID;
  }
}

}  // namespace

int launch_gemm(int version, const char* layout, int dtype, const void* A, const void* B, void* C, const void* bias,
                int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace, Stream stream) {
  return with_type(dtype, [&](auto t) {
    using T = decltype(t);
    return launch_gemm_t(version, layout, static_cast<const T*>(A), static_cast<const T*>(B), static_cast<T*>(C),
                         static_cast<const T*>(bias), M, N, K, epilogue, sm_count, static_cast<acc_t<T>*>(workspace),
                         stream);
  });
}

int launch_sigmoid_grad(int version, int dtype, bool x4, const void* g, const void* y, void* dz, void* db, int64_t rows,
                        int64_t cols, int sm_count, void* workspace, Stream stream) {
  return with_type(dtype, [&](auto t) {
    using T = decltype(t);
    return launch_sigmoid_grad_t(version, x4, static_cast<const T*>(g), static_cast<const T*>(y), static_cast<T*>(dz),
                                 static_cast<T*>(db), rows, cols, sm_count, static_cast<acc_t<T>*>(workspace), stream);
  });
}

}  // namespace dense_kernels
