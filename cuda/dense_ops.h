// The two ops of the GPU stages, written once: the CUDA stage (cuda/binding.cpp) launches the
// kernels through the runtime API, the PTX stage (ptx/loader.cpp) through the driver API, and
// both hand this code a `Kernels` that knows how.
//
// Built with either stage, on a machine with a CUDA build of torch:  python grad_check.py cuda
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "dense_common.h"
#include "dense_kernels.h"

namespace dense {

class Kernels {
 public:
  virtual ~Kernels() = default;
  // C[M×N] = op(A) op(B) (+ epilogue), layouts and epilogues as in dense_kernels.h. `version` is
  // never 0 here (run_gemm chose it); `workspace` holds gemm_workspace_elements elements.
  virtual void gemm(int version, const char* layout, const at::Tensor& A, const at::Tensor& B, at::Tensor& C,
                    const at::Tensor* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count,
                    void* workspace, cudaStream_t stream) = 0;
  // dz = g · y · (1 − y); db = Σ_rows dz when db is given, with grad_version()'s kernel.
  virtual void sigmoid_grad(const at::Tensor& g, const at::Tensor& y, at::Tensor& dz, at::Tensor* db, int64_t rows,
                            int64_t cols, int sm_count, void* workspace, cudaStream_t stream) = 0;
  virtual int grad_version() const { return dense_kernels::kDefaultGradVersion; }
  // The device's compute capability as resolve_version takes it (dense_kernels::device_arch); a
  // stage without the Hopper versions says 0.
  virtual int arch() const { return 0; }
  // A stage that carries kernels and no ATen path (the PTX stage): version 0 never resolves to
  // kAten there, and its backward always runs grad_version()'s kernel.
  virtual bool kernels_only() const { return false; }
};

// The kernels' element type (dense_kernels::DType) of a tensor the checks have let through.
inline dense_kernels::DType kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return dense_kernels::kF32;
    case at::kDouble: return dense_kernels::kF64;
    case at::kBFloat16: return dense_kernels::kBF16;
    case at::kHalf: return dense_kernels::kF16;
    default: TORCH_CHECK_TYPE(false, "the kernels take float32, float64, bfloat16 and float16, not ", dtype_name(t));
  }
}

// The device's SM count, queried (an H100 SXM has 132, an H100 PCIe 114, ...): the small-batch
// choices (split-K, the backward's row blocks) depend on it.
inline int sm_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

