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
