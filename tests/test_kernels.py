"""Checks of the GPU stages that need no GPU: the kernels compile, the PTX assembles and carries
exactly its marked edits, and the C++ around them type-checks against torch's headers."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cli import cuda_tool
from conftest import ROOT, load_script

pytestmark = pytest.mark.slow  # nvcc and the host compiler over the kernels and bindings

NVCC, PTXAS = cuda_tool("nvcc"), cuda_tool("ptxas")  # the toolkit, or requirements-cuda.txt's wheels
KERNELS = ROOT / "cuda" / "dense_kernels.cu"
LESSON = ROOT / "ptx" / "lesson_kernels.cu"  # what the PTX stage's PTX is generated from
EDITED = ROOT / "ptx" / "dense_kernels.ptx"
ARCHS = ["sm_80", "sm_90"]

TOOLS = "python -m pip install -r requirements-cuda.txt"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason=f"nvcc not found ({TOOLS})")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason=f"ptxas not found ({TOOLS})")

# The entry points ptx/loader.cpp asks for by name (dense_kernels.h: gemm_name, sigmoid_grad_name).
GEMM_PARAMS = ["u64"] * 4 + ["u64"] * 3 + ["u32"]  # A, B, C, bias; M, N, K; epilogue
GRAD_PARAMS = ["u64"] * 4 + ["u64"] * 2             # g, y, dz, db; rows, cols
REDUCE_PARAMS = ["u64"] * 3 + ["u64"] * 2 + ["u32"] * 2  # partial, C, bias; M, N; slices, epilogue
ENTRIES = {f"dense_gemm_v{v}_{layout}_{t}": GEMM_PARAMS
           for v in (8, 9) for layout in ("nt", "nn", "tn") for t in ("f32", "f64")}
ENTRIES.update({name: GRAD_PARAMS for name in
                ("dense_sigmoid_grad_v1_f32", "dense_sigmoid_grad_v1_f64", "dense_sigmoid_grad_v1_x4_f32")})
ENTRIES.update({f"dense_splitk_reduce_{t}": REDUCE_PARAMS for t in ("f32", "f64")})
def resource_usage(output: str) -> dict[str, str]:
    """ptxas -v output -> {entry name: its 'spill stores/loads' line}."""
    usage, current = {}, None
    for line in output.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        elif current and "spill stores" in line:
            usage[current] = line.strip()
    return usage


def assert_no_spills(output: str, expected: set[str], only: set[str] | None = None) -> None:
    usage = resource_usage(output)
    assert expected <= set(usage), f"entries missing from ptxas output: {expected - set(usage)}"
    for name, line in usage.items():
        if only is None or name in only:
            assert "0 bytes spill stores, 0 bytes spill loads" in line, f"{name}: {line}"


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


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_hand_edited_ptx_assembles_without_spills(arch, tmp_path):
    result = subprocess.run([PTXAS, f"-arch={arch}", "-v", str(EDITED), "-o", str(tmp_path / "k.cubin")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_spills(result.stderr + result.stdout, set(ENTRIES))


def entries(ptx: str) -> dict[str, list[str]]:
    """Every .visible .entry with the types of its parameters."""
    found = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\(\s*(.*?)\)", ptx, re.S):
        found[m.group(1)] = re.findall(r"\.param \.(\w+) ", m.group(2))
    return found


def test_ptx_declares_the_entries_and_parameters_the_loader_expects():
    declared = entries(EDITED.read_text())
    for name, params in ENTRIES.items():
        assert name in declared, f"{name} is missing from {EDITED.name}"
        assert declared[name] == params, f"{name} takes {declared[name]}, the loader passes {params}"


def test_ptx_edits_are_in_place():
    ptx = "\n".join(normalised(EDITED.read_text()))  # code only, so comments can name what they replaced
    sigmoid = re.search(r"\.func .*?dense_sigmoid_f32\((.*?)\n}", ptx, re.S).group(1)
    assert "ex2.approx.ftz.f32" in sigmoid and "rcp.approx.ftz.f32" in sigmoid and "rcp.rn" not in sigmoid
    x4 = re.search(r"\.entry dense_sigmoid_grad_v1_x4_f32\((.*?)\n}", ptx, re.S).group(1)
    # all loads of g and y and all stores of dz are 128-bit; the one scalar store left writes db
    assert "ld.global.f32" not in x4 and x4.count("st.global.f32") == 1
    assert x4.count("ld.global.v4.f32") >= 2 and "st.global.v4.f32" in x4
    text = EDITED.read_text()
    assert text.count("EDIT-A") >= 1 and text.count("EDIT-B") >= 3 and "EDIT(" not in text


def normalised(ptx: str) -> list[str]:
    """Code lines only, with nvcc's path hash blanked: ptx/sass_report.py's, the one that
    compares the two PTX files there too."""
    import importlib.util

    if "sass_report" not in sys.modules:
        spec = importlib.util.spec_from_file_location("sass_report", ROOT / "ptx" / "sass_report.py")
        module = sys.modules["sass_report"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["sass_report"].normalised(ptx)


def function_of(lines: list[str], index: int) -> str:
    for line in reversed(lines[: index + 1]):
        m = re.match(r"\.(?:visible \.entry|func)\s+(?:\(.*?\)\s*)?(\w+)\(", line)
        if m:
            return m.group(1)
    return "(top level)"


@needs_nvcc
@pytest.mark.slow
def test_edited_ptx_differs_from_the_compilers_only_where_marked(tmp_path):
    """The committed PTX is the compiler's PTX of ptx/lesson_kernels.cu plus the marked edits:
    a change to the kernels without redoing the edits fails here."""
    ptx = EDITED.read_text()
    ours = re.search(r"Cuda compilation tools, release [\d.]+, V[\d.]+", ptx).group(0)
    nvcc = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
    if ours not in nvcc:
        pytest.skip(f"the committed PTX came from {ours}; this nvcc differs, so its PTX would too")
    generated = tmp_path / "generated.ptx"
    result = subprocess.run([NVCC, "-ptx", "-arch=sm_80", "-O3", "-std=c++17", str(LESSON), "-o", str(generated)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = normalised(generated.read_text()), normalised(ptx)
    touched = set()
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, _, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            touched.add(function_of(after, j1) if j2 > j1 else function_of(before, i1))
    assert touched == {"dense_sigmoid_f32", "dense_sigmoid_grad_v1_x4_f32"}, touched


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


def test_bench_candidates_table_shows_each_candidates_shape_and_who_was_not_timed():
    """cuda/bench_gpu.py candidates: its table on a made-up record (the part itself needs a GPU)."""
    bench, _sr = load_script("cuda/gpu_tables.py"), load_script("cuda/static_report.py")
    ratio = {"speed": 1.25, "ci": [1.2, 1.3]}
    row = {"forward_us": 100.0, "spread_us": 2.0, "gflops": 1.0, "of_reference": ratio, "of_version_0": ratio}
    record = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26", "command": "python cuda/bench_gpu.py candidates",
              "candidates": {"rounds": 3, "candidates": [list(s) for s in _sr.TUNE_CANDIDATES[:2]], "timed": [1],
                             "checked": [{"candidate": 0, "ok": False}, {"candidate": 1, "ok": True}],
                             "shapes": {"32×4096×4096": {"shape": [32, 4096, 4096], "rows": [
                                 {"line": "version 0", **row}, {"line": "candidate 1", **row}]}}}}
    text = bench.table(record)
    bm, bn, bk, wm, wn, tm, tn, minb = _sr.TUNE_CANDIDATES[1]
    assert f"| 32, 4096, 4096 | candidate 1 | {bm}×{bn}×{bk}, {wm}×{wn} ({tm}×{tn}), {minb} | 100 (2) |" in text
    assert "| 1.250 (1.200–1.300) | 1.250 (1.200–1.300) |" in text
    assert "Not timed (failed the float64 check): 0." in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
