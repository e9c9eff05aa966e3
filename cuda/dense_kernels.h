// What the CUDA binding (cuda/binding.cpp), the PTX loader (ptx/loader.cpp) and the CPU emulation
// (cuda/emulate/emulate.cpp) all need to know about the kernels in cuda/kernels/: their names,
// their parameters and the launch geometry of each. Plain C++, no CUDA headers.
//
// Checked without a GPU by: python -m pytest tests/test_gpu_sources.py tests/test_emulate.py
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;

namespace dense_kernels {

// Every GEMM entry computes C[M×N] = op(A)[M×K] · op(B)[K×N], then an epilogue:
//   kPlain:       C = acc
//   kBiasSigmoid: C = sigmoid(acc + bias[n])   (bias may be null)
// Layouts (row-major storage):
//   "nt": A is M×K, B is given as N×K  (forward:  y  = x · Wᵀ)
//   "nn": A is M×K, B is K×N           (backward: dx = dz · W)
//   "tn": A is given as K×M, B is K×N  (backward: dW = dzᵀ · x)
// Entry names: dense_gemm_v{N}_{nt|nn|tn}_{f32|f64|bf16|f16} (extern "C", the same in the PTX),
// and for the autotuning candidates (below) dense_gemm_tune{I}_{nt|nn|tn}_f32.
// Parameters: (const T* A, const T* B, T* C, const T* bias, int64 M, int64 N, int64 K, int epilogue)
enum Epilogue : int { kPlain = 0, kBiasSigmoid = 1 };

// The element types. bfloat16 and float16 are storage types only: every kernel converts them to
// float32 as it loads them and accumulates in float32 (acc_bytes), as cuBLAS and nn.Linear do; the
// result is rounded to the storage type once, when it is stored.
enum DType : int { kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3 };
constexpr int kDTypes = 4;
constexpr const char* kDTypeNames[kDTypes] = {"f32", "f64", "bf16", "f16"};
constexpr bool valid_dtype(int t) { return t >= 0 && t < kDTypes; }
constexpr int dtype_bytes(DType t) { return t == kF64 ? 8 : t == kF32 ? 4 : 2; }
constexpr int acc_bytes(DType t) { return t == kF64 ? 8 : 4; }  // the accumulator's: float64 or float32

// The GEMM progression, one idea per version (cuda/kernels/v{N}_*.cuh; cuda/README.md), and the
// element types each is built for ("dtypes", names as in kDTypeNames). v1 to v10 are the float32
// and float64 lesson; v11's template (and v12, an instance of it) also loads bfloat16 and float16,
// converting on the way into shared memory: the CUDA-core baseline of the tensor-core versions.
// cuda/catalog.py reads this table (and the candidates below) for every Python script.
struct VersionInfo {
  int id;
  const char* dtypes;
  const char* idea;
};
constexpr VersionInfo kVersionInfo[] = {
    {0, "f32 f64 bf16 f16", "automatic: cuda/gemm_choice.h's entry for the shape and type (float32: v8, or v9 for a small batch)"},
    {1, "f32 f64", "naive, uncoalesced: one thread per output, a warp's threads walk down a column"},
    {2, "f32 f64", "naive, coalesced: a warp's threads take neighbouring columns"},
    {3, "f32 f64", "shared-memory tiles: a 32x32 tile of A and of B staged once, read 32 times"},
    {4, "f32 f64", "1-D register blocking: each thread computes a column of 8 outputs"},
    {5, "f32 f64", "2-D register blocking: each thread computes an 8x8 (f64: 4x4) block of outputs"},
    {6, "f32 f64", "vectorised: 128-bit global loads, A's tile stored transposed, 128-bit shared loads"},
    {7, "f32 f64", "warp tiling: a warp's threads own one compact sub-tile (fewer shared-memory bytes per step)"},
    {8, "f32 f64", "double buffering: the next k-step's tiles load while this one computes (cp.async on sm_80+)"},
    {9, "f32 f64", "split-K for small batches: the k loop split over blocks until every SM has work"},
    {10, "f32 f64", "padded tiles: rows 16 bytes longer, so the transposing store hits 32 different banks"},
    {11, "f32 f64 bf16 f16", "warp tiling in pieces (SGEMM_CUDA's kernel 10): one template for every tile shape"},
    {12, "f32 f64 bf16 f16", "skinny batches: a 32-row tile and K split over every SM, W streamed once"},
    // Tensor cores (cuda/tensor_cores/, chapter 5).
    {21, "bf16 f16", "tensor cores, one warp, one instruction: mma.sync m16n8k16 on fragments loaded from global memory"},
    {22, "bf16 f16", "shared memory and ldmatrix: 64x64 tiles staged once, fragments by ldmatrix.x4 (.trans where needed)"},
    {23, "bf16 f16", "the same tiles XOR-swizzled: an ldmatrix's 8 rows in 8 different groups of banks"},
    {24, "bf16 f16", "a block of 8 warps, 64x32 warp tiles, a 3-stage cp.async pipeline, the epilogue fused"},
    {25, "f32", "TF32: mma.sync m16n8k8 on operands rounded by cvt.rna.tf32.f32 (10 bits of mantissa)"},
    {26, "f32", "split-TF32: each operand a TF32 big part and a TF32 remainder, three mma's for float32 accuracy"},
    // Hopper (sm_90a): warpgroup MMA, TMA, mbarriers (cuda/tensor_cores/, the same chapter)
    {31, "bf16 f16", "wgmma: one warpgroup, m64n128k16 on operands in shared memory named by matrix descriptors"},
    {32, "bf16 f16", "TMA: tiles copied by the copy engine, 128B-swizzled, into a ring of 4 stages with mbarriers"},
    {33, "bf16 f16", "warp specialization: a producer warpgroup issues TMA, two consumers wgmma m64n256k16, setmaxnreg"},
    {34, "f32", "split-TF32 on wgmma: TMA'd float32 tiles split into TF32 big, small parts, three wgmma m64n128k8"},
    {35, "bf16 f16", "small batches: W as wgmma's A and the batch as its B (m64n32k16), K split over every SM"},
};
constexpr int kVersionCount = sizeof(kVersionInfo) / sizeof(kVersionInfo[0]);
constexpr int kVersions = 12;  // the CUDA-core progression, versions 1 to kVersions
constexpr int kMaxVersionId = 128;  // version ids (and candidates' tune_id) stay below it

// Whether `version` is built for element type t: its dtypes name t's suffix as a word.
constexpr bool names_word(const char* list, const char* word) {
  for (int i = 0; list[i]; ++i) {
    if (i > 0 && list[i - 1] != ' ') continue;
    int j = 0;
    while (word[j] && list[i + j] == word[j]) ++j;
    if (!word[j] && (list[i + j] == ' ' || list[i + j] == 0)) return true;
  }
  return false;
}
constexpr bool is_version(int version) {
  for (const VersionInfo& v : kVersionInfo)
    if (v.id == version) return true;
  return false;
}
constexpr bool version_builds(int version, DType t) {
  for (const VersionInfo& v : kVersionInfo)
    if (v.id == version) return names_word(v.dtypes, kDTypeNames[t]);
  return false;
}
constexpr int kDefaultVersion = 0;  // 0: choose by shape and SM count (see resolve_version)

// The shapes below take `element_bytes`, the accumulator's size (acc_bytes(dtype)): the registers
// and shared memory a tile needs are the accumulator's, so bfloat16 and float16 take float32's tiles.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Geometry {
  Dim3 grid, block;
};