// The accumulator's type, of which the workspaces are: float64 for float64, else float32.
inline at::TensorOptions acc_options(const at::Tensor& t) {
  return t.options().dtype(t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
}

// Where version 0 has no kernel confirmed on a GPU for the type: ATen's ops, the reference's own
// (cuBLAS's GEMM; with the bias, one addmm that rounds z once after adding it, then the sigmoid).
inline void aten_gemm(const char* layout, const at::Tensor& A, const at::Tensor& B, at::Tensor& C,
                      const at::Tensor* bias, int epilogue) {
  const at::Tensor a = layout[0] == 't' ? A.t() : A, b = layout[1] == 't' ? B.t() : B;
  if (epilogue == dense_kernels::kBiasSigmoid && bias != nullptr)
    at::addmm_out(C, *bias, a, b);
  else
    at::mm_out(C, a, b);
  if (epilogue == dense_kernels::kBiasSigmoid) C.sigmoid_();
}

// Resolves the version (0: by shape, type, device and the operands' alignment: the one resolver,
// dense_kernels::resolve_version) and allocates the split-K workspace from torch's caching
// allocator, on the current stream like the kernels.
inline void run_gemm(Kernels& k, int version, const char* layout, const at::Tensor& A, const at::Tensor& B,
                     at::Tensor& C, const at::Tensor* bias, int64_t M, int64_t N, int64_t K, int epilogue,
                     cudaStream_t stream) {
  const int sms = sm_count();
  const dense_kernels::DType dtype = kernel_dtype(A);
  version = dense_kernels::resolve_version(
      version, M, N, K, dtype, sms, k.arch(),
      dense_kernels::tma_compatible(layout, A.const_data_ptr(), B.const_data_ptr(), M, N, K, int(A.element_size())),
      k.kernels_only());
  if (version == dense_kernels::kAten) return aten_gemm(layout, A, B, C, bias, epilogue);
  const int64_t elements =
      dense_kernels::gemm_workspace_elements(version, dense_kernels::acc_bytes(dtype), M, N, K, sms);
  at::Tensor work = elements > 0 ? at::empty({elements}, acc_options(A)) : at::Tensor();
  k.gemm(version, layout, A, B, C, bias, M, N, K, epilogue, sms, elements > 0 ? work.mutable_data_ptr() : nullptr,
         stream);
}

// dz = g·y·(1 − y) and db = Σ_rows dz: grad_version()'s kernel, or, for version 0 in a type whose
// kernels no GPU record confirms, ATen's ops (the reference's sigmoid_backward and sum).
inline void run_sigmoid_grad(Kernels& k, int version, const at::Tensor& g, const at::Tensor& y, at::Tensor& dz,
                             at::Tensor* db, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (version == 0 && !k.kernels_only() && !dense_kernels::grad_kernels_confirmed(kernel_dtype(y))) {
    at::sigmoid_backward_out(dz, g, y);
    if (db != nullptr) at::sum_out(*db, dz, {0});
    return;
  }
  const int sms = sm_count();
  const int64_t elements = db ? dense_kernels::sigmoid_grad_workspace_elements(k.grad_version(), rows, cols, sms) : 0;
  at::Tensor work = elements > 0 ? at::empty({elements}, acc_options(y)) : at::Tensor();
  k.sigmoid_grad(g, y, dz, db, rows, cols, sms, elements > 0 ? work.mutable_data_ptr() : nullptr, stream);
}

inline void check_cuda(const at::Tensor& x, const char* stage) {
  TORCH_CHECK_VALUE(x.is_cuda(), "the ", stage, " stage runs on CUDA tensors; x is on ", device_name(x));
}

// A version chosen by hand (select_kernel) that is not built for x's type: say which are.
inline void check_version(int version, const at::Tensor& x) {
  const dense_kernels::DType t = kernel_dtype(x);
  if (version == 0 || dense_kernels::version_builds(version, t) || (dense_kernels::is_tune(version) && t == dense_kernels::kF32))
    return;
  std::string which;
  for (const auto& v : dense_kernels::kVersionInfo)
    if (v.id != 0 && dense_kernels::version_builds(v.id, t)) which += (which.empty() ? "" : ", ") + std::to_string(v.id);
  TORCH_CHECK_TYPE(false, "GEMM version ", version, " is not built for ", dtype_name(x), " (cuda/dense_kernels.h); ",
                   "for ", dtype_name(x), " select version 0 (automatic) or one of ", which);
}

inline at::Tensor gpu_forward(Kernels& k, int version, const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, const char* stage, const DtypeSet& types) {
  check_inputs(x, weight, bias, stage, types);
  check_cuda(x, stage);
  check_version(version, x);
  const c10::cuda::CUDAGuard guard(x.device());
  // The kernels read plain row-major memory: a transposed view is copied once here.
  const at::Tensor x2 = x.reshape({rows(x), weight.size(1)}).contiguous();
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();
  const int64_t M = x2.size(0), N = w.size(0), K = w.size(1);
  // Allocated in its final shape, written through a 2-d view: the op returns its own tensor.
  at::Tensor out = at::empty(out_shape(x, weight), x.options());
  at::Tensor out2 = out.view({M, N});
  if (M > 0 && N > 0) {
    run_gemm(k, version, "nt", x2, w, out2, b.defined() ? &b : nullptr, M, N, K, dense_kernels::kBiasSigmoid,
             at::cuda::getCurrentCUDAStream());
  }
  return out;
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> gpu_backward(Kernels& k, int version, const at::Tensor& grad_out,
                                                                   const at::Tensor& x, const at::Tensor& weight,
                                                                   const at::Tensor& out,
                                                                   std::array<bool, 3> output_mask,
                                                                   const char* stage, const DtypeSet& types) {
  check_inputs(x, weight, std::nullopt, stage, types);
  check_cuda(x, stage);
  check_version(version, x);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t in_f = weight.size(1), out_f = weight.size(0);
  TORCH_CHECK_VALUE(grad_out.sizes() == out.sizes(), "grad_out has shape ", dense::shape(grad_out),
                    " but the output had shape ", dense::shape(out));
  const int64_t rows = dense::rows(x);
  const at::Tensor g = grad_out.reshape({rows, out_f}).contiguous();  // may be a broadcast view
  const at::Tensor y = out.reshape({rows, out_f}).contiguous();
  at::Tensor dz = at::empty_like(y);
  at::Tensor grad_b = output_mask[2] ? at::empty({out_f}, y.options()) : unused(y);
  if (out_f > 0) run_sigmoid_grad(k, version, g, y, dz, output_mask[2] ? &grad_b : nullptr, rows, out_f, stream);

  const at::Tensor w = weight.contiguous();
  at::Tensor grad_x = unused(x), grad_w = unused(x);
  if (output_mask[0]) {  // dx[rows×in] = dz[rows×out] · W[out×in]
    grad_x = at::empty({rows, in_f}, x.options());
    if (rows > 0 && in_f > 0) run_gemm(k, version, "nn", dz, w, grad_x, nullptr, rows, in_f, out_f, dense_kernels::kPlain, stream);
    grad_x = grad_x.view(x.sizes());
  }
  if (output_mask[1]) {  // dW[out×in] = dzᵀ[out×rows] · x[rows×in]; rows = 0 gives zeros
    const at::Tensor x2 = x.reshape({rows, in_f}).contiguous();
    grad_w = at::empty({out_f, in_f}, x.options());
    if (out_f > 0 && in_f > 0) run_gemm(k, version, "tn", dz, x2, grad_w, nullptr, out_f, in_f, rows, dense_kernels::kPlain, stream);
  }
  return {grad_x, grad_w, grad_b};
}

// The functions a GPU stage registers. `Stage` supplies `name`, the element types it takes
// (`dtypes`, a DtypeSet), the selected GEMM `version`
// (0 picks by shape and SM count, see dense_kernels::resolve_version) and `kernels()`; the rest is shared.
template <class Stage>
struct GpuOps {
  static at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    return gpu_forward(Stage::kernels(), Stage::version, x, weight, bias, Stage::name, Stage::dtypes);
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                                 const at::Tensor& weight, const at::Tensor& out,
                                                                 std::array<bool, 3> output_mask) {
    return gpu_backward(Stage::kernels(), Stage::version, grad_out, x, weight, out, output_mask, Stage::name,
                        Stage::dtypes);
  }
  static int64_t select_kernel(int64_t version) {
    TORCH_CHECK_VALUE(version == 0 || dense_kernels::is_version(static_cast<int>(version)),
                      "kernel version must be 0 (automatic) or one of cuda/dense_kernels.h's kVersionInfo, got ",
                      version);
    const int previous = Stage::version;
    Stage::version = static_cast<int>(version);
    return previous;
  }
  static void define(torch::Library& m) {
    define_ops(m);
    m.def("select_kernel(int version) -> int", &select_kernel);
  }
  static void implement(torch::Library& m) {
    m.impl("forward", &forward);
    m.impl("backward", &backward);
  }
};

}  // namespace dense
