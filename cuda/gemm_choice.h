// Which GEMM version 0 runs, per class of shape and element type: two tables.
//   python cuda/bench_gpu.py gemm candidates --json /tmp/gpu.json     (GPU: the timings that decide)
// Included by dense_kernels.h (ShapeClass, Choice, kAten, tune_id are defined there), which checks
// every entry at compile time; resolve_version reads them. Version 0 takes the first entry for the
// shape's class and type that runs on the device (a Hopper version on sm_90a only, a TMA version
// only on operands whose rows TMA can copy): each type and class ends with an entry that runs
// everywhere.
//
// kChoices, the defaults, name only what a committed GPU record confirms for that type: the
// record's check of the version on a GPU, and a timing that shows it faster than what it replaces.
// Where nothing is confirmed for a type, kAten: the CUDA stage hands the call to ATen's GEMM and
// elementwise ops. docs/results/cuda_gpu_h100.json checks v1-v9 in float32 on an H100 and times v8
// (tiles fill the GPU) and v9 (a small batch: split-K); no GPU has run any version in float64,
// bfloat16 or float16. The PTX stage carries only v8 and v9 (ptx/lesson_kernels.cu, float32 and
// float64) and no ATen path: where this table says kAten it runs v8 or v9 (resolve_version's
// kernels_only). A candidate (float32 only) is written tune_id(I).
#pragma once

namespace dense_kernels {

constexpr Choice kChoices[] = {
    {kFillsGpu, kF32, 8},       {kSmallBatch, kF32, 9},      {kFillsGpu, kF64, kAten}, {kSmallBatch, kF64, kAten},
    {kFillsGpu, kBF16, kAten},  {kSmallBatch, kBF16, kAten}, {kFillsGpu, kF16, kAten}, {kSmallBatch, kF16, kAten},
};

// kPredictedChoices: what the tensor-core chapter predicts (cuda/tensor_cores/README.md), for a GPU to
// confirm version by version before an entry moves into kChoices. bfloat16 and float16: on sm_90a
// (and operands whose rows TMA copies) v33, warp-specialized wgmma, where its tiles fill the GPU,
// and v35, W as wgmma's A with K split over every SM, for a small batch; elsewhere the tensor
// cores' v24 where its 128×128 tiles fill the GPU, and for a small batch v12, which splits K over
// every SM where v24's few tiles would leave most SMs idle. float64: chapter 3's v8 and v9.
constexpr Choice kPredictedChoices[] = {
    {kFillsGpu, kF32, 8},    {kFillsGpu, kF64, 8},    {kSmallBatch, kF32, 9},   {kSmallBatch, kF64, 9},
    {kFillsGpu, kBF16, 33},  {kFillsGpu, kF16, 33},
    {kSmallBatch, kBF16, 35}, {kSmallBatch, kF16, 35},
    {kFillsGpu, kBF16, 24},  {kFillsGpu, kF16, 24},  {kSmallBatch, kBF16, 12}, {kSmallBatch, kF16, 12},
};

// The backward's sigmoid-grad kernels by type: the same record checks them in float32 only; in the
// other types the CUDA stage's version 0 computes dz and db with ATen's ops.
constexpr bool grad_kernels_confirmed(DType t) { return t == kF32; }

}  // namespace dense_kernels
