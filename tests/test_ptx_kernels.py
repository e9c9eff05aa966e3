"""The PTX stage's kernels, checked without a GPU: the hand-edited PTX (ptx/dense_kernels.ptx)
assembles for every architecture without spills, declares the entries and parameters
ptx/loader.cpp expects, carries its marked edits, and differs from what the compiler makes of
ptx/lesson_kernels.cu only where they are marked. (The other GPU sources: tests/test_gpu_sources.py.)"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys

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
    return load_script("ptx/sass_report.py").normalised(ptx)


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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
