"""Ahead-of-time build of the compiled stages: pip install --no-build-isolation .

The JIT path (modes.load_extension) builds the same sources with the same flags on first use;
an installed build, when present, is preferred. The GPU stages are built where torch is a CUDA
build and the CUDA toolkit is found (modes.cuda_build: no GPU is needed, and none is asked
for); elsewhere they are left out with a line saying why. Environment variables are optional:
CUDA_HOME picks a toolkit, TORCH_CUDA_ARCH_LIST the GPUs (default: modes.DEFAULT_CUDA_ARCHS).
"""

import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension, include_paths

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
# The JIT build's flags and toolkit search, kept in one place.
from modes import CXX_FLAGS, LD_FLAGS, NVCC_FLAGS, CudaBuildError, cuda_build, cuda_stage_sources  # noqa: E402

# setuptools passes torch's headers with -I, where -Wall warns about their pragmas (the JIT
# build passes them with -isystem, which silences warnings from headers that are not ours).
# A folder named by -isystem too is searched as a system folder, its -I ignored.
SYSTEM = [f"-isystem{p}" for p in include_paths()]

ext_modules = [
    CppExtension("dense_cpp_ext", ["cpp/dense.cpp"], extra_compile_args=[*SYSTEM, *CXX_FLAGS],
                 extra_link_args=LD_FLAGS),
]

if torch.version.cuda is not None:
    try:
        cuda = cuda_build()
    except CudaBuildError as e:
        print(f"setup.py: the GPU stages are not built: {e}", file=sys.stderr)
    else:
        print(f"setup.py: building the GPU stages with the toolkit in {cuda.home} for {cuda.archs}", file=sys.stderr)
        include_dirs = [str(ROOT / "cpp"), str(ROOT / "cuda")]
        cxx = [*SYSTEM, *CXX_FLAGS, *cuda.cxx_flags]
        ext_modules.append(CUDAExtension(
            "dense_cuda_ext", [str(s) for s in cuda_stage_sources()], include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx, "nvcc": [*NVCC_FLAGS, *cuda.nvcc_flags]}, extra_link_args=LD_FLAGS))
        # The PTX stage's loader reaches the CUDA driver at run time: nothing links libcuda.
        ext_modules.append(CUDAExtension(
            "dense_ptx_ext", ["ptx/loader.cpp"], include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx, "nvcc": [*NVCC_FLAGS, *cuda.nvcc_flags]}, extra_link_args=LD_FLAGS))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExtension})
