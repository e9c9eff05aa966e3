// The CUDA chapter's kernels, unchanged, run on the CPU: cuda/kernels/*.cuh compiled by the host compiler
// on top of cuda_emu.h, launched by the same host code as on the GPU (cuda/kernels/launch.cuh)
// with the geometry of cuda/dense_kernels.h. A plain shared library with a C interface, for
// ctypes (cuda/emulated.py) and the sanitizer driver (cuda/emulate/driver.cpp).
//   c++ -std=c++17 -O2 -pthread -shared -fPIC -fvisibility=hidden -Icuda cuda/emulate/emulate.cpp -o /tmp/libdense_emu.so
#include "emulate/cuda_emu.h"
// (cuda_emu.h first: it defines what the kernels' CUDA keywords mean here)

// The launch, and its status as cudaGetLastError would give it: 0, or emu::kBarrierNeverReached.
namespace emu {
inline thread_local int last_status = 0;
inline int take_status() {
  const int s = last_status;
  last_status = 0;
  return s;
}
}  // namespace emu
#define DENSE_LAUNCH(fn, geo, ...)                                                                             \
  (emu::last_status = emu::launch(dim3{(geo).grid.x, (geo).grid.y, (geo).grid.z},                              \
                                  dim3{(geo).block.x, (geo).block.y, (geo).block.z}, [&] { fn(__VA_ARGS__); }))
#define DENSE_LAUNCH_STATUS() emu::take_status()
#define DENSE_INVALID 1  // an invalid request; 2 (emu::kBarrierNeverReached): a block could not finish
#define DENSE_NOT_BUILT 3  // an entry the build left out (every entry is built here: not reached)

#include "kernels/all.cuh"
#include "kernels/launch.cuh"

// The library is built with -fvisibility=hidden and exports only the functions below: two
// builds (fibers, OS threads) then load side by side in one process without sharing the
// emulation's variables, which C++ would otherwise make one process-wide object (inline variables).
#define EMU_API __attribute__((visibility("default")))

extern "C" {

// dense_kernels::launch_gemm / launch_sigmoid_grad with C linkage; the same return codes
// (0; 1 for an invalid request; 2 when a block could not finish, with the reason on stderr).
// `dtype` is a dense_kernels::DType. The workspace sizes (in elements of the accumulator's type,
// float32 or float64): emu_*_workspace.
EMU_API int emu_gemm(int version, const char* layout, int dtype, const void* A, const void* B, void* C,
                     const void* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace) {
  return dense_kernels::launch_gemm(version, layout, dtype, A, B, C, bias, M, N, K, epilogue, sm_count, workspace,
                                    nullptr);
}
EMU_API int64_t emu_gemm_workspace(int version, int dtype, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (!dense_kernels::valid_dtype(dtype)) return -1;
  const auto t = static_cast<dense_kernels::DType>(dtype);
  if (version == 0) version = dense_kernels::choose_version(M, N, K, t, sm_count);
  return dense_kernels::gemm_workspace_elements(version, dense_kernels::acc_bytes(t), M, N, K, sm_count);
}
EMU_API int emu_sigmoid_grad(int version, int dtype, int x4, const void* g, const void* y, void* dz, void* db,
                             int64_t rows, int64_t cols, int sm_count, void* workspace) {
  return dense_kernels::launch_sigmoid_grad(version, dtype, x4 != 0, g, y, dz, db, rows, cols, sm_count, workspace,
                                            nullptr);
}
EMU_API int64_t emu_sigmoid_grad_workspace(int version, int64_t rows, int64_t cols, int sm_count) {
  if (version == 0) version = dense_kernels::kDefaultGradVersion;
  return dense_kernels::sigmoid_grad_workspace_elements(version, rows, cols, sm_count);
}

// The autotuning candidates (dense_kernels::kTuneCandidates): how many; the "version" that runs
// candidate i through emu_gemm (float32 only); its shape into out[9] (BM, BN, BK, WM, WN, TM, TN,
// MINB, threads), returning 0, or 1 for no such candidate.
EMU_API int emu_tune_count() { return dense_kernels::kTuneCount; }
EMU_API int emu_tune_id(int i) { return dense_kernels::tune_id(i); }
EMU_API int emu_tune_shape(int i, int* out) {
  if (i < 0 || i >= dense_kernels::kTuneCount) return 1;
  const dense_kernels::WarpTile w = dense_kernels::kTuneCandidates[i];
  const int shape[] = {w.BM, w.BN, w.BK, w.WM, w.WN, w.TM, w.TN, w.MINB, dense_kernels::warp_threads(w)};
  std::memcpy(out, shape, sizeof(shape));
  return 0;
}
// What version 0 runs for this shape (dense_kernels::choose_version and its table); -1 for no such type.
EMU_API int emu_choose_version(int64_t M, int64_t N, int64_t K, int dtype, int sm_count) {
  if (!dense_kernels::valid_dtype(dtype)) return -1;
  return dense_kernels::choose_version(M, N, K, static_cast<dense_kernels::DType>(dtype), sm_count);
}
// Whether the library holds the entry of (kind, version, layout, dtype) (entries.cuh's registry):
// the tests hold every version's listed types (dense_kernels.h) against what was built.
EMU_API int emu_has_entry(int kind, int version, int layout, int dtype) {
  return dense_kernels::Registry::get().find(kind, version, layout, dtype) != nullptr;
}
// The order the blocks of a grid run in from now on: 0 as written (x fastest), any other seed a
// shuffled order of its own (emu::block_order). A result must not depend on it.
EMU_API void emu_set_block_order(unsigned seed) { emu::block_order_seed = seed; }

// A planted order-dependent kernel, for the test that the shuffled order can show a dependence:
// every block adds its row of `parts` (blocks × n) into `out` without atomics, in the order the
// blocks run, so the float sums round differently when that order changes.
namespace {
void add_in_block_order(const float* parts, float* out, int64_t n) {
  if (threadIdx.x != 0) return;
  for (int64_t i = 0; i < n; ++i) out[i] += parts[int64_t(blockIdx.x) * n + i];
}
}  // namespace
EMU_API int emu_planted_order_dependent(const float* parts, float* out, int64_t blocks, int64_t n) {
  return emu::launch(dim3{unsigned(blocks), 1, 1}, dim3{32, 1, 1}, [&] { add_in_block_order(parts, out, n); });
}

}  // extern "C"
