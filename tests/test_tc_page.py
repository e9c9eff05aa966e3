"""The tensor-core chapter (cuda/tensor_cores/README.md): its shape, what it links and names, its budget,
and the exercises' answers, which are what their commands print (the slow ones on a copy of the
repository, edited as the exercise says). Its numbers are number markers written from the records and
the kernels' sources by cuda/tensor_cores/page_numbers.py (python docs/render.py --check flags a stale
one); tests/test_tc_sources.py checks the facts of the code and records the prose rests on.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, exercise, load_script, repository_copy
from record_info import sci

PAGE = ROOT / "cuda" / "tensor_cores" / "README.md"
RESULTS = ROOT / "docs" / "results"


def _entries() -> dict[str, str]:
    """The worklog entries ('#### vNN · ...'), each up to the next heading, by their versions' ids."""
    text = PAGE.read_text()
    found = {}
    for m in re.finditer(r"^#### (.*?) · .*?$(.*?)(?=^#{2,4} )", text, re.M | re.S):
        for v in re.findall(r"v(\d+)", m.group(1)):
            found[v] = m.group(2)
    return found


def test_every_tensor_core_version_has_an_entry_with_code_and_a_prediction():
    catalog = load_script("cuda/catalog.py")
    entries = _entries()
    assert sorted(map(int, entries)) == [v.id for v in catalog.versions() if v.id >= 21]
    for v, entry in entries.items():
        assert "<!-- code: cuda/tensor_cores/" in entry and "*Predicted" in entry, v
        assert re.search(r"\*Measured:\* not yet timed \(record `cuda_kernels_\{card\}\.json`, parts? `",
                         " ".join(entry.split())), v


def test_no_timing_is_claimed_until_the_lease_brings_its_record():
    """The page says "not yet timed" and shows no GPU marker: true only while no tensor-core timing
    is committed. When the lease's record lands, this fails until the page shows it."""
    kernels = sorted(RESULTS.glob("cuda_kernels_*.json"))
    assert not kernels, f"{[p.name for p in kernels]} committed: show it (gpu_roof, gpu_tf32, gpu_goals16 markers)"
    assert not re.search(r"<!-- gpu_(roof|tf32|goals16):", PAGE.read_text())


def test_the_parts_the_page_names_are_the_leases():
    """Each `part` an entry's "Measured" names, and the lease's parts, are .ci/gpu.py's."""
    plan = load_script(".ci/gpu.py")
    kernels = plan.parts()["kernels"]
    assert {"exact", "kernels"} <= set(plan.SELECTIONS["lease"])
    assert kernels.records == ("docs/results/cuda_kernels_{tag}.json",)
    named = set()
    for one, more in re.findall(r"parts? `(\w+)`((?:(?:,| and) `\w+`)*)", " ".join(PAGE.read_text().split())):
        named |= {one, *re.findall(r"`(\w+)`", more)}
    assert {"roof", "tf32", "bf16", "goals16"} <= named
    assert named - {"exact", "kernels"} <= set(kernels.argv), named


def test_the_page_shows_every_figure_the_script_draws():
    figures = load_script("cuda/tensor_cores/figures.py")
    for name in figures.NAMES:
        assert f"(../../docs/figures/{name})" in PAGE.read_text(), name
        assert (ROOT / "docs" / "figures" / name).is_file(), name


def test_the_pages_links_exist():
    for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", PAGE.read_text()):
        if "://" not in link:
            assert (PAGE.parent / link).exists(), link


def test_the_tests_the_page_names_exist():
    """Each test the page names is a test of the emulator's instructions (tests/test_instructions.py,
    tests/test_hopper.py), and those files plant each wrong definition the page lists."""
    sources = {f: (ROOT / "tests" / f).read_text() for f in ("test_instructions.py", "test_hopper.py")}
    named = set(re.findall(r"`(test_\w+)(?:\[[^\]]*\])?`", PAGE.read_text()))
    assert len(named) >= 15
    for name in named:
        assert any(f"def {name}(" in text for text in sources.values()), name
    for plant, where in (("mma A rows and columns swapped", "test_instructions.py"),
                         ("ldmatrix .trans ignored", "test_instructions.py"),
                         ("accumulator table", "test_hopper.py"), ('"swizzle"', "test_hopper.py")):
        assert plant in sources[where], plant


def test_the_page_fits_its_budget_and_states_its_reading_time_once():
    render = load_script("docs/render.py")
    assert "cuda/tensor_cores/README.md" in render.CHAPTERS
    assert render.prose_words(PAGE.read_text()) <= render.budget("cuda/tensor_cores/README.md")
    render.reading_minutes(PAGE)  # exactly one "About N minutes to read", or an error


