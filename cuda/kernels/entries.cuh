// The kernels' entry points (extern "C" __global__, named as dense_kernels.h says) and the registry
// the host code finds them in. Each translation unit of cuda/units/ defines the entries of one
// version (or group) with the macros below; every entry also registers itself, when the library
// loads, under (kind, version, layout, type). launch.cuh looks entries up there, so an entry that a
// build leaves out is a clear "not built" error at the launch, not a link error, and the units can
// be compiled side by side (nvcc, one unit each: ninja runs them in parallel).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
#pragma once

#include "common.cuh"

namespace dense_kernels {

enum EntryKind : int { kGemmEntry = 0, kReduceEntry, kGradEntry, kGradX4Entry, kBiasGradEntry, kEntryKinds };

// (kind, version or 0, layout or 0, type) -> the entry, as a host pointer to the __global__ function.
class Registry {
 public:
  static Registry& get() {
    static Registry r;  // a function-local static: whichever unit's initialiser runs first makes it
    return r;
  }
  const void* find(int kind, int version, int layout, int dtype) const {
    if (kind < 0 || kind >= kEntryKinds || version < 0 || version >= kMaxVersionId || layout < 0 || layout >= 3 ||
        !valid_dtype(dtype))
      return nullptr;
    return at_[kind][version][layout][dtype];
  }
  void add(int kind, int version, int layout, int dtype, const void* fn) { at_[kind][version][layout][dtype] = fn; }

 private:
  const void* at_[kEntryKinds][kMaxVersionId][3][kDTypes] = {};
};

struct Registration {
  Registration(int kind, int version, int layout, int dtype, const void* fn) {
    Registry::get().add(kind, version, layout, dtype, fn);
  }
};

}  // namespace dense_kernels

// One GEMM entry of version V. __launch_bounds__ tells the compiler the block size, so it can budget
// registers for it; the warp-tiled versions (V = 11, 12) and the candidates also ask for their
// MINB blocks per SM, which caps the registers at 65536 / (MINB · threads).
#define DENSE_REGISTER(KIND, V, L, T, NAME)                                                                    \
  static const dense_kernels::Registration NAME##_registered(dense_kernels::KIND, V, L, dtype_of<T>(),          \
                                                            reinterpret_cast<const void*>(&NAME));
