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
#define DENSE_LAUNCH_SMEM(fn, geo, bytes, ...)                                                                 \
  (emu::last_status = emu::launch(dim3{(geo).grid.x, (geo).grid.y, (geo).grid.z},                              \
                                  dim3{(geo).block.x, (geo).block.y, (geo).block.z}, [&] { fn(__VA_ARGS__); }, (bytes), \
                                  emu::launch_registers(reinterpret_cast<const void*>(fn))))
#define DENSE_LAUNCH_STATUS() emu::take_status()
// The emulated device's compute capability: sm_90 unless a test asks for another (emu_set_arch).
namespace emu {
inline int device_arch = 90;
}  // namespace emu
#define DENSE_DEVICE_ARCH() emu::device_arch
// cuTensorMapEncodeTiled, as the emulation models it (cuda/emulate/hopper.h): 0 or 1.
#define DENSE_TENSOR_MAP_2D(map, elem_bytes, base, dim0, dim1, stride_bytes, box0, box1, swizzle_bytes) \
  emu::tensor_map_encode_2d((map), (elem_bytes), (base), (dim0), (dim1), (stride_bytes), (box0), (box1), \
                            (swizzle_bytes) == 64 ? emu::kSwizzle64 : emu::kSwizzle128)
#define DENSE_INVALID 1  // an invalid request; 2 (emu::kBarrierNeverReached): a block could not finish
#define DENSE_NOT_BUILT 3  // an entry the build left out (every entry is built here: not reached)

#include "kernels/all.cuh"
#include "kernels/instructions.cuh"

// Registers a thread at launch, as ptxas counts them for the entry `fn`, where its kernel declares
// them (those that move registers with setmaxnreg: the block's pool is that count × its threads);
// 0 for the others. tests/test_hopper.py holds each constant against the static record.
namespace emu {
inline unsigned launch_registers(const void* fn) {
  constexpr std::pair<int, unsigned> declared[] = {{33, unsigned(kV33LaunchRegisters)}};
  for (const auto& [version, registers] : declared)
    for (int layout = 0; layout < 3; ++layout)
      for (int dtype = 0; dtype < dense_kernels::kDTypes; ++dtype)
        if (dense_kernels::Registry::get().find(dense_kernels::kGemmEntry, version, layout, dtype) == fn)
          return registers;
  return 0;
}
}  // namespace emu

#include "kernels/launch.cuh"
#include "units/tc_roof.cu"  // the tensor cores' roofs: micro-benchmarks, not GEMM entries

