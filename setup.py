"""Ahead-of-time build of the compiled stages: pip install --no-build-isolation .

The JIT path (modes.load_extension) builds the same sources on first use; an installed
build, when present, is preferred. The CUDA stages are built only where torch is a CUDA
build and nvcc is found: this is decided from CUDA_HOME and torch.version.cuda, never
from torch.cuda.is_available(), so a build machine needs no GPU.
"""

import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from modes import CXX_FLAGS, LD_FLAGS  # noqa: E402  (the JIT build's flags, kept in one place)

ext_modules = [
    CppExtension("dense_cpp_ext", ["cpp/dense.cpp"], extra_compile_args=CXX_FLAGS,
                 extra_link_args=LD_FLAGS),
]

if torch.version.cuda is not None and CUDA_HOME is not None:
    if (ROOT / "cuda" / "binding.cpp").exists():
        ext_modules.append(CUDAExtension(
            "dense_cuda_ext", ["cuda/binding.cpp", "cuda/dense_kernels.cu"],
            include_dirs=[str(ROOT / "cpp"), str(ROOT / "cuda")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": ["-O3", "-lineinfo"]},
            extra_link_args=LD_FLAGS))
    if (ROOT / "ptx" / "loader.cpp").exists():
        ext_modules.append(CUDAExtension(
            "dense_ptx_ext", ["ptx/loader.cpp"], include_dirs=[str(ROOT / "cpp"), str(ROOT / "cuda")],
            extra_compile_args={"cxx": CXX_FLAGS}, extra_link_args=LD_FLAGS, libraries=["cuda"]))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExtension})