#define DENSE_GEMM_ENTRY(V, LAYOUT, L, TA, TB, T, SUFFIX)                                                        \
  extern "C" __global__ void __launch_bounds__(dense_kernels::threads(V, sizeof(acc_t<T>)))                     \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N,  \
                                            int64_t K, int epilogue) {                                           \
    gemm_v##V<T, TA, TB>(A, B, C, bias, M, N, K, epilogue);                                                     \
  }                                                                                                              \
  DENSE_REGISTER(kGemmEntry, V, L, T, dense_gemm_v##V##_##LAYOUT##_##SUFFIX)
#define DENSE_WARP_ENTRY(V, LAYOUT, L, TA, TB, T, SUFFIX)                                                        \
  extern "C" __global__ void __launch_bounds__(dense_kernels::threads(V, sizeof(acc_t<T>)),                     \
                                               dense_kernels::warp_tile(V, sizeof(acc_t<T>)).MINB)              \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N,  \
                                            int64_t K, int epilogue) {                                           \
    gemm_v##V<T, TA, TB, dense_kernels::WarpTileOf<V, sizeof(acc_t<T>)>>(A, B, C, bias, M, N, K, epilogue);     \
  }                                                                                                              \
  DENSE_REGISTER(kGemmEntry, V, L, T, dense_gemm_v##V##_##LAYOUT##_##SUFFIX)
// The three layouts of one version and type: nt (forward), nn and tn (backward).
#define DENSE_LAYOUTS(ENTRY, V, T, SUFFIX)     \
  ENTRY(V, nt, 0, false, true, T, SUFFIX)      \
  ENTRY(V, nn, 1, false, false, T, SUFFIX)     \
  ENTRY(V, tn, 2, true, false, T, SUFFIX)
// float32 and float64: versions 1 to 10; and bfloat16 and float16 too: v11's template.
#define DENSE_GEMM_TYPES(V)                  \
  DENSE_LAYOUTS(DENSE_GEMM_ENTRY, V, float, f32) \
  DENSE_LAYOUTS(DENSE_GEMM_ENTRY, V, double, f64)
#define DENSE_WARP_TYPES(V)                                \
  DENSE_LAYOUTS(DENSE_WARP_ENTRY, V, float, f32)           \
  DENSE_LAYOUTS(DENSE_WARP_ENTRY, V, double, f64)          \
  DENSE_LAYOUTS(DENSE_WARP_ENTRY, V, __nv_bfloat16, bf16)  \
  DENSE_LAYOUTS(DENSE_WARP_ENTRY, V, __half, f16)

// A TMA version's entry: the operands come as tensor maps (kernel parameters: __grid_constant__).
#define DENSE_TMA_ENTRY(V, LAYOUT, L, TA, TB, T, SUFFIX)                                                        \
  extern "C" __global__ void __launch_bounds__(dense_kernels::threads(V, sizeof(acc_t<T>)), 1)                  \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const DENSE_GRID_CONSTANT CUtensorMap map_a,                         \
                                            const DENSE_GRID_CONSTANT CUtensorMap map_b, T* C, const T* bias,    \
                                            int64_t M, int64_t N, int64_t K, int epilogue) {                     \
    gemm_v##V<T, TA, TB>(map_a, map_b, C, bias, M, N, K, epilogue);                                              \
  }                                                                                                              \
  DENSE_REGISTER(kGemmEntry, V, L, T, dense_gemm_v##V##_##LAYOUT##_##SUFFIX)
#define DENSE_TMA_F32_TYPES(V) DENSE_LAYOUTS(DENSE_TMA_ENTRY, V, float, f32)
#define DENSE_TMA16_TYPES(V)                               \
  DENSE_LAYOUTS(DENSE_TMA_ENTRY, V, __nv_bfloat16, bf16)   \
  DENSE_LAYOUTS(DENSE_TMA_ENTRY, V, __half, f16)

// The tensor-core versions: bfloat16 and float16 (mma.sync m16n8k16), or float32 through tf32.
#define DENSE_TC16_TYPES(V)                                  \
  DENSE_LAYOUTS(DENSE_GEMM_ENTRY, V, __nv_bfloat16, bf16)    \
  DENSE_LAYOUTS(DENSE_GEMM_ENTRY, V, __half, f16)
#define DENSE_F32_TYPES(V) DENSE_LAYOUTS(DENSE_GEMM_ENTRY, V, float, f32)

// An autotuning candidate: v11's template at kTuneCandidates[I], float32, launched as tune_id(I).
#define DENSE_TUNE_ENTRY(I, LAYOUT, L, TA, TB, T, SUFFIX)                                                      \
  extern "C" __global__ void __launch_bounds__(dense_kernels::warp_threads(dense_kernels::kTuneCandidates[I]), \
                                               dense_kernels::kTuneCandidates[I].MINB)                         \
      dense_gemm_tune##I##_##LAYOUT##_f32(const float* A, const float* B, float* C, const float* bias, int64_t M, \
                                          int64_t N, int64_t K, int epilogue) {                                  \
    gemm_v11<float, TA, TB, dense_kernels::TuneShape<I>>(A, B, C, bias, M, N, K, epilogue);                    \
  }                                                                                                             \
  DENSE_REGISTER(kGemmEntry, dense_kernels::tune_id(I), L, float, dense_gemm_tune##I##_##LAYOUT##_f32)
#define DENSE_TUNE_LAYOUTS(I, ...) DENSE_LAYOUTS(DENSE_TUNE_ENTRY, I, float, f32)

// Split-K's reduction: partial products (the accumulator's type) -> C with the epilogue.
#define DENSE_REDUCE_ENTRY(T, SUFFIX)                                                                        \
  extern "C" __global__ void __launch_bounds__(dense_kernels::kReduceThreads) dense_splitk_reduce_##SUFFIX(  \
      const acc_t<T>* partial, T* C, const T* bias, int64_t M, int64_t N, int slices, int epilogue) {        \
    splitk_reduce<T>(partial, C, bias, M, N, slices, epilogue);                                               \
  }                                                                                                           \
  DENSE_REGISTER(kReduceEntry, 0, 0, T, dense_splitk_reduce_##SUFFIX)

// The backward's elementwise kernels (sigmoid_grad.cuh).
#define DENSE_GRAD_ENTRY(KIND, V, NAME, CALL, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(dense_kernels::kGradThreads)                                     \
      NAME(const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols) {                                  \
    CALL(g, y, dz, db, rows, cols);                                                                              \
  }                                                                                                              \
  DENSE_REGISTER(KIND, V, 0, T, NAME)
#define DENSE_BIAS_GRAD_ENTRY(T, SUFFIX)                                                                        \
  extern "C" __global__ void __launch_bounds__(dense_kernels::kReduceThreads)                                   \
      dense_bias_grad_v3_##SUFFIX(const acc_t<T>* partial, T* db, int64_t parts, int64_t cols) {                \
    bias_grad_v3<T>(partial, db, parts, cols);                                                                   \
  }                                                                                                              \
  DENSE_REGISTER(kBiasGradEntry, 3, 0, T, dense_bias_grad_v3_##SUFFIX)