// Warp tiling in pieces (v11's template; v12 and the autotuning candidates are instances of it):
// the block's BM×BN tile of C is cut into warp tiles of WM×WN, K into steps of BK; a warp's 32
// lanes form the kWarpLanesM × kWarpLanesN grid of v7, each lane owning a TM×TN piece, and the
// warp covers its tile in (WM / (8·TM)) × (WN / (4·TN)) steps. A lane thus holds (WM/8)×(WN/4)
// outputs, and a block has (BM/WM)·(BN/WN) warps. MINB: the blocks per SM asked of the compiler
// (__launch_bounds__'s second argument, which caps the registers at 65536 / (MINB · threads)).
struct WarpTile {
  int BM, BN, BK, WM, WN, TM, TN, MINB;
};
// Warp tiling (v7+): a warp's 32 lanes form an 8×4 grid, so in v7 to v10 a warp owns (8·TM)×(4·TN) of C.
constexpr int kWarpLanesM = 8, kWarpLanesN = 4;
constexpr bool is_warp_tiled(int version) { return version == 11 || version == 12; }
constexpr WarpTile warp_tile(int version, int element_bytes) {
  // v11: SGEMM_CUDA's kernel 10 (128×128, 64×64 per warp in 1×4 steps of 64×16, 128 threads) with
  // k-steps of 8: with its 16, ptxas 13.0 needs 255 registers and spills 88 bytes in the nn layout.
  // float64 halves the block and warp tiles, as from v5 on.
  if (version == 11) return element_bytes == 4 ? WarpTile{128, 128, 8, 64, 64, 8, 4, 1}
                                               : WarpTile{64, 64, 8, 32, 32, 4, 4, 1};
  // v12: a batch of 32 in one tile's rows, 4 warps side by side along n, 4×8 outputs a lane; as
  // many blocks per SM as registers allow without spilling: float32 4 (at most 128 registers;
  // asked for 5, ptxas 13.0 spills 60 bytes in the nt layout), float64 2 (asked for 3, it spills
  // 192 bytes in the nn layout).
  if (version == 12) return WarpTile{32, 128, 16, 32, 32, 4, 8, element_bytes == 4 ? 4 : 2};
  return WarpTile{0, 0, 0, 0, 0, 0, 0, 1};
}
constexpr int warp_threads(WarpTile w) { return (w.BM / w.WM) * (w.BN / w.WN) * 32; }

