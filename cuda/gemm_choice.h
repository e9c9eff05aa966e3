// Which GEMM version 0 runs, per class of shape and element type: the table that GPU timings fill.
//   python cuda/bench_gpu.py gemm candidates --json /tmp/gpu.json     (GPU: the timings that decide)
// Included by dense_kernels.h (ShapeClass, Choice, tune_id are defined there), which checks every
// entry at compile time. Version 0 takes the first entry for the shape's class and type that runs
// on the device (a Hopper version on sm_90a only, a TMA version only on operands whose rows TMA can
// copy): each type and class ends with an entry that runs everywhere. An entry changes only with
// a committed record that shows its version or candidate faster than the one it replaces on that
// class of shape; until then float32 and float64 take v8 (tiles fill the GPU) and v9 (a small
// batch: split-K). The PTX stage chooses through this table too and carries only v8 and v9
// (ptx/lesson_kernels.cu, float32 and float64): an entry of those types naming another version
// needs that version added there as well. A candidate (float32 only) is written tune_id(I).
#pragma once

namespace dense_kernels {

constexpr Choice kChoices[] = {
    {kFillsGpu, kF32, 8},    {kFillsGpu, kF64, 8},    {kSmallBatch, kF32, 9},   {kSmallBatch, kF64, 9},
    // bfloat16 and float16, predicted, not yet timed (cuda/tensor_cores/README.md): on sm_90a
    // (and operands whose rows TMA copies) v33, warp-specialized wgmma, where its tiles fill the
    // GPU, and v35, W as wgmma's A with K split over every SM, for a small batch; elsewhere the
    // tensor cores' v24 where its 128×128 tiles fill the GPU, and for a small batch v12, which
    // splits K over every SM where v24's few tiles would leave most SMs idle.
    {kFillsGpu, kBF16, 33},  {kFillsGpu, kF16, 33},
    {kSmallBatch, kBF16, 35}, {kSmallBatch, kF16, 35},
    {kFillsGpu, kBF16, 24},  {kFillsGpu, kF16, 24},  {kSmallBatch, kBF16, 12}, {kSmallBatch, kF16, 12},
};

}  // namespace dense_kernels
