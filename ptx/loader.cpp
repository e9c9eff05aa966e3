// The PTX stage's loader: JIT-loads hand-edited PTX with the CUDA driver API and registers its
// kernels as dense_ptx::forward/backward (the same schema as the cpp and cuda stages).
//
// Build and check (on a GPU machine):  python grad_check.py ptx --device cuda
// Ahead of time:                        pip install --no-build-isolation .
#include <cuda.h>  // the driver API's types and declarations only: nothing here links libcuda
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dense_ops.h"
#include "module_cache.h"

namespace {

// The driver functions the loader calls, found at run time through the CUDA runtime that torch
// has loaded (cudaGetDriverEntryPointByVersion), so that the extension links no libcuda: it
// builds and imports on a machine without a driver, and there a call fails with this message.
// Each pointer has the type cuda.h declares, and is asked for at the version of that header.
struct Driver {
  decltype(&cuModuleLoadDataEx) moduleLoadDataEx;
  decltype(&cuModuleUnload) moduleUnload;
  decltype(&cuModuleGetFunction) moduleGetFunction;
  decltype(&cuLaunchKernel) launchKernel;
  decltype(&cuCtxGetCurrent) ctxGetCurrent;
  decltype(&cuCtxGetId) ctxGetId;
  decltype(&cuCtxSynchronize) ctxSynchronize;
  decltype(&cuGetErrorName) getErrorName;
  decltype(&cuGetErrorString) getErrorString;
  decltype(&cuDriverGetVersion) driverGetVersion;

  static const Driver& get() {
    static const Driver driver;  // looked up once; a failed lookup throws, and the next call tries again
    return driver;
  }

 private:
  Driver()
      : moduleLoadDataEx(find<decltype(moduleLoadDataEx)>("cuModuleLoadDataEx")),
        moduleUnload(find<decltype(moduleUnload)>("cuModuleUnload")),
        moduleGetFunction(find<decltype(moduleGetFunction)>("cuModuleGetFunction")),
        launchKernel(find<decltype(launchKernel)>("cuLaunchKernel")),
        ctxGetCurrent(find<decltype(ctxGetCurrent)>("cuCtxGetCurrent")),
        ctxGetId(find<decltype(ctxGetId)>("cuCtxGetId")),
        ctxSynchronize(find<decltype(ctxSynchronize)>("cuCtxSynchronize")),
        getErrorName(find<decltype(getErrorName)>("cuGetErrorName")),
        getErrorString(find<decltype(getErrorString)>("cuGetErrorString")),
        driverGetVersion(find<decltype(driverGetVersion)>("cuDriverGetVersion")) {}

  // region driver-lookup
  template <class Fn>
  static Fn find(const char* symbol) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t error = cudaGetDriverEntryPointByVersion(symbol, &fn, CUDA_VERSION, cudaEnableDefault, &found);
    if (error != cudaSuccess) cudaGetLastError();  // leave no error behind for torch's next launch check
    TORCH_CHECK(error == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
                "dense_ptx: the CUDA driver's ", symbol, " cannot be reached (",
                error != cudaSuccess ? cudaGetErrorString(error) : "symbol not found in this driver",
                "): loading PTX needs an NVIDIA driver for CUDA ", CUDA_VERSION / 1000, ".", CUDA_VERSION % 1000 / 10,
                " or newer");
    return reinterpret_cast<Fn>(fn);
  }
  // endregion
};

// "CUDA_ERROR_INVALID_CONTEXT (invalid device context)": a driver error in words.
std::string describe(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  Driver::get().getErrorName(result, &name);
  Driver::get().getErrorString(result, &text);
  return std::string(name ? name : "?") + " (" + (text ? text : "no description") + ")";
}

void check_driver(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) TORCH_CHECK(false, what, " failed: ", describe(result));
}

// The driver's version, e.g. 13000 for CUDA 13.0 (or the error above where there is none).
int64_t driver_version() {
  int version = 0;
  check_driver(Driver::get().driverGetVersion(&version), "cuDriverGetVersion");
  return version;
}

// The PTX, loaded once per CUDA context. A CUmodule and its kernels belong to the context they
// were loaded in, and a kernel launches in the calling thread's current context: torch makes
// each device's primary context current, but a caller may have made another one current (the
// driver API allows several on one device), so each context has its module. Which module that
// is, and when one is unloaded, module_cache.h decides: by the context's id, since a new
// context may get a destroyed one's handle, and only ever in the calling thread's current
// context, since another may have been destroyed.
//
// One mutex guards the PTX and the modules, and every entry point holds it for as long as it
// uses a module: an op's launches, from finding its kernels to enqueueing them, all come from
// one module, which set_ptx cannot unload in between.
class DriverKernels final : public dense::Kernels {
 public:
  // Use this PTX from now on: each context loads it at its next launch, and unloads its module
  // of the old one then. The calling thread's current context unloads its own now; if it cannot,
  // the new PTX is in use all the same, and the error says so.
  void set_ptx(std::string ptx) {
    std::lock_guard<std::mutex> lock(mutex_);
    ptx_ = std::move(ptx);
    modules_.retire();
    // Without a module there is nothing to unload, and no driver is needed: PTX text can be
    // handed over on a machine that has none.
    if (modules_.empty()) return;
    const Current here = current_context();
    if (here.context == nullptr) return;
    modules_.unload_stale(here.context, here.id, [](Module& module) {
      const CUresult result = unload(module);
      TORCH_CHECK(result == CUDA_SUCCESS, "dense_ptx: the new PTX is in use, but this context's module of the ",
                  "previous one could not be unloaded: ", describe(result));
    });
  }