# ---------------------------------------------------------------------------------------
# The exercises' answers
# ---------------------------------------------------------------------------------------
def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def _commands(question: str) -> list[list[str]]:
    """The question's commands (`python ...`), as argument lists after "python"."""
    return [shlex.split(c)[1:] for c in re.findall(r"`(python [^`]+)`", question)]


def test_answer_3_is_the_descriptor_the_emulator_decodes():
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    question, answer = exercise(PAGE, 3, "question"), exercise(PAGE, 3, "answer")
    assert "smem_desc(As + 64, 16, 1024, kSwizzle128B)" in question
    header = (ROOT / "cuda" / "tensor_cores" / "v31_wgmma.cuh").read_text()
    assert "smem_desc(As + kk * 2, 16, 1024, kSwizzle128B)" in header  # K-major A: kk = 32, its third k-step
    value = (64 >> 4) | (16 >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62
    assert answer.startswith(f"`{value:#018x}`:")
    code = re.search(r'`python -c "(.*?)"`', question).group(1).replace("VALUE", hex(value))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"It prints `{result.stdout.strip()}`" in answer


needs_counters = pytest.mark.skipif(load_script("cuda/counters.py").unavailable_reason() is not None,
                                    reason="the counting build needs GCC's g++")


@needs_counters
@pytest.mark.slow
def test_answer_1_is_what_the_counters_count_with_the_weaker_swizzle(tmp_path):
    question, answer = exercise(PAGE, 1, "question"), exercise(PAGE, 1, "answer")
    counters, check = _commands(question)
    copy = repository_copy(tmp_path)
    _edit(copy / "cuda" / "tensor_cores" / "v22_v23_ldmatrix.cuh", "(c / 8) ^ (r % 8)", "(c / 8) ^ (r % 4)")
    out = tmp_path / "after.json"
    result = subprocess.run([sys.executable, *counters, "--json", str(out)], cwd=copy, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    m = {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}["dense_gemm_v23_nt_bf16"]
    requests = m["smsp__inst_executed_op_ldsm.sum"]
    wavefronts = m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"]
    assert wavefronts / requests == 8 and m["excessive_wavefronts_mem_shared_op_ld"] == wavefronts / 2
    assert answer.startswith("8 a request, 2 per matrix")
    assert f"({sci(wavefronts)} wavefronts for {requests:,.0f} requests, half of them excessive)" in answer
    passed = subprocess.run([sys.executable, *check], cwd=copy, capture_output=True, text=True, timeout=900)
    assert passed.returncode == 0 and "`grad_check.py` still passes" in answer, passed.stdout[-2000:]


@pytest.mark.slow
def test_answer_2_is_what_a_wrong_fragment_table_fails(tmp_path):
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    question, answer = exercise(PAGE, 2, "question"), exercise(PAGE, 2, "answer")
    copy = repository_copy(tmp_path)
    planted = "{g + 8 * (i >> 2), 2 * t + (i & 1) + 8 * ((i >> 1) & 1)}"
    assert f"`{planted}`" in question
    header = copy / "cuda" / "emulate" / "warp_matrix.h"
    assert f"return {planted};  // planted" in header.read_text()  # the planted line the question quotes
    _edit(header, "  return {g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)};\n",
          f"  return {planted};\n")
    tests, check = _commands(question)
    assert tests[:2] == ["-m", "pytest"]
    ran = subprocess.run([sys.executable, *tests, "-p", "no:cacheprovider"], cwd=copy, capture_output=True,
                         text=True, timeout=900)
    failed = re.findall(r"^FAILED (\S+)", ran.stdout, re.M)
    assert len(failed) == 5 and answer.startswith("Five tests"), ran.stdout[-3000:]
    assert "tests/test_instructions.py::test_fragment_tables_are_the_ptx_isas[m16n8k16.A]" in failed
    assert sum("test_mma_computes_a_times_b_plus_c_through_the_ptx_tables" in f for f in failed) == 4
    result = subprocess.run([sys.executable, *check], cwd=copy, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    fails = re.findall(r"^FAIL\s+(v\d+)\s", result.stdout, re.M)
    for v in ("v21", "v22", "v23", "v24"):
        assert fails.count(v) == 4, (v, fails)  # the output and the three gradients
    assert not {f for f in fails if f not in ("v0", "v21", "v22", "v23", "v24")}
    assert "fails v21 to v24 in every output and gradient" in answer
