"""The GPU stages' sources checked without a GPU: the cuda stage's launchers compile and export
the C entries cuda/bench_gpu.py calls, the C++ bindings of the cuda and ptx stages type-check
against torch's headers, and every kernel and emulator file opens with the command that builds or
checks it. (The PTX itself: tests/test_ptx_kernels.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from cli import cuda_tool
from conftest import ROOT

pytestmark = pytest.mark.slow  # nvcc and the host compiler over the kernels and bindings

NVCC = cuda_tool("nvcc")  # the toolkit, or requirements-cuda.txt's wheels
KERNELS = ROOT / "cuda" / "dense_kernels.cu"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (python -m pip install -r requirements-cuda.txt)")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])  # the stage's default architectures (modes.py)
def test_the_launchers_compile_and_export_what_bench_gpu_calls(arch, tmp_path):
    """cuda/dense_kernels.cu holds the host side (the kernels are in cuda/units/, whose registers
    and spills tests/test_static.py checks entry by entry); cuda/bench_gpu.py finds these C
    exports in the built extension by name."""
    result = subprocess.run([NVCC, "-c", "-std=c++17", "-O3", f"-arch={arch}", str(KERNELS),
                             "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found on PATH")
    symbols = subprocess.run([nm, "-g", "--defined-only", str(tmp_path / "k.o")], capture_output=True, text=True,
                             timeout=120).stdout
    for name in ("dense_tune_count", "dense_tune_launch", "dense_gemm_launch", "dense_gemm_workspace",
                 "dense_gemm_resolve", "dense_sigmoid_grad_launch"):
        assert re.search(rf" T {name}$", symbols, re.M), name




# The CPU wheel of torch ships the CUDA headers of ATen but not those of the CUDA maths
# libraries they include; tiny stand-ins are enough for the compiler to check our code.
STAND_INS = {
    "c10/cuda/impl/cuda_cmake_macros.h": "",
    "cusparse.h": "typedef int cusparseStatus_t;\ntypedef struct cusparseContext* cusparseHandle_t;\n"
                  "inline const char* cusparseGetErrorString(cusparseStatus_t) { return \"\"; }\n",
    "cublas_v2.h": "typedef int cublasStatus_t;\ntypedef struct cublasContext* cublasHandle_t;\n"
                   "inline const char* cublasGetStatusString(cublasStatus_t) { return \"\"; }\n",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolver_common.h": "typedef int cusolverStatus_t;\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n"
                         + "".join(f"#define CUSOLVER_STATUS_{s} {i}\n" for i, s in enumerate(
                             ["SUCCESS", "NOT_INITIALIZED", "ALLOC_FAILED", "INVALID_VALUE", "ARCH_MISMATCH",
                              "MAPPING_ERROR", "EXECUTION_FAILED", "INTERNAL_ERROR", "MATRIX_TYPE_NOT_SUPPORTED"])),
    "cusolverDn.h": "#include \"cusolver_common.h\"\n",
}


@pytest.mark.parametrize("source", ["cuda/binding.cpp", "ptx/loader.cpp"])
def test_gpu_bindings_type_check_against_torch_headers(source, tmp_path):
    import torch
    from torch.utils.cpp_extension import include_paths

    cxx = shutil.which("g++") or shutil.which("c++")
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", str(Path(NVCC or "/").resolve().parent.parent)]
    cuda_include = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").exists()),
                        None)
    if cxx is None or cuda_include is None:
        pytest.skip("needs a C++ compiler and the CUDA toolkit's headers")
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch builds the real extension instead (tests/test_cuda.py)")
    for name, text in STAND_INS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("#pragma once\n" + text)
    includes = [tmp_path, *map(Path, include_paths()), Path(sysconfig.get_paths()["include"]), cuda_include,
                ROOT / "cpp", ROOT / "cuda"]
    result = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", *(f"-I{p}" for p in includes), str(ROOT / source)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]



def test_kernel_files_start_with_the_command_that_builds_or_checks_them():
    kernel_files = [p.relative_to(ROOT).as_posix() for folder in ("kernels", "tensor_cores", "units")
                    for p in sorted((ROOT / "cuda" / folder).glob("*.cu*"))]
    emulation = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "cuda" / "emulate").glob("*.[ch]*"))]
    for name in ["cuda/dense_kernels.cu", "cuda/binding.cpp", "cuda/dense_kernels.h", "cuda/gemm_choice.h",
                 "cuda/dense_ops.h", "ptx/loader.cpp", "ptx/dense_kernels.ptx", "ptx/lesson_kernels.cu",
                 "cpp/dense.cpp", "cpp/dense_common.h", *kernel_files, *emulation]:
        path = ROOT / name
        head = "\n".join(path.read_text().splitlines()[:8])
        assert re.search(r"(nvcc|ptxas|python|pip|pytest|bash|c\+\+) ", head), f"{path.name}: no build command"