  // Load the PTX into the calling thread's current context now (otherwise its first launch
  // there does it, JIT compiler and all); returns how many contexts hold it.
  int64_t load_here() {
    std::lock_guard<std::mutex> lock(mutex_);
    current_module();
    return static_cast<int64_t>(modules_.loaded());
  }

  void gemm(int version, const char* layout, const at::Tensor& A, const at::Tensor& B, at::Tensor& C,
            const at::Tensor* bias, int64_t M, int64_t N, int64_t K, int epilogue, int sm_count, void* workspace,
            cudaStream_t stream) override {
    const dense_kernels::DType dtype = dense::kernel_dtype(A);
    const auto geo = dense_kernels::gemm_geometry(version, dense_kernels::acc_bytes(dtype), M, N, K, sm_count);
    CUdeviceptr a = ptr(A), b = ptr(B), c = ptr(C), bi = bias ? ptr(*bias) : 0;
    std::lock_guard<std::mutex> lock(mutex_);
    if (geo.grid.z == 1) {
      void* args[] = {&a, &b, &c, &bi, &M, &N, &K, &epilogue};
      launch(dense_kernels::gemm_name(version, layout, dtype), geo, args, stream);
      return;
    }
    // split-K (v9): partial products into the workspace, then their sum + the epilogue
    CUdeviceptr w = reinterpret_cast<CUdeviceptr>(workspace), none = 0;
    int plain = dense_kernels::kPlain, slices = static_cast<int>(geo.grid.z);
    void* args[] = {&a, &b, &w, &none, &M, &N, &K, &plain};
    launch(dense_kernels::gemm_name(version, layout, dtype), geo, args, stream);
    void* reduce_args[] = {&w, &c, &bi, &M, &N, &slices, &epilogue};
    launch(dense_kernels::splitk_reduce_name(dtype), dense_kernels::reduce_geometry(M, N), reduce_args, stream);
  }

  // The PTX carries the first version of the backward's kernel: its x4 variant is EDIT-B's.
  int grad_version() const override { return 1; }
  // The PTX is the lesson: version 0 runs its v8 or v9 in every type it takes, never ATen's GEMM.
  bool kernels_only() const override { return true; }

  void sigmoid_grad(const at::Tensor& g, const at::Tensor& y, at::Tensor& dz, at::Tensor* db, int64_t rows,
                    int64_t cols, int sm_count, void*, cudaStream_t stream) override {
    const dense_kernels::DType dtype = dense::kernel_dtype(g);
    // The 128-bit kernel needs whole, aligned groups of 4 floats in every row.
    const bool x4 = dtype == dense_kernels::kF32 && cols % 4 == 0 && aligned(g) && aligned(y) && aligned(dz);
    const auto geo = dense_kernels::sigmoid_grad_geometry(1, rows, cols, x4 ? 4 : 1, sm_count);
    CUdeviceptr gp = ptr(g), yp = ptr(y), dzp = ptr(dz), dbp = db ? ptr(*db) : 0;
    void* args[] = {&gp, &yp, &dzp, &dbp, &rows, &cols};
    std::lock_guard<std::mutex> lock(mutex_);
    launch(dense_kernels::sigmoid_grad_name(1, dtype, x4), geo, args, stream);
  }

 private:
  struct Module {
    CUmodule handle = nullptr;
    std::unordered_map<std::string, CUfunction> functions;
  };

  static CUdeviceptr ptr(const at::Tensor& t) { return reinterpret_cast<CUdeviceptr>(t.const_data_ptr()); }
  static bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

  // The calling thread's current context: its handle, to be compared and never passed back, and
  // its id, which the driver is asked for as the current context's (a null handle), so that no
  // handle of a context that may be gone is handed to it. A null handle where there is none.
  struct Current {
    CUcontext context = nullptr;
    unsigned long long id = 0;
  };

  static Current current_context() {
    const Driver& driver = Driver::get();
    Current here;
    check_driver(driver.ctxGetCurrent(&here.context), "cuCtxGetCurrent");
    if (here.context == nullptr) return here;
    // A context destroyed on another thread stays current to this one, and the driver answers
    // CUDA_ERROR_CONTEXT_IS_DESTROYED there (cuCtxDestroy's documentation): no context to use.
    const CUresult result = driver.ctxGetId(nullptr, &here.id);
    if (result == CUDA_ERROR_CONTEXT_IS_DESTROYED || result == CUDA_ERROR_INVALID_CONTEXT) return {};
    check_driver(result, "cuCtxGetId");
    return here;
  }

