"""The chapters as text: prose within its word budgets, and what their exercises' answers claim
(the answers a reader checks by running something; the chapters' tables are docs/render.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

import cli
from conftest import REASONS, ROOT, exercise, fold, load_script, repository_copy, sci

render = load_script("docs/render.py")
needs_triton = pytest.mark.skipif(REASONS["triton"] is not None, reason=f"mode triton: {REASONS['triton']}")


# ---------------------------------------------------------------------------------------
# Word budgets: prose only
# ---------------------------------------------------------------------------------------
def test_prose_leaves_out_fenced_code_and_comments():
    text = textwrap.dedent("""\
        One two three.

        ```python
        not counted at all
        ```

        1. Four five:

           ~~~bash
           echo not counted
           ~~~
        <!-- code: a.py#b -->
        ````
        ```
        still code
        ````
        six
        """)
    assert render.prose_words(text) == 7  # One two three. 1. Four five: six
    assert render.prose_words("```\nan unclosed fence hides the rest\n") == 0


def test_every_chapter_and_all_markdown_keep_to_their_prose_budgets():
    lines, over = render.word_report(ROOT)
    assert not over, "\n".join(over + lines)
    chapters = {line.split()[1] for line in lines if "(budget" in line and "in all" not in line}
    assert chapters == set(render.CHAPTERS)  # every chapter has its own budget, and the report covers it
    assert render.budget("parallel/collectives/README.md") == 6_000 and render.budget("py/README.md") == 5_000
    assert render.budget("cuda/README.md") == 6_000 and render.budget("cuda/tensor_cores/README.md") == 5_000
    assert render.BUDGET_ALL == 34_000


# ---------------------------------------------------------------------------------------
# Chapter 6's exercises (tiles/README.md)
# ---------------------------------------------------------------------------------------
SPILLS = """
import json, os, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
os.environ["TRITON_INTERPRET"] = "0"  # before kernels.py is loaded: @triton.jit compiles
import importlib.util
spec = importlib.util.spec_from_file_location("compiler_report", {root!r} + "/tiles/compiler_report.py")
report = sys.modules["compiler_report"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)
kernels = report.compiled_kernels()
out = {{}}
for warps in (8, 4):
    config = {{**kernels.BACKWARD_CONFIG, "num_warps": warps}}
    c = report.compile_kernel(kernels, "grad_x_kernel", "f32", "ieee", config)
    folder = Path(tempfile.mkdtemp())
    (folder / "k.ptx").write_text(c.asm["ptx"])
    log = subprocess.run([report._ptxas(), "-v", f"--gpu-name=sm_{{report.ARCH}}a", str(folder / "k.ptx"),
                          "-o", str(folder / "k.cubin")], capture_output=True, text=True, check=True)
    usage = report.disasm.parse_ptxas(log.stdout + log.stderr)[c.metadata.name]
    out[warps] = {{"registers": usage["registers"], "spills": usage["spill_stores"] + usage["spill_loads"]}}
print(json.dumps(out))
"""