int dense_kernels::device_arch() { return emu::device_arch; }

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
// A resolved version's (emu_resolve): -1 for version 0, whose choice depends on the operands.
EMU_API int64_t emu_gemm_workspace(int version, int dtype, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (!dense_kernels::valid_dtype(dtype)) return -1;
  const auto t = static_cast<dense_kernels::DType>(dtype);
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
// dense_kernels::resolve_version, the one resolver, for these operands (their alignment decides
// whether TMA can take them) on a device of `arch` (0: the emulated device's, emu_set_arch): what the CUDA
// stage runs for `version` (kAten, -1, where version 0 has no confirmed kernel), or, with flags bit
// 0, what a launcher or the PTX stage runs (kernels only); bit 1 reads the predicted table. -2 for
// an unknown type or layout. emu_gemm_workspace is then asked about the result.
EMU_API int emu_resolve(int version, const char* layout, int dtype, const void* A, const void* B, int64_t M, int64_t N,
                        int64_t K, int sm_count, int arch, int flags) {
  if (!dense_kernels::valid_dtype(dtype) || dense_kernels::layout_index(layout) < 0) return -2;
  const auto t = static_cast<dense_kernels::DType>(dtype);
  if (arch <= 0) arch = emu::device_arch;
  return dense_kernels::resolve_version(
      version, M, N, K, t, sm_count, arch, dense_kernels::tma_compatible(layout, A, B, M, N, K, dense_kernels::dtype_bytes(t)),
      (flags & 1) != 0, (flags & 2) ? dense_kernels::kPredicted : dense_kernels::kConfirmed);
}
// What a launcher runs for `version` on this emulated device (emu_resolve, kernels only).
EMU_API int emu_resolve_version(int version, const char* layout, int dtype, const void* A, const void* B, int64_t M,
                                int64_t N, int64_t K, int sm_count) {
  return emu_resolve(version, layout, dtype, A, B, M, N, K, sm_count, emu::device_arch, 1);
}
// Whether the sigmoid-grad kernels are version 0's for this type (else the CUDA stage uses ATen's ops).
EMU_API int emu_grad_kernels_confirmed(int dtype) {
  return dense_kernels::valid_dtype(dtype) && dense_kernels::grad_kernels_confirmed(static_cast<dense_kernels::DType>(dtype));
}
// Whether `version` takes its operands through TMA (then they need rows of whole 16-byte multiples).
EMU_API int emu_uses_tma(int version) { return dense_kernels::uses_tma(version) && dense_kernels::is_version(version); }
// The compute capability the emulation plays (90: sm_90, whose Hopper versions version 0 chooses).
EMU_API void emu_set_arch(int arch) { emu::device_arch = arch; }
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


// ---- the matrix instructions alone, for tests/test_instructions.py ----
// The fragment tables as the emulation has them: table 0 mma.m16n8k16 A, 1 its B, 2 C/D (any
// m16n8), 3 m16n8k8.tf32 A, 4 its B, 5 ldmatrix (i = half + 2·trans). Returns 0, or 1 for no such entry.
EMU_API int emu_fragment(int table, int lane, int i, int* row, int* col) {
  static const int counts[] = {8, 4, 4, 4, 2, 4};
  if (table < 0 || table > 5 || lane < 0 || lane > 31 || i < 0 || i >= counts[table]) return 1;
  emu::RowCol p{};
  switch (table) {
    case 0: p = emu::frag_m16n8k16_a(lane, i); break;
    case 1: p = emu::frag_m16n8k16_b(lane, i); break;
    case 2: p = emu::frag_m16n8_c(lane, i); break;
    case 3: p = emu::frag_m16n8k8_tf32_a(lane, i); break;
    case 4: p = emu::frag_m16n8k8_tf32_b(lane, i); break;
    default: p = emu::ldmatrix_element(lane, i % 2, i >= 2);
  }
  *row = p.row;
  *col = p.col;
  return 0;
}
// One warp executes one mma on the given registers: a[32][4], b[32][2], c[32][4] -> d[32][4].
// kind 0: m16n8k16 bfloat16, 1: m16n8k16 float16, 2: m16n8k8 tf32.
EMU_API int emu_run_mma(int kind, const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  if (kind < 0 || kind > 2) return 1;
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
    const unsigned l = threadIdx.x;
    uint32_t ra[4], rb[2];
    float rc[4], rd[4];
    for (int i = 0; i < 4; ++i) ra[i] = a[4 * l + i], rc[i] = c[4 * l + i];
    for (int i = 0; i < 2; ++i) rb[i] = b[2 * l + i];
    if (kind == 0) mma_m16n8k16<__nv_bfloat16>(rd, ra, rb, rc);
    if (kind == 1) mma_m16n8k16<__half>(rd, ra, rb, rc);
    if (kind == 2) mma_m16n8k8_tf32(rd, ra, rb, rc);
    for (int i = 0; i < 4; ++i) d[4 * l + i] = rd[i];
  });
}
// One warp executes one ldmatrix.x{n}{.trans} from a shared buffer holding `image` (`bytes`
// bytes); lane l gives the row address image + offsets[l]; its n registers go to out[4·l...].
EMU_API int emu_run_ldmatrix(int n, int trans, const unsigned char* image, int bytes, const int* offsets,
                             uint32_t* out) {
  if (!(n == 1 || n == 2 || n == 4) || bytes < 0 || bytes > 8192) return 1;
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
    alignas(16) __shared__ unsigned char smem[8192];
    const unsigned l = threadIdx.x;
    for (int i = int(l); i < bytes; i += 32) smem[i] = image[i];
    __syncthreads();
    uint32_t r[4] = {};
    const void* row = smem + offsets[l];
    if (n == 1 && !trans) ldmatrix<1, false>(reinterpret_cast<uint32_t(&)[1]>(r), row);
    if (n == 1 && trans) ldmatrix<1, true>(reinterpret_cast<uint32_t(&)[1]>(r), row);
    if (n == 2 && !trans) ldmatrix<2, false>(reinterpret_cast<uint32_t(&)[2]>(r), row);
    if (n == 2 && trans) ldmatrix<2, true>(reinterpret_cast<uint32_t(&)[2]>(r), row);
    if (n == 4 && !trans) ldmatrix<4, false>(r, row);
    if (n == 4 && trans) ldmatrix<4, true>(r, row);
    for (int i = 0; i < 4; ++i) out[4 * l + i] = r[i];
  });
}
// One warp's cp.async, in two groups: lane l copies src[8l..8l+3] (group 1) and src[8l+4..8l+7]
// (group 2) into shared memory, and writes what it sees there into out (4 snapshots of 8 floats
// a lane): before any wait, after wait_group 1 (group 1 landed), after wait_group 0 (both), and
// the first snapshot again after the block's barrier (its own copies only: other lanes' copies
// are theirs to wait for).
EMU_API int emu_run_cp_async(const float* src, float* out) {
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
    alignas(16) __shared__ float smem[32 * 8];
    const unsigned l = threadIdx.x;
    for (int i = 0; i < 8; ++i) smem[8 * l + i] = -1;
    __syncthreads();
    cp_async16(&smem[8 * l], &src[8 * l]);
    cp_async_commit();
    cp_async16(&smem[8 * l + 4], &src[8 * l + 4]);
    cp_async_commit();
    for (int i = 0; i < 8; ++i) out[32 * l + i] = smem[8 * l + i];
    cp_async_wait<1>();
    for (int i = 0; i < 8; ++i) out[32 * l + 8 + i] = smem[8 * l + i];
    cp_async_wait<0>();
    for (int i = 0; i < 8; ++i) out[32 * l + 16 + i] = smem[8 * l + i];
    __syncthreads();
    for (int i = 0; i < 8; ++i) out[32 * l + 24 + i] = smem[8 * ((l + 1) % 32) + i];
  });
}
// cvt.rna.tf32.f32 on n values.
EMU_API void emu_cvt_rna_tf32(const float* in, uint32_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cvt_rna_tf32(in[i]);
}
// The 16-bit types' conversions (cuda_emu.h), for the tests against torch's on every pattern:
// kind 0 bfloat16, 1 float16; to_float: bits -> float32, else float32 -> bits (to nearest even).
EMU_API void emu_convert(int kind, int to_float, const void* in, void* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (to_float) {
      const uint16_t b = static_cast<const uint16_t*>(in)[i];
      static_cast<float*>(out)[i] = kind == 0 ? __bfloat162float(__nv_bfloat16{b}) : __half2float(__half{b});
    } else {
      const float f = static_cast<const float*>(in)[i];
      static_cast<uint16_t*>(out)[i] = kind == 0 ? __float2bfloat16(f).__x : __float2half(f).__x;
    }
  }
}


