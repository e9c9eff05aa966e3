// The cuda stage's binding: registers the kernels of dense_kernels.cu as dense_cuda::forward/backward,
// the same schema as the cpp stage, plus dense_cuda::select_kernel to pick the GEMM version.
//
// Build and check (on a GPU machine):  python grad_check.py cuda --device cuda
// Ahead of time:                        pip install --no-build-isolation .
#include "dense_ops.h"

namespace {

class RuntimeKernels final : public dense::Kernels {
 public:
  void gemm(int version, const char* layout, const at::Tensor& A, const at::Tensor& B, at::Tensor& C,
            const at::Tensor* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace,
            cudaStream_t stream) override {
    C10_CUDA_CHECK(static_cast<cudaError_t>(dense_kernels::launch_gemm(
        version, layout, dense::kernel_dtype(A), A.const_data_ptr(), B.const_data_ptr(),
        C.mutable_data_ptr(), bias ? bias->const_data_ptr() : nullptr, M, N, K, epilogue, sm_count, workspace,
        stream)));
  }
  int arch() const override { return dense_kernels::device_arch(); }
  void sigmoid_grad(const at::Tensor& g, const at::Tensor& y, at::Tensor& dz, at::Tensor* db, int64_t rows,
                    int64_t cols, int sm_count, void* workspace, cudaStream_t stream) override {
    C10_CUDA_CHECK(static_cast<cudaError_t>(dense_kernels::launch_sigmoid_grad(
        grad_version(), dense::kernel_dtype(g), /*x4=*/false, g.const_data_ptr(), y.const_data_ptr(),
        dz.mutable_data_ptr(), db ? db->mutable_data_ptr() : nullptr, rows, cols, sm_count, workspace, stream)));
  }
};

struct CudaStage {
  static constexpr const char* name = "cuda";
  static constexpr dense::DtypeSet dtypes = dense::kEveryFloat;
  static inline int version = dense_kernels::kDefaultVersion;
  static dense::Kernels& kernels() {
    static RuntimeKernels k;
    return k;
  }
};
using Ops = dense::GpuOps<CudaStage>;

}  // namespace

TORCH_LIBRARY(dense_cuda, m) { Ops::define(m); }
TORCH_LIBRARY_IMPL(dense_cuda, CUDA, m) { Ops::implement(m); }
TORCH_LIBRARY_IMPL(dense_cuda, Autograd, m) { dense::implement_autograd<CudaStage>(m); }

DENSE_PYTHON_MODULE(dense_cuda_ext)