@needs_triton
@pytest.mark.slow
def test_grad_x_spills_at_4_warps_and_not_at_8():
    """Exercise 2's answer: BACKWARD_CONFIG's tile with 4 warps spills for sm_90; with its 8, not."""
    import triton

    if triton.__version__ != "3.6.0":
        pytest.skip(f"the exercise names Triton 3.6.0; this is {triton.__version__}")
    result = subprocess.run([sys.executable, "-c", SPILLS.format(root=str(ROOT))], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    usage = {int(k): v for k, v in json.loads(result.stdout.splitlines()[-1]).items()}
    assert usage[8]["spills"] == 0, usage
    assert usage[4]["spills"] > 0 and usage[4]["registers"] > usage[8]["registers"], usage


DOT = """
import importlib.util, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
spec = importlib.util.spec_from_file_location("kernels_under_test", sys.argv[1])
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((5, 7), (3, 7), (3,)))
y = torch.empty(5, 3, dtype=torch.float64)
k.forward_kernel[(1, 1)](x, w, b, y, 5, 3, 7, 7, 1, 7, 1, 1, 3, 1, HAS_BIAS=True, PRECISION="ieee",
                         BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
assert torch.allclose(y, torch.sigmoid(x @ w.t() + b))
"""


@needs_triton
@pytest.mark.slow
def test_the_interpreter_refuses_a_float64_dot_without_out_dtype(tmp_path):
    """Exercise 4's answer: without out_dtype=acc.dtype, Triton 3.6.0's front end (which the
    interpreter runs) stops a float64 product with an assertion; with it, the kernel is right."""
    import triton

    if triton.__version__ != "3.6.0":
        pytest.skip(f"the exercise names Triton 3.6.0; this is {triton.__version__}")
    source = (ROOT / "tiles" / "kernels.py").read_text()
    assert source.count(", out_dtype=acc.dtype") == 3  # the exercise's three tl.dot calls
    for name, text, ok in (("kept.py", source, True),
                           ("removed.py", source.replace(", out_dtype=acc.dtype", ""), False)):
        (tmp_path / name).write_text(text)
        result = subprocess.run([sys.executable, "-c", DOT, str(tmp_path / name)], capture_output=True, text=True,
                                timeout=300, cwd=ROOT)
        assert (result.returncode == 0) == ok, result.stderr[-3000:]
        if not ok:
            assert "AssertionError" in result.stderr, result.stderr[-3000:]


# ---------------------------------------------------------------------------------------
# Chapter 3 (cuda/README.md): the worklog's figures against the records they come from
# ---------------------------------------------------------------------------------------
CUDA_CHAPTER = ROOT / "cuda" / "README.md"
RESULTS = ROOT / "docs" / "results"


def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _entry(version: int) -> str:
    """Worklog entry '#### vN · ...' of chapter 3, as written (markers and excerpts included)."""
    text = CUDA_CHAPTER.read_text()
    start = text.index(f"\n#### v{version} · ")
    return text[start:start + 1 + re.search(r"\n#{2,4} ", text[start + 1:]).start()]


def _timed() -> dict[str, dict]:
    return {r["line"]: r for r in _record("cuda_gpu_h100.json")["gemm"]["rows"]}


def _ncu() -> dict[str, dict]:
    return {k["kernel"]: k["metrics"] for k in _record("ncu_gemm_h200.json")["kernels"]}


def _static() -> dict[str, dict]:
    return {r["name"]: r for r in _record("cuda_static_sm90.json")["kernels"]}


def _counted(shape: int) -> dict[str, dict]:
    """The counters' record (cuda/counters.py) at shape³: each kernel's counts."""
    return {k["kernel"]: k["metrics"] for k in _record("counters.json")["kernels"] if k["shape"] == [shape] * 3}


def _nt(v: int) -> str:
    return f"dense_gemm_v{v}_nt_f32"


def test_chapter_3_gives_every_version_an_entry_with_code_prediction_and_its_time_or_the_record_it_waits_for():
    versions = cli.load_file("cuda/catalog.py").cuda_core_versions()
    timed = _timed()
    for v in versions:
        entry = _entry(v)
        assert "<!-- code: cuda/kernels/" in entry and "*Predicted" in entry and "*Static:*" in entry, f"v{v}"
        said = fold(entry)
        if f"v{v}" in timed:
            r = timed[f"v{v}"]
            assert f"*Measured:* {r['forward_us']:,.0f} µs, {100 * r['of_cublas']['speed']:.1f}%" in said, f"v{v}"
        else:
            assert re.search(r"\*Measured:\* not yet timed.*`cuda_(gpu|kernels)_\{card\}\.json`", said), f"v{v}"
    # the backward's three kernels: each its code, one prediction and the record they wait for
    text = CUDA_CHAPTER.read_text()
    backward = fold(text[text.index("### The backward's kernel"):text.index("## The code, in the order")])
    for v in (1, 2, 3):
        assert f"<!-- code: cuda/kernels/sigmoid_grad.cuh#grad-v{v} -->" in backward
    assert "*Predicted*" in backward
    assert "not yet timed (the `grad` part's record, `cuda_kernels_{card}.json`)" in backward


def test_chapter_3_gains_and_stalls_are_the_records_ratios():
    t = {v: _timed()[f"v{v}"]["forward_us"] for v in range(1, 10)}
    assert round(100 * (t[3] / t[4] - 1)) == 11 and "only 11% faster than v3" in fold(_entry(4))
    assert 1.9 < t[5] / t[6] < 2.0 and "twice v5" in fold(_entry(6))
    assert round(100 * (t[6] / t[7] - 1)) == 5 and "59.8%, +5%" in fold(_entry(7))
    assert round(100 * (t[7] / t[8] - 1)) == 24 and "74.4%, +24%" in fold(_entry(8))
    assert round(100 * (t[9] / t[8] - 1), 1) == 3.6 and "3.6% more time than v8" in fold(_entry(9))
    shares = [round(100 * _timed()[f"v{v}"]["of_cublas"]["speed"]) for v in (5, 6, 7, 8)]
    assert f"run at {shares[0]}%, {shares[1]}%, {shares[2]}% and {shares[3]}%" in fold(_entry(8))
    # the goals' third row is version 0 at B = 32, which float32 gives to v9 (cuda/gemm_choice.h)
    small = _record("cuda_gpu_h100.json")["goals"]["goals"]["forward, B=32"]
    assert "{kSmallBatch, kF32, 9}" in (ROOT / "cuda" / "gemm_choice.h").read_text()
    assert f"{small['cuda_us']:.0f} µs, the reference {small['reference_us']:.0f}" in fold(_entry(9))


def test_chapter_3_explains_the_jumps_with_ncus_and_the_compilers_figures():
    ncu, static = _ncu(), _static()

    def pct(v: int, metric: str) -> str:
        return f"{ncu[_nt(v)][metric]:.0f}%"

    occupancy = "sm__warps_active.avg.pct_of_peak_sustained_active"
    sm = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
    v4 = fold(_entry(4))
    assert static[_nt(4)]["registers"] == 78 and static[_nt(4)]["blocks_per_sm"] == 1
    assert static[_nt(4)]["threads"] * static[_nt(4)]["blocks_per_sm"] // 32 == 16
    assert f"from {pct(3, occupancy)} to {pct(4, occupancy)}, SM throughput from {pct(3, sm)} to {pct(4, sm)}" in v4
    assert "78 registers in `nt`: one block of 512 threads per SM, 16 warps" in v4
    v6 = fold(_entry(6))
    assert (static[_nt(5)]["registers"], static[_nt(6)]["registers"]) == (170, 115)
    assert (static[_nt(5)]["blocks_per_sm"], static[_nt(6)]["blocks_per_sm"]) == (1, 2)
    assert f"({pct(5, occupancy)} → {pct(6, occupancy)}), SM throughput {pct(5, sm)} → {pct(6, sm)}" in v6
    assert "115 registers (v5: 170): two blocks, 16 warps, per SM" in v6
    v8 = fold(_entry(8))
    loops = {v: static[_nt(v)]["inner_loop"] for v in (7, 8)}
    assert (loops[7]["instructions"], loops[8]["instructions"], loops[8]["fma"]) == (1266, 707, 512)
    assert (loops[7]["ldg"]["32"], loops[8]["ldg"]["32"]) == (48, 8) and (loops[7]["bar"], loops[8]["bar"]) == (2, 1)
    assert "707 instructions for its 512 FFMAs where v7's issues 1,266 (its 48 32-bit global loads" in v8
    assert f"SM throughput {pct(7, sm)} → {pct(8, sm)}" in v8
    for v, regs in ((1, 26), (3, 32), (9, 124), (10, 126), (11, 229), (12, 119)):
        assert static[_nt(v)]["registers"] == regs and f"{regs} registers" in fold(_entry(v)), v
    assert static["dense_gemm_v9_nn_f32"]["registers"] == 130 and static["dense_gemm_v9_nn_f32"]["blocks_per_sm"] == 1
    v2 = fold(_entry(2))
    t_nn = {v: ncu[f"dense_gemm_v{v}_nn_f32"]["gpu__time_duration.sum"] / 1e3 for v in (1, 2)}
    assert f"{t_nn[2]:,.0f} µs against v1's {t_nn[1]:,.0f}" in v2


def test_chapter_3_counted_figures_are_the_records_counts_at_4096():
    c = _counted(4096)
    ld_req, ld_sec = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
    wf_ld, wf_st = ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")
    x_ld, x_st = "excessive_wavefronts_mem_shared_op_ld", "excessive_wavefronts_mem_shared_op_st"
    warp_ffma = 4096 ** 3 / 32

    def m(v: int, key: str) -> float:
        return c[_nt(v)][key]

    assert f"16.5 sectors per load request, the mean of the two; {sci(m(1, ld_req))} requests" in fold(_entry(1))
    assert m(1, ld_sec) / m(1, ld_req) == pytest.approx(16.5, abs=0.01)
    v3 = fold(_entry(3))
    spr = m(3, ld_sec) / m(3, ld_req)
    assert f"load requests {sci(m(1, ld_req))} → {sci(m(3, ld_req), 3)}, {spr:.2f} sectors" in v3
    assert m(3, wf_ld) / warp_ffma == 2 and m(3, x_ld) == 0 and f"{sci(m(3, wf_ld))} shared wavefronts" in v3
    assert f"shared wavefronts {sci(m(3, wf_ld))} → {sci(m(4, wf_ld))}" in fold(_entry(4))
    assert m(4, ld_req) / m(3, ld_req) == pytest.approx(0.5, rel=0.01)
    assert m(5, ld_req) / m(4, ld_req) == pytest.approx(0.5, rel=0.01)
    v5 = fold(_entry(5))
    assert f"{sci(m(4, wf_ld))} → {sci(m(5, wf_ld))}, a third of them excessive" in v5
    assert m(5, x_ld) / m(5, wf_ld) == pytest.approx(1 / 3)
    v6 = fold(_entry(6))
    assert f"load requests {sci(m(5, ld_req))} → {sci(m(6, ld_req))}, sectors {sci(m(5, ld_sec))} → " \
           f"{sci(m(6, ld_sec))} (16 a request" in v6
    assert m(6, ld_sec) / m(6, ld_req) == 16 and m(6, x_st) == c[_nt(6)]["smsp__inst_executed_op_shared_st.sum"]
    assert round(100 * (m(7, wf_ld) / m(6, wf_ld) - 1)) == -33 and m(7, x_ld) == 0
    shared_v6 = (m(6, wf_ld) + m(6, wf_st)) / warp_ffma
    shared_ms = shared_v6 * 4096 ** 3 / 32 / (132 * 1.98e9) * 1e3
    assert f"({shared_v6:.2f} wavefronts per warp FFMA: {shared_ms:.1f} ms of its 4.9)" in fold(_entry(7))
    assert c[_nt(7)] == {k: v for k, v in c[_nt(8)].items()}  # "v7's counts, every one"
    assert c[_nt(9)] == c[_nt(8)]
    v10 = fold(_entry(10))
    assert m(8, x_st) > 0 and m(10, x_st) == 0 and f"(counted: {sci(m(8, x_st))} → 0)" in v10
    w = {v: (m(v, wf_ld) + m(v, wf_st)) / warp_ffma for v in (8, 10, 11, 12)}
    assert f"shared wavefronts per warp FFMA {w[8]:.3f} → {w[10]:.3f}" in v10
    v11 = fold(_entry(11))
    fewer = round(100 * (1 - m(11, wf_ld) / m(10, wf_ld)))
    assert f"shared load wavefronts −{fewer}% (counted: {sci(m(10, wf_ld))} → {sci(m(11, wf_ld))})" in v11
    st_req, st_sec = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
    assert (m(10, st_sec) / m(10, st_req), m(11, st_sec) / m(11, st_req)) == (32, 16)
    assert "store sectors per request 32 → 16" in v11
    # the backward's kernels at 4096×4096: coalesced loads, no excessive wavefront
    for v in (1, 2, 3):
        k = c[f"dense_sigmoid_grad_v{v}_f32"]
        assert k[ld_sec] / k[ld_req] == 4 and k[x_ld] == k[x_st] == 0


def test_chapter_3_prediction_arithmetic():
    """The worklog's arithmetic: an SM issues 4 warp FFMAs and serves one shared wavefront a clock
    (132 SMs at 1.98 GHz); the issue bound counts the loop's instructions per FFMA less about 4 per
    32-bit global load of the tail path full tiles never take; the predictions scale the larger
    bound by v8's measured ratio to it."""
    said = fold(CUDA_CHAPTER.read_text())
    warp_ffma = 4096 ** 3 / 32
    ffma_ms = warp_ffma / (132 * 4 * 1.98e9) * 1e3
    wavefront_ms = warp_ffma / (132 * 1.98e9) * 1e3
    assert f"4096³ is {sci(warp_ffma, 3)} warp FFMAs, {ffma_ms:.2f} ms at the peak" in said
    assert f"each shared wavefront per warp FFMA can cost {wavefront_ms:.2f} ms" in said
    static = _static()

    def issue_ms(v: int) -> float:
        loop = static[_nt(v)]["inner_loop"]
        return (loop["instructions"] - 4 * loop["ldg"].get("32", 0)) / loop["fma"] * ffma_ms

    assert round(issue_ms(10), 1) == round(issue_ms(11), 1) == 2.7
    assert "issue (2.7 ms) binds both" in fold(_entry(10)) and "issue still at 2.7 ms" in fold(_entry(11))
    v8_us = _timed()["v8"]["forward_us"]
    assert round(v8_us / 1e3 / issue_ms(8), 2) == 1.40 and "(1.40 times the larger of the" in said
    goal = _record("cuda_gpu_h100.json")["goals"]["goals"]["forward"]
    assert f"None reaches the 0.90 goal ({goal['reference_us'] / 0.9 / 1e3:.2f} ms)" in said
    # the backward's kernels read g and y and write dz: 12 bytes an element at 3.35 TB/s
    assert round(3 * 4096 * 4096 * 4 / 3.35e12 * 1e6) == 60 and "60 µs at 4096×4096" in said


def test_chapter_3_says_which_entry_spills_as_the_static_record_has_it():
    archs = _record("cuda_static_sm90.json")["archs"]
    spills = {(arch, name): (e["spill_stores"], e["spill_loads"]) for arch, figures in archs.items()
              for name, e in figures["entries"].items() if e["spill_stores"] or e["spill_loads"]}
    assert sorted(archs) == ["sm_80", "sm_90a"] and spills == {("sm_80", "dense_gemm_v4_nt_f32"): (8, 8)}
    assert "none spills but v4's `nt` float32 kernel on sm_80 (8 bytes)" in fold(CUDA_CHAPTER.read_text())


def test_chapter_3_slices_of_v9_and_v12_at_b32():
    sr = load_script("cuda/static_report.py")
    assert sr.splitk_slices(32, 4096, 4096, 128, 128, 132) == 5 and "5 slices at B = 32 on 132 SMs" in fold(_entry(9))
    assert sr.splitk_slices(4096, 4096, 4096, 128, 128, 132) == 1
    tiles, places = (32 // 32) * (4096 // 128), 132 * 4
    asked = -(-places // tiles)
    slices = sr.skinny_slices(32, 4096, 4096, 32, 128, 16, 4, 132)
    assert (asked, slices, 4096 // 16) == (17, 16, 256) and (256 // 16) == slices  # 16 steps of 16 a slice
    v12 = fold(_entry(12))
    assert f"⌈{places}/{tiles}⌉ = {asked} slices" in v12 and f"{places} places" in v12
    blocks = tiles * slices
    assert f"{slices} slices, {blocks} blocks, all resident at once, {places - blocks} places empty" in v12
    assert _static()[_nt(12)]["napkin"]["slices"] == slices and _static()[_nt(12)]["blocks_per_sm"] == 4


def test_chapter_3_bandwidth_claims_are_the_figures_numbers():
    figures = load_script("cuda/figures.py")
    r = figures.roofline(_record("cuda_gpu_h100.json"), _record(figures.STATIC))
    p = {q["version"]: q for q in r["points"]}
    said = fold(CUDA_CHAPTER.read_text())
    worst = max(range(3, 10), key=lambda v: p[v]["dram_share"])
    assert worst == 8 and f"at most {100 * p[8]['dram_share']:.0f}% of the measured time (v8)" in said
    assert {round(100 * p[v]["dram_share"]) for v in (1, 2)} == {60}
    assert f"v1 and v2 ask {sci(p[1]['requested_bytes'])} bytes, 60% of their time" in said
    roof = [100 * p[v]["of_roof"] for v in range(5, 10)]
    assert f"reach {min(roof):.0f}% to {max(roof):.0f}% of the FFMA roof" in said
    assert max(k["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"]
               for k in _record("ncu_gemm_h200.json")["kernels"]) < 2
    assert 3 * 2048 * 2048 * 4 / 2 ** 20 == 48 and _record("ncu_gemm_h200.json")["device"] == "NVIDIA H200"


def test_chapter_3_bank_conflict_paragraph_is_the_records_counts_at_2048():
    c, ncu = _counted(2048), _ncu()
    said = fold(CUDA_CHAPTER.read_text())
    x_ld, x_st = "excessive_wavefronts_mem_shared_op_ld", "excessive_wavefronts_mem_shared_op_st"
    bank = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{}.sum"
    # v5, v6: 4 excessive a load of Bs (256 blocks × 8 warps × 256 k-steps × 16 loads of Bs)
    assert c[_nt(5)][x_ld] == c[_nt(6)][x_ld] == 4 * 256 * 8 * 256 * 16 == 33_554_432
    assert f"{ncu[_nt(5)][bank.format('ld')]:.2g}" == "3.4e+07" and "4 excessive wavefronts a load, 33,554,432" in said
    stores = [c[_nt(v)][x_st] for v in range(6, 10)]
    assert set(stores) == {4_194_304} and "one excessive wavefront per store, 4,194,304" in said
    counter = [ncu[_nt(v)][bank.format("st")] / 1e6 for v in range(6, 10)]
    assert f"{min(counter):.1f}-{max(counter):.1f} million" in said
    assert c[_nt(12)][x_st] == 10_485_760 == c[_nt(12)]["smsp__inst_executed_op_shared_st.sum"]
    assert f"{_counted(4096)[_nt(12)][x_st]:.3g}" == "8.39e+07" and "(8.39e7 at 4096³)" in said
    shares = [ncu[_nt(v)][bank.format("st")] / c[_nt(v)]["smsp__inst_executed_op_shared_st.sum"] for v in (3, 4, 5)]
    assert all(c[_nt(v)][x_st] == 0 for v in (3, 4, 5))
    assert f"{100 * min(shares):.0f}-{100 * max(shares):.0f}% counted where the addresses make none" in said


def _counters_record(tmp_path, *args: str) -> dict[str, dict]:
    out = tmp_path / "counts.json"
    result = subprocess.run([sys.executable, "cuda/counters.py", *args, "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}


needs_counters = pytest.mark.skipif(load_script("cuda/counters.py").unavailable_reason() is not None,
                                    reason="the counting build needs GCC's g++")


@needs_counters
@pytest.mark.slow
def test_chapter_3_ldgsts_of_v8s_backward_products_at_4096(tmp_path):
    c = _counters_record(tmp_path, "--shape", "4096", "4096", "4096", "--kernels", "8:nn", "8:tn")
    req = "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"
    sec = "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"
    nn, tn = c["dense_gemm_v8_nn_f32"], c["dense_gemm_v8_tn_f32"]
    assert (nn[req], tn[req]) == (4_194_304, 8_388_608) and nn[sec] / nn[req] == tn[sec] / tn[req] == 16
    assert nn["excessive_wavefronts_mem_shared_op_ldgsts"] == tn["excessive_wavefronts_mem_shared_op_ldgsts"] == 0
    assert "v8's nn makes 4,194,304 LDGSTS requests, its tn 8,388,608, 16 sectors each, none excessive" in \
        fold(CUDA_CHAPTER.read_text())


@needs_counters
@pytest.mark.slow
def test_chapter_3_v12_against_v9_counted_at_b32(tmp_path):
    c = _counters_record(tmp_path, "--shape", "32", "4096", "4096", "--kernels", "9:nt", "12:nt", "--sm-count", "132")
    v9, v12 = c[_nt(9)], c[_nt(12)]
    ld_req = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
    wf = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
    assert v9[ld_req] == v12[ld_req]  # W once, and x once per tile, in both
    assert f"shared load wavefronts {sci(v9[wf], 3)} → {sci(v12[wf], 3)}" in fold(_entry(12))
    assert v12["excessive_wavefronts_mem_shared_op_st"] == v12["smsp__inst_executed_op_shared_st.sum"]


# Chapter 3's exercises: each edit made in a copy of the repository, the command run as written there


def test_chapter_3_answer_3_is_what_the_slices_command_prints():
    question = exercise(CUDA_CHAPTER, 3, "question")
    command = re.search(r"`(python cuda/emulated.py --slices [\d ]+)`", question).group(1)
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [int(x) for x in re.findall(r"SMs: (\d+)", result.stdout)]
    assert exercise(CUDA_CHAPTER, 3, "answer").startswith(f"{got[0]}, {got[1]}, {got[2]} and {got[3]}.")
    assert got == [1, 1, 4, 5]


@pytest.mark.slow
def test_chapter_3_answer_2_is_what_the_emulation_prints(tmp_path):
    question = exercise(CUDA_CHAPTER, 2, "question")
    line = re.search(r"add `([^`]+)` after", question).group(1)
    copy = repository_copy(tmp_path)
    kernel = copy / "cuda" / "kernels" / "v3_smem.cuh"
    source = kernel.read_text()
    anchor = "  const int64_t m = int64_t(blockIdx.y) * S + ty, n = int64_t(blockIdx.x) * S + tx;\n"
    assert source.count(anchor) == 1, "the exercise's line that computes m and n"
    kernel.write_text(source.replace(anchor, anchor + f"  {line}\n"))
    command = re.search(r"run `(python grad_check.py [^`]+)`", question).group(1)
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=copy, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode != 0 and "FAIL" in result.stdout, result.stdout[-3000:]
    printed = re.search(r"on stderr `([^`]+)`", exercise(CUDA_CHAPTER, 2, "answer")).group(1)
    assert printed in fold(result.stderr), result.stderr[-3000:]


@needs_counters
@pytest.mark.slow
def test_chapter_3_answer_4_is_what_the_counters_count_without_the_padding(tmp_path):
    question = exercise(CUDA_CHAPTER, 4, "question")
    command = re.search(r"`(python cuda/counters.py [^`]+)`", question).group(1).split()[1:]
    copy = repository_copy(tmp_path)
    source = copy / "cuda" / "kernels" / "sigmoid_grad.cuh"
    assert source.read_text().count("kGradCols + 1") == 3  # "in its three places"
    source.write_text(source.read_text().replace("kGradCols + 1", "kGradCols"))
    counts = {}
    for where, name in ((ROOT, "before"), (copy, "after")):
        out = tmp_path / f"{name}.json"
        result = subprocess.run([sys.executable, *command, "--json", str(out)], cwd=where, capture_output=True,
                                text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        counts[name] = {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}
    x, loads = "excessive_wavefronts_mem_shared_op_ld", "smsp__inst_executed_op_shared_ld.sum"
    answer = exercise(CUDA_CHAPTER, 4, "answer")
    for v in (1, 2, 3):
        assert counts["before"][f"dense_sigmoid_grad_v{v}_f32"][x] == 0
    assert counts["after"]["dense_sigmoid_grad_v1_f32"] == counts["before"]["dense_sigmoid_grad_v1_f32"]
    for v in (2, 3):
        after = counts["after"][f"dense_sigmoid_grad_v{v}_f32"]
        assert after[x] == 31 * after[loads]
        assert f"{after[x]:,.0f} for v{v}'s {after[loads]:,.0f}" in answer, (v, after[x], after[loads])
    assert "to 31 per shared load" in answer and "v1 does not change" in answer