// Tile of C per block (BM×BN), k-step (BK) and outputs per thread (TM×TN; in the warp-tiled
// versions a lane's outputs, all its pieces together). The kernels are instantiated from these
// numbers. float64 halves the 2-D tiles: 8×8 doubles per thread need about twice the registers
// of 8×8 floats.
struct Tile {
  int BM, BN, BK, TM, TN;
};
constexpr Tile tile_of(WarpTile w) { return {w.BM, w.BN, w.BK, w.WM / kWarpLanesM, w.WN / kWarpLanesN}; }
constexpr Tile tile(int version, int element_bytes) {
  switch (version) {
    case 1: return {32, 8, 1, 1, 1};    // block 32×8 threads, x along m
    case 2: return {8, 32, 1, 1, 1};    // block 32×8 threads, x along n
    case 3: return {32, 32, 32, 1, 1};  // block 32×32 threads
    case 4: return {64, 64, 8, 8, 1};   // 512 threads
    case 11:
    case 12: return tile_of(warp_tile(version, element_bytes));
    // tensor cores: TM×TN is a lane's accumulators, their count (a lane holds them in pieces)
    case 21: return {32, 16, 16, 2, 2};   // 4 warps, a 16×8 tile each
    case 22:
    case 23: return {64, 64, 64, 8, 4};   // 4 warps of 32×32
    case 24: return {128, 128, 32, 8, 8};  // 8 warps of 64×32
    case 25:
    case 26: return {128, 128, 16, 8, 8};
    case 31:
    case 32: return {64, 128, 64, 8, 8};   // one warpgroup
    case 33: return {128, 256, 64, 8, 16};  // (threads(): 3 warpgroups, one of them the producer)
    case 34: return {64, 128, 32, 8, 8};   // one warpgroup, k-steps of 32 floats
    case 35: return {32, 64, 64, 4, 4};     // one warpgroup; the tile of C is 32 rows by 64
    default: return element_bytes == 4 ? Tile{128, 128, 8, 8, 8} : Tile{64, 64, 8, 4, 4};  // 256 threads
  }
}
// The same numbers as compile-time constants, for the kernels (device code cannot call tile()).
template <int Version, int Bytes>
struct TileOf {
  static constexpr Tile t = tile(Version, Bytes);
  static constexpr int BM = t.BM, BN = t.BN, BK = t.BK, TM = t.TM, TN = t.TN;
};
template <int Version, int Bytes>
struct WarpTileOf {
  static constexpr WarpTile w = warp_tile(Version, Bytes);
  static constexpr int BM = w.BM, BN = w.BN, BK = w.BK, WM = w.WM, WN = w.WN, TM = w.TM, TN = w.TN, MINB = w.MINB;
};
// Hopper's versions that take their operands through TMA: their entries take the operands' tensor
// maps (made by the launcher) instead of pointers, and dynamic shared memory of tma_smem_bytes.
constexpr bool uses_tma(int version) { return version >= 32 && version <= 35; }
// Versions whose kernels run on sm_90a only (elsewhere they refuse to launch, and version 0 does
// not choose them).
constexpr bool needs_sm90a(int version) { return version >= 31 && version <= 35; }
// The dynamic shared memory of a TMA version: its ring of stages, 16 bytes of mbarriers a stage,
// and 1024 bytes to round the start up to the swizzles' period.
constexpr int tma_stages(int version) { return version == 34 ? 3 : 4; }
constexpr int tma_stage_bytes(int version) {
  return version == 33 ? (128 + 256) * 64 * 2
         : version == 34 ? (64 + 128) * 32 * 4
         : version == 35 ? 2 * 64 * 64 * 2
                         : (64 + 128) * 64 * 2;
}
// v34 also keeps its split tiles: big, small and finite big, of both operands.
constexpr size_t tma_smem_bytes(int version) {
  return size_t(tma_stages(version)) * (tma_stage_bytes(version) + 16) + (version == 34 ? 3 * (64 + 128) * 32 * 4 : 0) +
         1024;
}
constexpr int threads(int version, int element_bytes) {
  if (version == 33) return 384;
  return (tile(version, element_bytes).BM / tile(version, element_bytes).TM) *
         (tile(version, element_bytes).BN / tile(version, element_bytes).TN);
}