// ---- the tensor cores' roofs (cuda/tensor_cores/roof.cuh), for tests/test_roof.py ----
// dense_kernels::launch_roof: kind 0 mma.sync, 1 wgmma; `blocks` blocks of kRoofThreads threads,
// each writing one float of `out`. 0, 1 for an invalid request, 2 when a block could not finish.
EMU_API int emu_roof(int kind, int blocks, int iterations, float* out) {
  return dense_kernels::launch_roof(kind, blocks, iterations, out, nullptr);
}
// out[2]: a block's threads and the FLOPs of one block's iteration; 0, or 1 for no such kind.
EMU_API int emu_roof_info(int kind, int64_t* out) {
  if (kind < 0 || kind >= dense_kernels::kRoofKinds) return 1;
  out[0] = dense_kernels::kRoofThreads;
  out[1] = dense_kernels::roof_flops(kind);
  return 0;
}


// ---- Hopper's instructions alone, for tests/test_hopper.py ----
// wgmma's accumulator table: the (row, col) of register i of thread t (0-127) of the warpgroup.
EMU_API void emu_wgmma_fragment(int thread, int i, int* row, int* col) {
  const emu::RowCol p = emu::frag_wgmma_d(thread, i);
  *row = p.row;
  *col = p.col;
}
EMU_API uint32_t emu_swizzle(uint32_t addr, int mode) { return emu::swizzled(addr, mode); }
// out[5]: start, LBO, SBO (bytes), base offset, swizzle mode.
EMU_API void emu_descriptor_decode(uint64_t desc, uint32_t* out) {
  const emu::Descriptor d = emu::decode_descriptor(desc);
  const uint32_t v[5] = {d.start, d.lbo, d.sbo, uint32_t(d.base_offset), uint32_t(d.mode)};
  std::memcpy(out, v, sizeof(v));
}
// The window address of operand element (mn, k), or 0xFFFFFFFF where the layout is not modelled.
EMU_API uint32_t emu_operand_address(uint64_t desc, int mn_major, int mn, int k, int elem_bytes) {
  uint32_t addr = 0;
  return emu::operand_address(emu::decode_descriptor(desc), mn_major != 0, mn, k, elem_bytes, addr) ? addr : 0xffffffffu;
}
// One warpgroup issues one wgmma (m64nNk16 bf16/f16, or m64n128k8 tf32: kind 0 bf16, 1 f16, 2
// tf32) on a shared window holding `image` (the descriptors' addresses are offsets into it), its
// 128 threads' accumulators c[128][N/2] in, d[128][N/2] out after the wait.
EMU_API int emu_run_wgmma(int kind, int n, int trans_a, int trans_b, uint64_t desc_a, uint64_t desc_b,
                          const unsigned char* image, int bytes, const float* c, float* d) {
  if (kind < 0 || kind > 2 || !(n == 32 || n == 128 || n == 256) || (kind == 2 && n != 128) || bytes > 65536)
    return 1;
  return emu::launch(dim3{1, 1, 1}, dim3{128, 1, 1}, [&] {
    unsigned char* window = emu::dynamic_shared();
    const unsigned t = threadIdx.x;
    shared_window(window);
    if (t == 0) std::memcpy(window, image, size_t(bytes));
    fence_proxy_async();  // the generic stores above, visible to wgmma's reads
    __syncthreads();
    float acc[128];
    for (int i = 0; i < n / 2; ++i) acc[i] = c[t * (n / 2) + i];
    wgmma_fence();
    if (kind == 2) {
      wgmma_m64n128k8_tf32(reinterpret_cast<float(&)[64]>(acc), desc_a, desc_b, 1);
    } else {
      auto issue = [&](auto tag) {
        using T = decltype(tag);
        if (n == 32 && !trans_a && !trans_b) wgmma_m64k16<32, T, 0, 0>(reinterpret_cast<float(&)[16]>(acc), desc_a, desc_b, 1);
        if (n == 32 && trans_a && !trans_b) wgmma_m64k16<32, T, 1, 0>(reinterpret_cast<float(&)[16]>(acc), desc_a, desc_b, 1);
        if (n == 32 && !trans_a && trans_b) wgmma_m64k16<32, T, 0, 1>(reinterpret_cast<float(&)[16]>(acc), desc_a, desc_b, 1);
        if (n == 32 && trans_a && trans_b) wgmma_m64k16<32, T, 1, 1>(reinterpret_cast<float(&)[16]>(acc), desc_a, desc_b, 1);
        if (n == 128 && !trans_a && !trans_b) wgmma_m64k16<128, T, 0, 0>(reinterpret_cast<float(&)[64]>(acc), desc_a, desc_b, 1);
        if (n == 128 && trans_a && !trans_b) wgmma_m64k16<128, T, 1, 0>(reinterpret_cast<float(&)[64]>(acc), desc_a, desc_b, 1);
        if (n == 128 && !trans_a && trans_b) wgmma_m64k16<128, T, 0, 1>(reinterpret_cast<float(&)[64]>(acc), desc_a, desc_b, 1);
        if (n == 128 && trans_a && trans_b) wgmma_m64k16<128, T, 1, 1>(reinterpret_cast<float(&)[64]>(acc), desc_a, desc_b, 1);
        if (n == 256) wgmma_m64k16<256, T, 0, 0>(acc, desc_a, desc_b, 1);
      };
      if (kind == 0) issue(__nv_bfloat16{});
      else issue(__half{});
    }
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < n / 2; ++i) d[t * (n / 2) + i] = acc[i];
  }, 65536 + 1024);
}
// One TMA copy of the box at (c0, c1) of a 2-D tensor (dim0 contiguous, rows stride_bytes apart)
// into a 1024-aligned shared buffer, completed through an mbarrier; the buffer's `bytes` back in
// `out`. 0, 1 for a tensor map the rules refuse, or the launch's error.
EMU_API int emu_run_tma(int elem_bytes, const void* base, uint64_t dim0, uint64_t dim1, uint64_t stride_bytes,
                        uint32_t box0, uint32_t box1, int swizzle, int c0, int c1, unsigned char* out, int bytes) {
  CUtensorMap map;
  if (emu::tensor_map_encode_2d(&map, uint32_t(elem_bytes), base, dim0, dim1, stride_bytes, box0, box1, swizzle) != 0)
    return 1;
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] {
    unsigned char* window = emu::dynamic_shared();
    shared_window(window);
    uint64_t* bar = reinterpret_cast<uint64_t*>(window + 32768);
    if (threadIdx.x == 0) {
      mbarrier_init(bar, 1);
      fence_barrier_init();  // the initialisation, visible to the copy's complete_tx
      mbarrier_arrive_expect_tx(bar, box0 * box1 * uint32_t(elem_bytes));
      tma_load_2d(window, &map, c0, c1, bar);
    }
    __syncthreads();
    mbarrier_wait(bar, 0);
    if (threadIdx.x == 0) std::memcpy(out, window, size_t(bytes));
  }, 32768 + 1024);
}

