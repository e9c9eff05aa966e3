// The GPU instructions the kernels use beyond plain C++, one small wrapper each: inline PTX when
// nvcc compiles for a GPU that has the instruction, the CPU emulation's model of it otherwise
// (cuda/emulate/cuda_emu.h, namespace emu). The kernels call only these wrappers, so the code the
// emulator runs is the code the GPU runs; each model is tested against its own encoding of the
// PTX ISA's definition (tests/test_instructions.py), never against the kernels that use it.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
#pragma once

#include "common.cuh"

namespace {

// ---------------------------------------------------------------------------------------------
// cp.async (sm_80+): a 16-byte copy from global to shared memory that does not pass through
// registers. Copies are grouped by commit; wait<N> blocks until at most N of the thread's most
// recent groups are still in flight (wait<0>: all of them). Until then the shared bytes are not
// there: the emulation makes the copy at the wait, so a kernel that reads them earlier reads the
// old bytes, as it may on a GPU. Both addresses must be 16-byte aligned.
// ---------------------------------------------------------------------------------------------
// (nvcc's host pass, where __CUDA_ARCH__ is not defined, only parses device code: any branch of
// the GPU's will do there. The emulation is the host compiler without nvcc.)
#if defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
constexpr bool kHasCpAsync = true;
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))),
               "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Commit the copies issued so far and wait for every one (v8's one step of double buffering).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::); }
#elif defined(__CUDACC__)
// Older GPUs have no cp.async: kHasCpAsync tells the kernels to copy through registers, and these
// are never reached (a copy, for completeness).
constexpr bool kHasCpAsync = false;
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) { memcpy(smem, gmem, 16); }
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#else
constexpr bool kHasCpAsync = true;  // the emulation models sm_80+'s asynchronous copy
inline void cp_async16(void* smem, const void* gmem) { emu::cp_async(smem, gmem, 16); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  emu::cp_async_wait(N);
}
inline void cp_async_wait_all() {
  emu::cp_async_commit();
  emu::cp_async_wait(0);
}
#endif

}  // namespace

namespace {

// ---------------------------------------------------------------------------------------------
// The tensor cores' warp-wide instructions (sm_80+; ldmatrix sm_75+). Operands are registers of
// 32 bits: two bfloat16 or float16 elements each (the lower index in the lower half), or one tf32.
// Which element of which matrix a lane's register holds is the PTX ISA's fragment table for the
// shape (cuda/tensor_cores/README.md draws them from the emulation's model of them).
// ---------------------------------------------------------------------------------------------
template <typename T>
struct MmaType;  // the PTX type name of a 16-bit operand
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr bool bf16 = true;
};
template <>
struct MmaType<__half> {
  static constexpr bool bf16 = false;
};

#if defined(__CUDACC__)
// D = A·B + C for a 16×8 tile, K = 16: A 16×16 (4 registers), B 16×8 (2), C and D 16×8 float32 (4).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  if constexpr (MmaType<T>::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  }
}
// D = A·B + C for a 16×8 tile, K = 8, tf32 operands (one a register): A 4 registers, B 2.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}
// float32 -> tf32, rounded to nearest, ties away from zero (the low 13 bits of the result are 0).
__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// N 8×8 matrices of 16-bit elements from shared memory; lanes 8j..8j+7 give the rows of matrix j.
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t (&d)[N], const void* smem_row) {
  const unsigned p = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  if constexpr (N == 1 && !Trans) asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(p));
  if constexpr (N == 1 && Trans) asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(p));
  if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(d[0]), "=r"(d[1]) : "r"(p));
  if constexpr (N == 2 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(d[0]), "=r"(d[1]) : "r"(p));
  if constexpr (N == 4 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(p));
  if constexpr (N == 4 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(p));
}
#else
template <typename T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  const emu::Array4 r = emu::mma_m16n8k16<MmaType<T>::bf16>(a, b, c);
  for (int i = 0; i < 4; ++i) d[i] = r.v[i];
}
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  const emu::Array4 r = emu::mma_m16n8k8_tf32(a, b, c);
  for (int i = 0; i < 4; ++i) d[i] = r.v[i];
}
inline uint32_t cvt_rna_tf32(float x) { return emu::cvt_rna_tf32(x); }
template <int N, bool Trans>
inline void ldmatrix(uint32_t (&d)[N], const void* smem_row) {
  const emu::Regs4 r = emu::ldmatrix<N, Trans>(smem_row);
  for (int i = 0; i < N; ++i) d[i] = r.r[i];
}
#endif

}  // namespace
