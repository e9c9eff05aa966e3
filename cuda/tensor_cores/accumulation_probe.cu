//   nvcc -shared -Xcompiler -fPIC -std=c++17 -O3 -arch=sm_90a cuda/tensor_cores/accumulation_probe.cu -o /tmp/libtc_probe.so
// The accumulation probe's kernels (accumulation_probe.cuh) on a GPU, for ctypes:
// cuda/tensor_cores/accumulation_vectors.py --gpu builds this library and calls tc_accumulation_run
// with the arguments it gives the emulation's emu_tc_accumulation_run. Not one of the cuda stage's
// units: it is built alone, on the GPU's machine, with the CUDA runtime (no torch).
#include <cuda_runtime.h>

#include "accumulation_probe.cuh"

extern "C" __global__ void __launch_bounds__(32) tc_probe_mma_bf16(const uint32_t* a, const uint32_t* b,
                                                                    const float* c, float* out) {
  probe_mma16<__nv_bfloat16>(a, b, c, out);
}
extern "C" __global__ void __launch_bounds__(32) tc_probe_mma_f16(const uint32_t* a, const uint32_t* b,
                                                                   const float* c, float* out) {
  probe_mma16<__half>(a, b, c, out);
}
extern "C" __global__ void __launch_bounds__(32) tc_probe_mma_tf32(const uint32_t* a, const uint32_t* b,
                                                                    const float* c, float* out) {
  probe_mma_tf32(a, b, c, out);
}
extern "C" __global__ void __launch_bounds__(128) tc_probe_wgmma_bf16(const uint32_t* a, const uint32_t* b,
                                                                       const float* c, float* out) {
  probe_wgmma<dense_kernels::kProbeWgmmaBf16>(a, b, c, out);
}
extern "C" __global__ void __launch_bounds__(128) tc_probe_wgmma_f16(const uint32_t* a, const uint32_t* b,
                                                                      const float* c, float* out) {
  probe_wgmma<dense_kernels::kProbeWgmmaF16>(a, b, c, out);
}
extern "C" __global__ void __launch_bounds__(128) tc_probe_wgmma_tf32(const uint32_t* a, const uint32_t* b,
                                                                       const float* c, float* out) {
  probe_wgmma<dense_kernels::kProbeWgmmaTf32>(a, b, c, out);
}

// Run `vectors` vectors through probe `kind` (dense_kernels::ProbeKind): host arrays a and b
// (K words a vector), c (one float a vector) in, out (probe_outputs(kind) floats a vector) back.
// 0, -1 for an invalid request, or the CUDA runtime's error code.
extern "C" int tc_accumulation_run(int kind, int vectors, const uint32_t* a, const uint32_t* b, const float* c,
                                   float* out) {
  using Kernel = void (*)(const uint32_t*, const uint32_t*, const float*, float*);
  const Kernel kernels[] = {tc_probe_mma_bf16, tc_probe_mma_f16, tc_probe_mma_tf32,
                            tc_probe_wgmma_bf16, tc_probe_wgmma_f16, tc_probe_wgmma_tf32};
  if (kind < 0 || kind >= dense_kernels::kProbeKinds || vectors < 1) return -1;
  const size_t k = size_t(dense_kernels::probe_k(kind)) * size_t(vectors) * 4,
               outputs = size_t(dense_kernels::probe_outputs(kind)) * size_t(vectors) * 4;
  uint32_t *da = nullptr, *db = nullptr;
  float *dc = nullptr, *dout = nullptr;
  cudaError_t e = cudaMalloc(&da, k);
  if (e == cudaSuccess) e = cudaMalloc(&db, k);
  if (e == cudaSuccess) e = cudaMalloc(&dc, size_t(vectors) * 4);
  if (e == cudaSuccess) e = cudaMalloc(&dout, outputs);
  if (e == cudaSuccess) e = cudaMemcpy(da, a, k, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db, b, k, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dc, c, size_t(vectors) * 4, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    kernels[kind]<<<unsigned(vectors), unsigned(dense_kernels::probe_threads(kind))>>>(da, db, dc, dout);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(out, dout, outputs, cudaMemcpyDeviceToHost);  // (waits for the kernel)
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dout);
  return int(e);
}