// Hopper's fence and register rules broken one at a time, for tests/test_hopper.py (its planted
// kernels take a build each; this takes none): a 256-thread block, warpgroup 1 storing A (64×16)
// and B (32×16, bfloat16) that warpgroup 0's wgmma m64n32k16 reads, twice. `plant`: 0 nothing;
// 1 no fence.proxy.async after the stores; 2 the fence after the mbarrier arrival that orders the
// stores before the wgmma; 3 none (the same, fence before arrival: correct); 4 no wgmma.fence;
// 5 an accumulator written between the two wgmma's with no wgmma.fence; 6 a TMA copy on an
// mbarrier no fence.mbarrier_init made visible; 7 arithmetic on an accumulator in flight;
// 8 setmaxnreg.inc beyond the pool (64 registers a thread at launch; warpgroup 1 gives 32 back).
// Returns the launch's status.
EMU_API int emu_fence_probe(int plant) {
  alignas(16) static const unsigned short src[64 * 64] = {};
  CUtensorMap map;
  if (emu::tensor_map_encode_2d(&map, 2, src, 64, 64, 128, 64, 8, emu::kSwizzle128) != 0) return 1;
  return emu::launch(dim3{1, 1, 1}, dim3{256, 1, 1}, [&] {
    unsigned char* w = emu::dynamic_shared();
    const unsigned t = threadIdx.x;
    if (t == 0) std::memset(w, 0, 32768);
    shared_window(w);
    uint64_t* ordered = reinterpret_cast<uint64_t*>(w + 16384);
    uint64_t* landed = ordered + 1;
    if (t == 0) {
      mbarrier_init(ordered, 128);
      mbarrier_init(landed, 1);
      if (plant != 6) fence_barrier_init();
    }
    __syncthreads();
    if (t == 0) {  // 8 rows of 64 bfloat16 by TMA
      mbarrier_arrive_expect_tx(landed, 8 * 128);
      tma_load_2d(w + 32768, &map, 0, 0, landed);
    }
    mbarrier_wait(landed, 0);
    if (t >= 128) {  // warpgroup 1: A and B, 1.0 everywhere, then the fence and the arrival
      for (unsigned i = t - 128; i < 12288 / 16; i += 128)
        reinterpret_cast<uint4*>(w)[i] = uint4{0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
      if (plant != 1 && plant != 2) fence_proxy_async();
      mbarrier_arrive(ordered);
      if (plant == 2) fence_proxy_async();
      setmaxnreg_dec<32>();
      return;
    }
    mbarrier_wait(ordered, 0);
    float acc[16] = {};
    const uint64_t da = smem_desc(w, 16, 1024, kSwizzle128B), db = smem_desc(w + 8192, 16, 1024, kSwizzle128B);
    if (plant != 4) wgmma_fence();
    wgmma_m64k16<32, __nv_bfloat16, 0, 0>(acc, da, db, 1);
    wgmma_commit();
    if (plant == 7) {
      volatile float peek = acc[0] * 2.0f;
      (void)peek;
    }
    wgmma_wait<0>();
    acc[1] = 0.0f;  // another instruction writes an accumulator: the next wgmma needs a wgmma.fence
    if (plant != 5) wgmma_fence();
    wgmma_m64k16<32, __nv_bfloat16, 0, 0>(acc, da, db, 1);
    wgmma_commit();
    wgmma_wait<0>();
    if (plant == 8) setmaxnreg_inc<104>();  // 40 more a thread: 5120, where warpgroup 1 gave 4096
    else setmaxnreg_inc<96>();
  }, 65536, 64);
}

}  // extern "C"