// Autotuning (SGEMM_CUDA's kernel 9): tile shapes of v11's template, each compiled as an entry of
// its own, dense_gemm_tune{I}_{nt|nn|tn}_f32 (cuda/units/tune.cu), and launched as the
// "version" tune_id(I) by launch_gemm (on the GPU, in the emulation, by cuda/bench_gpu.py
// candidates). float32 only: the goals they are timed for are float32's, and float64 would need
// shapes of its own (halved, as v5 on halve theirs). Each candidate passes the emulated checks
// and compiles for sm_90 without spills (tests/test_emulate.py, tests/test_gpu_sources.py). Candidates
// 0 and 3 ask for 2 blocks of 256 threads (at most 128 registers): without it ptxas 13.0 gives them
// more in some layout (0: 130 in nn; 3: 129 in nt, 143 in tn), and one block per SM there. Left
// out, because ptxas 13.0 spills them on sm_90 (bytes of spill stores + loads, nt/nn/tn):
//   {128, 128, 16, 64, 64, 8, 4, 1}  SGEMM_CUDA's kernel 10 as it is: 255 registers, 0/88/0
//   {128, 128, 8, 64, 32, 8, 8, 3}   v10's shape capped for 3 blocks (80 registers): 952/930/1186
//   {128, 128, 16, 64, 32, 8, 8, 2}  the same with k-steps of 16, capped for 2 blocks: 260/272/0
//   {128, 128, 8, 64, 64, 8, 4, 3}   v11's shape capped for 3 blocks (168 registers): 648/810/936
// The one list of candidates: index, then the WarpTile fields (BM, BN, BK, WM, WN, TM, TN, MINB).
// The kernels' entries (cuda/units/tune.cu), the emulation and cuda/catalog.py all expand it.
#define DENSE_TUNE_CANDIDATES(X)                                                                       \
  X(0, 128, 128, 8, 64, 32, 8, 8, 2)  /* v10's shape: 256 threads, 8×8 a lane in one piece */           \
  X(1, 128, 128, 16, 64, 32, 8, 8, 1) /* the same with k-steps of 16: half the barriers per FMA */      \
  X(2, 128, 128, 16, 64, 32, 4, 4, 1) /* 8×8 a lane in 2×2 pieces of 4×4, k-steps of 16 */              \
  X(3, 128, 128, 8, 32, 64, 4, 8, 2)  /* warp tiles 32×64 (4×16 a lane in 1×2 pieces) */                \
  X(4, 128, 64, 8, 32, 32, 4, 4, 3)   /* fewer registers, more blocks: 4×8 a lane, 3 blocks of 256 */   \
  X(5, 128, 64, 16, 64, 32, 8, 8, 1)  /* half the tile: 128 threads of 8×8 */                          \
  X(6, 64, 128, 16, 32, 64, 4, 8, 1)  /* the same, turned: 64 rows, 4×16 a lane */                      \
  X(7, 128, 256, 8, 64, 64, 8, 8, 1)  /* a wide tile: 256 threads of 8×16 */