  // cuModuleUnload acts on the current context, here the module's own; that context's queued
  // work, which may include kernels of this module, is finished first.
  static CUresult unload(Module& module) {
    const CUresult result = Driver::get().ctxSynchronize();
    return result == CUDA_SUCCESS ? Driver::get().moduleUnload(module.handle) : result;
  }

  // The PTX, JIT-compiled into the current context.
  Module load() const {
    Module module;
    std::vector<char> log(1 << 16, '\0');
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* values[] = {log.data(), reinterpret_cast<void*>(log.size())};
    const CUresult result = Driver::get().moduleLoadDataEx(&module.handle, ptx_.c_str(), 2, options, values);
    if (result != CUDA_SUCCESS) {
      const char* name = nullptr;
      Driver::get().getErrorName(result, &name);
      TORCH_CHECK(false, "the PTX did not load (", name ? name : "?", "); the JIT compiler said:\n", log.data());
    }
    return module;
  }

  // The module of the calling thread's current context, loaded on first use. Called with mutex_ held.
  Module& current_module() {
    TORCH_CHECK(!ptx_.empty(), "dense_ptx: no PTX loaded; call torch.ops.dense_ptx.load_ptx first");
    // The driver API acts on the calling thread's current context, and a thread on which the
    // runtime was never called has none: autograd runs a backward on a thread of its own, and
    // there the first launch failed with CUDA_ERROR_INVALID_CONTEXT. Any runtime call makes the
    // current device's primary context (the one torch uses) current on this thread.
    Current here = current_context();
    if (here.context == nullptr) {
      C10_CUDA_CHECK(cudaFree(nullptr));
      here = current_context();
      TORCH_CHECK(here.context != nullptr, "dense_ptx: no live CUDA context is current on this thread");
    }
    return modules_.current(here.context, here.id, [this] { return load(); }, [](Module& module) {
      const CUresult result = unload(module);
      TORCH_CHECK(result == CUDA_SUCCESS, "dense_ptx: this context's module of the previous PTX could not be ",
                  "unloaded: ", describe(result));
    });
  }

  // A kernel of the current context's module, by name. Called with mutex_ held.
  CUfunction function(const std::string& name) {
    Module& module = current_module();
    auto found = module.functions.find(name);
    if (found != module.functions.end()) return found->second;
    CUfunction fn = nullptr;
    const CUresult result = Driver::get().moduleGetFunction(&fn, module.handle, name.c_str());
    TORCH_CHECK(result == CUDA_SUCCESS, "the PTX has no kernel named ", name,
                " (the PTX stage carries GEMM versions 8 and 9 only; or was it edited away or renamed?)");
    module.functions.emplace(name, fn);
    return fn;
  }

  // Called with mutex_ held: the kernel's module stays loaded until the launch is enqueued.
  void launch(const std::string& name, const dense_kernels::Geometry& geo, void** args, cudaStream_t stream) {
    CUfunction fn = function(name);
    // torch's current stream, so the kernel is ordered with torch's own work (and graphs).
    check_driver(Driver::get().launchKernel(fn, geo.grid.x, geo.grid.y, geo.grid.z, geo.block.x, geo.block.y, geo.block.z,
                                0, reinterpret_cast<CUstream>(stream), args, nullptr),
                 ("launching " + name).c_str());
  }

  std::mutex mutex_;
  std::string ptx_;
  dense_ptx::ModuleCache<CUcontext, Module> modules_;
};

struct PtxStage {
  static constexpr const char* name = "ptx";
  // The PTX carries the float32 and float64 kernels of chapter 3's v8 and v9 only.
  static constexpr dense::DtypeSet dtypes = dense::kFloat32And64;
  static inline int version = dense_kernels::kDefaultVersion;
  static DriverKernels& driver() {
    static DriverKernels k;
    return k;
  }
  static dense::Kernels& kernels() { return driver(); }
};
using Ops = dense::GpuOps<PtxStage>;

void load_ptx(std::string ptx) { PtxStage::driver().set_ptx(std::move(ptx)); }
int64_t load_here() { return PtxStage::driver().load_here(); }

}  // namespace

TORCH_LIBRARY(dense_ptx, m) {
  Ops::define(m);
  m.def("load_ptx(str ptx) -> ()", &load_ptx);
  m.def("load_here() -> int", &load_here);
  m.def("driver_version() -> int", &driver_version);
}
TORCH_LIBRARY_IMPL(dense_ptx, CUDA, m) { Ops::implement(m); }
TORCH_LIBRARY_IMPL(dense_ptx, Autograd, m) { dense::implement_autograd<PtxStage>(m); }

DENSE_PYTHON_MODULE(dense_ptx_ext)