// ---- the tensor cores' accumulation (cuda/emulate/tc_accumulate.h), for tests/test_tc_accumulation.py ----
#include "tensor_cores/accumulation_probe.cuh"

extern "C" {

// The model mma and wgmma sum with from now on (emu::Accumulation: 0 the exact sum, 1 the H100's
// block FMA); returns the previous one, or -1 (and changes nothing) for no such model.
EMU_API int emu_set_accumulation(int model) {
  if (model < 0 || model >= emu::kAccumulationModels) return -1;
  const int previous = emu::tc_accumulation;
  emu::tc_accumulation = model;
  return previous;
}
// One block C + Σ a_k·b_k (k < n ≤ 16, the operands' values as doubles) as `model` sums it, for
// `format` (emu::TcFormat); NaN for an invalid request.
EMU_API float emu_tc_block(int model, int format, float c, const double* a, const double* b, int n) {
  if (model < 0 || model >= emu::kAccumulationModels || format < 0 || format > emu::kTcTf32 || n < 0 || n > 16)
    return std::nanf("");
  return model == emu::kAccumulateH100 ? emu::tc_block_h100(c, a, b, n, format) : emu::tc_block_exact(c, a, b, n);
}
// The probe (cuda/tensor_cores/accumulation_probe.cuh): `vectors` blocks of probe `kind`, as
// accumulation_probe.cu's tc_accumulation_run runs them on a GPU. 0, 1 for an invalid request, 2
// when a block could not finish.
EMU_API int emu_tc_accumulation_run(int kind, int vectors, const uint32_t* a, const uint32_t* b, const float* c,
                                    float* out) {
  if (kind < 0 || kind >= dense_kernels::kProbeKinds || vectors < 1) return 1;
  const unsigned threads = unsigned(dense_kernels::probe_threads(kind));
  return emu::launch(dim3{unsigned(vectors), 1, 1}, dim3{threads, 1, 1}, [&] {
    switch (kind) {
      case dense_kernels::kProbeMmaBf16: probe_mma16<__nv_bfloat16>(a, b, c, out); break;
      case dense_kernels::kProbeMmaF16: probe_mma16<__half>(a, b, c, out); break;
      case dense_kernels::kProbeMmaTf32: probe_mma_tf32(a, b, c, out); break;
      case dense_kernels::kProbeWgmmaBf16: probe_wgmma<dense_kernels::kProbeWgmmaBf16>(a, b, c, out); break;
      case dense_kernels::kProbeWgmmaF16: probe_wgmma<dense_kernels::kProbeWgmmaF16>(a, b, c, out); break;
      default: probe_wgmma<dense_kernels::kProbeWgmmaTf32>(a, b, c, out);
    }
  });
}

}  // extern "C"