#define DENSE_TUNE_SHAPE(I, BM, BN, BK, WM, WN, TM, TN, MINB) WarpTile{BM, BN, BK, WM, WN, TM, TN, MINB},
constexpr WarpTile kTuneCandidates[] = {DENSE_TUNE_CANDIDATES(DENSE_TUNE_SHAPE)};
#undef DENSE_TUNE_SHAPE
constexpr int kTuneCount = sizeof(kTuneCandidates) / sizeof(kTuneCandidates[0]);
constexpr int kTuneBase = 100;  // launch_gemm's "version" tune_id(I) is candidate I
constexpr int tune_id(int candidate) { return kTuneBase + candidate; }
constexpr bool is_tune(int version) { return version >= kTuneBase && version < kTuneBase + kTuneCount; }
template <int I>
struct TuneShape {
  static constexpr WarpTile w = kTuneCandidates[I];
  static constexpr int BM = w.BM, BN = w.BN, BK = w.BK, WM = w.WM, WN = w.WN, TM = w.TM, TN = w.TN, MINB = w.MINB;
};

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// v9: how many slices of the k loop, so that tiles × slices covers every SM once, each slice
// keeping at least kMinSliceK of K (below that the reduction costs more than it spreads).
constexpr int64_t kMinSliceK = 128;
inline int splitk_slices(int64_t M, int64_t N, int64_t K, int element_bytes, int sm_count) {
  const Tile t = tile(9, element_bytes);
  const int64_t tiles = int64_t(ceil_div(M, t.BM)) * ceil_div(N, t.BN);
  if (tiles <= 0 || tiles >= sm_count) return 1;
  int64_t s = (sm_count + tiles - 1) / tiles;
  if (s > K / kMinSliceK) s = K / kMinSliceK;
  return s < 1 ? 1 : static_cast<int>(s);
}

// v12: slices of K so that tiles × slices fills every SM with the MINB blocks it holds, each slice
// at least kMinSliceK deep, then as few slices as give each one the same whole number of k-steps
// (none left empty). At B = 32, I = O = 4096 on 132 SMs (float32): 32 tiles × 16 slices of 16
// k-steps of 16: 512 blocks, where 528 fit.
inline int skinny_slices(int64_t M, int64_t N, int64_t K, int element_bytes, int sm_count) {
  const WarpTile w = warp_tile(12, element_bytes);
  const int64_t tiles = int64_t(ceil_div(M, w.BM)) * ceil_div(N, w.BN), target = int64_t(sm_count) * w.MINB;
  if (tiles <= 0 || tiles >= target) return 1;
  int64_t s = (target + tiles - 1) / tiles;
  if (s > K / kMinSliceK) s = K / kMinSliceK;
  if (s <= 1) return 1;
  const int64_t steps = (K + w.BK - 1) / w.BK, per_slice = (steps + s - 1) / s;
  return static_cast<int>((steps + per_slice - 1) / per_slice);
}

// v35: slices of K so that tiles × slices puts two blocks on every SM (one warpgroup and 64 KiB of
// shared memory each: three fit), each slice at least two k-steps of 64, the steps spread evenly.
// At B = 32, I = O = 4096 on 132 SMs: 64 tiles of 64 × 32, 4 slices of 16 steps, 256 blocks.
inline int hopper_slices(int64_t M, int64_t N, int64_t K, int sm_count) {
  const int64_t tiles = int64_t(ceil_div(N, 64)) * ceil_div(M, 32), steps = (K + 63) / 64;
  int64_t s = tiles > 0 ? 2 * int64_t(sm_count) / tiles : 1;
  if (s > steps / 2) s = steps / 2;
  if (s <= 1) return 1;
  const int64_t per_slice = (steps + s - 1) / s;
  return static_cast<int>((steps + per_slice - 1) / per_slice);
}