// The optional event trace of the Hopper instructions (trace.h): emu_trace(1) clears it and turns
// it on, emu_trace(0) turns it off; emu_trace_count() events were recorded, and emu_trace_read
// copies up to n of them into out[8·n] (seq, step, block x, block y, thread, kind, barrier's shared
// offset, value), returning how many it copied.
extern "C" {
EMU_API void emu_trace(int on) {
  std::lock_guard<std::mutex> lock(emu::hopper().mutex);
  emu::TraceState& t = emu::trace_state();
  if (on) {
    t.events.clear();
    t.step = 0;
  }
  t.on.store(on != 0);
}
EMU_API int64_t emu_trace_count() {
  std::lock_guard<std::mutex> lock(emu::hopper().mutex);
  return int64_t(emu::trace_state().events.size());
}
EMU_API int64_t emu_trace_read(int64_t* out, int64_t n) {
  std::lock_guard<std::mutex> lock(emu::hopper().mutex);
  const std::vector<emu::TraceEvent>& events = emu::trace_state().events;
  const int64_t count = std::min<int64_t>(n, int64_t(events.size()));
  for (int64_t i = 0; i < count; ++i) {
    const emu::TraceEvent& e = events[size_t(i)];
    const int64_t row[8] = {e.seq, e.step, e.block_x, e.block_y, e.thread, e.kind, int64_t(e.bar), e.value};
    std::memcpy(out + 8 * i, row, sizeof(row));
  }
  return count;
}
}  // extern "C"