inline int gemm_slices(int version, int element_bytes, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (version == 35) return hopper_slices(M, N, K, sm_count);
  if (version == 9) return splitk_slices(M, N, K, element_bytes, sm_count);
  if (version == 12) return skinny_slices(M, N, K, element_bytes, sm_count);
  return 1;
}

// Version 0 picks from committed tables by class of shape (cuda/gemm_choice.h):
enum ShapeClass : int {
  kFillsGpu = 0,    // v8's 128×128 tiles cover every SM, or K is too shallow to split
  kSmallBatch = 1,  // fewer of those tiles than SMs, and K deep enough to split (v9 splits it)
};
inline ShapeClass shape_class(int64_t M, int64_t N, int64_t K, int element_bytes, int sm_count) {
  return splitk_slices(M, N, K, element_bytes, sm_count) > 1 ? kSmallBatch : kFillsGpu;
}
// A table entry's version where no kernel has been confirmed on a GPU for its type: the stage
// hands the call to ATen's GEMM and elementwise ops (the reference's own arithmetic).
constexpr int kAten = -1;
struct Choice {
  ShapeClass shape;
  DType dtype;
  int version;  // a version built for dtype, a candidate tune_id(I) (float32 only), or kAten
};
// Which table version 0 reads: the confirmed defaults, or the predictions a GPU's exact checks and
// timings have yet to confirm (the GPU plan times those versions by number; tests read the table).
enum ChoiceTable : int { kConfirmed = 0, kPredicted = 1 };
}  // namespace dense_kernels
#include "gemm_choice.h"  // kChoices and kPredictedChoices: the tables
namespace dense_kernels {
// An entry is usable on a device of compute capability `arch` (90 for sm_90) when its version
// runs there, and, for a TMA version, when the operands suit TMA (tma_compatible).
constexpr bool usable(int version, int arch, bool tma_ok) {
  return version == kAten || ((!needs_sm90a(version) || arch == 90) && (!uses_tma(version) || tma_ok));
}
template <size_t N>
constexpr bool valid_table(const Choice (&table)[N]) {
  for (const Choice& c : table)
    if (c.version != kAten && !(c.version != 0 && version_builds(c.version, c.dtype)) &&
        !(is_tune(c.version) && c.dtype == kF32))
      return false;
  for (int t = 0; t < kDTypes; ++t)  // every type and class of shape has an entry usable everywhere
    for (ShapeClass shape : {kFillsGpu, kSmallBatch}) {
      bool found = false;
      for (const Choice& c : table) found = found || (c.dtype == t && c.shape == shape && usable(c.version, 0, false));
      if (!found) return false;
    }
  return true;
}
static_assert(valid_table(kChoices) && valid_table(kPredictedChoices),
              "gemm_choice.h names a version not built for its type (or a candidate for another type than "
              "float32), or leaves a type and class of shape without an entry that runs on every GPU");

// TMA copies rows whose start and stride are multiples of 16 bytes: the operands' pointers, and
// their rows along the contiguous dimension (K, or M or N for an operand stored along it).
inline bool tma_compatible(const char* layout, const void* A, const void* B, int64_t M, int64_t N, int64_t K,
                           int element_bytes) {
  const bool ta = layout[0] == 't', tb = layout[1] == 't';
  const int64_t a_row = (ta ? M : K) * element_bytes, b_row = (tb ? K : N) * element_bytes;
  return reinterpret_cast<uintptr_t>(A) % 16 == 0 && reinterpret_cast<uintptr_t>(B) % 16 == 0 && a_row % 16 == 0 &&
         b_row % 16 == 0;
}

template <size_t N>
constexpr int first_usable(const Choice (&table)[N], ShapeClass shape, DType dtype, int arch, bool tma_ok) {
  for (const Choice& c : table)
    if (c.shape == shape && c.dtype == dtype && usable(c.version, arch, tma_ok)) return c.version;
  return kAten;  // unreachable: valid_table() holds an entry usable everywhere for every type and class
}

// The one resolver: what a call asking for `version` runs (0: automatic), from the shape, the
// element type, the device (sm_count SMs, compute capability arch, both queried by the caller) and
// whether the operands suit TMA. Every path calls it before sizing a workspace or launching: the
// stages, the launchers, the exports. Version 0 takes the table's first entry for the shape's
// class and type that is usable here; kAten where none is confirmed, unless `kernels_only` (a stage
// that carries kernels and no ATen path, the PTX stage): then chapter 3's version for the class,
// v8 or v9, which every type builds.
inline int resolve_version(int version, int64_t M, int64_t N, int64_t K, DType dtype, int sm_count, int arch,
                           bool tma_ok, bool kernels_only = false, ChoiceTable table = kConfirmed) {
  if (version != 0) return version;
  const ShapeClass shape = shape_class(M, N, K, acc_bytes(dtype), sm_count);
  const int chosen = table == kPredicted ? first_usable(kPredictedChoices, shape, dtype, arch, tma_ok)
                                         : first_usable(kChoices, shape, dtype, arch, tma_ok);
  if (chosen == kAten && kernels_only) return shape == kSmallBatch ? 9 : 8;
  return chosen;
}

inline Geometry gemm_geometry(int version, int element_bytes, int64_t M, int64_t N, int64_t K, int sm_count) {
  Geometry g;
  if (is_tune(version)) {
    const WarpTile w = kTuneCandidates[version - kTuneBase];
    g.block = {static_cast<unsigned>(warp_threads(w)), 1, 1};
    g.grid = {ceil_div(N, w.BN), ceil_div(M, w.BM), 1};
    return g;
  }
  const Tile t = tile(version, element_bytes);
  if (version <= 3) {  // one output per thread; x is the fast index of a warp
    g.block = {32, static_cast<unsigned>(threads(version, element_bytes) / 32), 1};
    g.grid = version == 1 ? Dim3{ceil_div(M, t.BM), ceil_div(N, t.BN), 1} : Dim3{ceil_div(N, t.BN), ceil_div(M, t.BM), 1};
  } else {
    g.block = {static_cast<unsigned>(threads(version, element_bytes)), 1, 1};
    g.grid = {ceil_div(N, t.BN), ceil_div(M, t.BM), 1};
    g.grid.z = static_cast<unsigned>(gemm_slices(version, element_bytes, M, N, K, sm_count));
  }
  return g;
}

// v9 and v12 with S > 1 slices write S partial M×N products into a workspace, then
// dense_splitk_reduce_{f32|f64}(const T* partial, T* C, const T* bias, int64 M, int64 N, int slices,
// int epilogue) adds them in slice order (deterministic) and applies the epilogue.
// `version` is a resolved one (resolve_version): version 0's workspace depends on the operands, so
// asking for it is refused (-1); kAten needs none.
inline int64_t gemm_workspace_elements(int version, int element_bytes, int64_t M, int64_t N, int64_t K, int sm_count) {
  if (version == 0) return -1;
  const int s = gemm_slices(version, element_bytes, M, N, K, sm_count);
  return s > 1 ? s * M * N : 0;
}
constexpr int kReduceThreads = 256;
inline Geometry reduce_geometry(int64_t M, int64_t N) {
  Geometry g;
  g.block = {kReduceThreads, 1, 1};
  g.grid = {ceil_div(M * N, kReduceThreads), 1, 1};
  return g;
}

inline std::string gemm_name(int version, const char* layout, DType dtype) {
  const std::string suffix = std::string("_") + layout + "_" + kDTypeNames[dtype];
  if (is_tune(version)) return "dense_gemm_tune" + std::to_string(version - kTuneBase) + suffix;
  return "dense_gemm_v" + std::to_string(version) + suffix;
}
inline std::string splitk_reduce_name(DType dtype) { return std::string("dense_splitk_reduce_") + kDTypeNames[dtype]; }

// The backward's elementwise kernel: dz = g · y · (1 − y) and db = Σ_rows dz (db may be null),
// in a short progression of its own (cuda/kernels/sigmoid_grad.cuh), every version
// deterministic (the same bits on every run):
//   v1  a block owns 32 columns and walks all rows; its 32 row lanes' sums meet in shared memory,
//       one thread per column adds them in order
//   v2  the same, the 32 partial sums of a column added by one warp with shuffles (5 steps, not 32)
//   v3  the rows spread over several blocks (enough for every SM), each writing its partial
//       column sums; a second kernel dense_bias_grad_v3 adds them in block order
// Parameters: (const T* g, const T* y, T* dz, T* db, int64 rows, int64 cols); v3's db is the
// workspace of partial sums, and dense_bias_grad_v3_{f32|f64}(const T* partial, T* db, int64 parts,
// int64 cols) finishes. The v1 _x4 entry (float only) gives each thread 4 adjacent columns; it
// needs cols % 4 == 0 and 16-byte aligned pointers (the PTX stage loads them as one 128-bit load).
constexpr int kGradVersions = 3, kDefaultGradVersion = 3;
constexpr int kGradCols = 32, kGradThreads = 1024;

// v3: blocks per column group along the rows: enough to cover the SMs, at least 64 rows each.
inline int grad_row_blocks(int version, int64_t rows, int64_t cols, int sm_count) {
  if (version != 3) return 1;
  const int64_t groups = ceil_div(cols, kGradCols);
  int64_t parts = (sm_count + groups - 1) / groups;
  if (parts > rows / 64) parts = rows / 64;
  return parts < 1 ? 1 : static_cast<int>(parts);
}

inline Geometry sigmoid_grad_geometry(int version, int64_t rows, int64_t cols, int cols_per_thread, int sm_count) {
  Geometry g;
  const unsigned x = kGradCols / cols_per_thread;
  g.block = {x, kGradThreads / x, 1};
  g.grid = {ceil_div(cols, kGradCols), static_cast<unsigned>(grad_row_blocks(version, rows, cols, sm_count)), 1};
  return g;
}
inline int64_t sigmoid_grad_workspace_elements(int version, int64_t rows, int64_t cols, int sm_count) {
  const int parts = grad_row_blocks(version, rows, cols, sm_count);
  return parts > 1 ? parts * cols : 0;
}
inline Geometry bias_grad_geometry(int64_t cols) {
  Geometry g;
  g.block = {kReduceThreads, 1, 1};
  g.grid = {ceil_div(cols, kReduceThreads), 1, 1};
  return g;
}

inline std::string sigmoid_grad_name(int version, DType dtype, bool x4) {
  return "dense_sigmoid_grad_v" + std::to_string(version) + (x4 ? "_x4_" : "_") + kDTypeNames[dtype];
}
inline std::string bias_grad_name(DType dtype) { return std::string("dense_bias_grad_v3_") + kDTypeNames[dtype]; }

// Host-side launchers (cuda/kernels/launch.cuh): the CUDA stage and the CPU emulation call these.
// `workspace` holds at least gemm_workspace_elements / sigmoid_grad_workspace_elements elements
// (may be null when those are 0). They return a cudaError_t (as int), 0 on success.
using Stream = ::CUstream_st*;  // cudaStream_t, without including CUDA's headers

// The element type is `dtype` (a DType); the workspace's elements are the accumulator's (float32,
// or float64 for float64), whatever the element type.
int launch_gemm(int version, const char* layout, int dtype, const void* A, const void* B, void* C, const void* bias,
                int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace, Stream stream);
int launch_sigmoid_grad(int version, int dtype, bool x4, const void* g, const void* y, void* dz, void* db, int64_t rows,
                        int64_t cols, int sm_count, void* workspace, Stream stream);
// The current device's compute capability as the Hopper versions see it: 90 on sm_90 when this
// build holds their sm_90a code (which a build for "9.0" alone does not), else its real value
// (80, 89...) or 0 for 9.0 without that code. resolve_version and the launchers take this.
int device_arch();

}  // namespace dense_kernels
