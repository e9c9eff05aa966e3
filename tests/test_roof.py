"""The tensor cores' roofs (cuda/tensor_cores/roof.cuh) and cuda/bench_gpu.py's parts that measure
the tensor-core chapter on a GPU (roof, tf32, goals16), away from a GPU: the roof kernels run in
the CPU emulation and give their known exact sums, a wrong loop is caught by the same check the GPU
run applies, the error measurement runs on the emulated TF32 kernels, and each part's table renders
from a made-up record."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest
import torch

import timing
from conftest import ROOT, load_script

bench_gpu = load_script("cuda/bench_gpu.py")  # tiles/ has a bench_gpu.py too
gpu, tc = load_script("cuda/gpu_timing.py"), load_script("cuda/gpu_tensor_cores.py")
tables = load_script("cuda/gpu_tables.py")
emulated = load_script("cuda/emulated.py")
ROOF = ROOT / "cuda" / "tensor_cores" / "roof.cuh"
UNIT = ROOT / "cuda" / "units" / "tc_roof.cu"

needs_emulation = pytest.mark.skipif(emulated.unavailable_reason() is not None,
                                     reason=f"the emulation {emulated.unavailable_reason()}")


def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.emu_roof.argtypes, lib.emu_roof.restype = [ctypes.c_int] * 3 + [ctypes.c_void_p], ctypes.c_int
    lib.emu_roof_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    lib.emu_roof_info.restype = ctypes.c_int
    lib.emu_set_arch.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    if emulated.unavailable_reason():
        pytest.skip(emulated.unavailable_reason())
    return _typed(emulated.library())


def info(lib: ctypes.CDLL, kind: int) -> tuple[int, int]:
    got = (ctypes.c_int64 * 2)()
    assert lib.emu_roof_info(kind, got) == 0
    return int(got[0]), int(got[1])


def run_roof(lib: ctypes.CDLL, kind: int, blocks: int, iterations: int) -> torch.Tensor:
    threads, _ = info(lib, kind)
    out = torch.full((blocks * threads,), float("nan"))
    assert lib.emu_roof(kind, blocks, iterations, out.data_ptr()) == 0
    return out


# ---------------------------------------------------------------------------------------
# The kernels, in the emulation
# ---------------------------------------------------------------------------------------
@needs_emulation
def test_the_roofs_count_what_their_instructions_multiply():
    """FLOPs of one block's iteration from the instructions' shapes, written out here: 8 warps of
    8 chains of mma.sync m16n8k16; 2 warpgroups of 4 wgmma m64n256k16 (k = 64)."""
    lib = _typed(emulated.library())
    assert info(lib, tc.ROOFS["mma.sync"]) == (256, 8 * 8 * 2 * 16 * 8 * 16)
    assert info(lib, tc.ROOFS["wgmma"]) == (256, 2 * 4 * 2 * 64 * 256 * 16)
    assert lib.emu_roof_info(2, (ctypes.c_int64 * 2)()) == 1


@needs_emulation
@pytest.mark.parametrize("name", ["mma.sync", "wgmma"])
@pytest.mark.parametrize("blocks, iterations", [(1, 1), (3, 4)])
def test_a_roof_gives_its_known_exact_sum_in_the_emulation(lib, name, blocks, iterations):
    """Every operand 1.0: each thread's accumulators add up to half its FLOPs, checked by the
    function the GPU run checks with."""
    kind = tc.ROOFS[name]
    threads, flops = info(lib, kind)
    out = run_roof(lib, kind, blocks, iterations)
    assert tc.check_roof(out, flops, threads, iterations) is None
    # the same number written out by hand: a thread's 32 (mma.sync) or 128 (wgmma) accumulators,
    # each 16 (one m16n8k16) or 64 (four k16 steps) a iteration
    assert out.unique().tolist() == [iterations * (32 * 16 if name == "mma.sync" else 128 * 64)]


@needs_emulation
@pytest.mark.parametrize("name", ["mma.sync", "wgmma"])
def test_a_roof_that_skips_work_is_caught(lib, name):
    """A loop that ran one iteration fewer, or a thread that never wrote, fails the check."""
    kind = tc.ROOFS[name]
    threads, flops = info(lib, kind)
    short = run_roof(lib, kind, 2, 3)
    said = tc.check_roof(short, flops, threads, 4)
    assert said.startswith("thread 0 wrote ") and f"({2 * threads} of {2 * threads} threads wrong)" in said
    out = run_roof(lib, kind, 2, 4)
    out[threads + 5] = float("nan")
    assert tc.check_roof(out, flops, threads, 4).startswith(f"thread {threads + 5} wrote nan")


@needs_emulation
def test_the_roof_launch_refuses_what_it_cannot_run(lib):
    out = torch.empty(256)
    assert lib.emu_roof(2, 1, 1, out.data_ptr()) == 1  # no such kind
    assert lib.emu_roof(0, 0, 1, out.data_ptr()) == 1  # no blocks
    assert lib.emu_roof(0, 1, 0, out.data_ptr()) == 1  # no iterations
    assert lib.emu_roof(0, 1, 1, None) == 1
    lib.emu_set_arch(80)  # wgmma is sm_90a's; mma.sync runs on sm_80
    try:
        assert lib.emu_roof(1, 1, 1, out.data_ptr()) == 1
        assert lib.emu_roof(0, 1, 1, out.data_ptr()) == 0
    finally:
        lib.emu_set_arch(90)


@pytest.mark.slow  # a build of its own (the OS-thread emulation), which the slow suite makes anyway
@needs_emulation
def test_the_roofs_run_on_os_threads_too():
    """The OS-thread build (the one ThreadSanitizer needs) gives the same sums."""
    lib = _typed(emulated.load(("-DCUDA_EMU_THREADS",)))
    for name in ("mma.sync", "wgmma"):
        kind = tc.ROOFS[name]
        threads, flops = info(lib, kind)
        assert tc.check_roof(run_roof(lib, kind, 2, 2), flops, threads, 2) is None, name


def test_the_iterations_are_the_first_power_of_two_long_enough():
    def seconds(n: int) -> float:
        return 5e-6 + n * 1e-6  # a launch's cost, then 1 µs an iteration

    assert tc.roof_iterations(seconds, target_s=2e-3) == 2048
    assert tc.roof_iterations(seconds, target_s=1.0, cap=1 << 12) == 1 << 12
    assert tc.roof_iterations(seconds, target_s=0.0) == 64
    # every sum the check compares stays exact in float32 at the cap
    assert tc.ROOF_MAX_ITERATIONS <= 1 << 20


def test_each_tensor_core_version_is_judged_against_its_own_instruction():
    """The versions come from the header and TILES: part 1's mma.sync, part 2's wgmma."""
    assert tc.roof_versions("bf16") == [21, 22, 23, 24, 31, 32, 33, 35]
    assert {v: tc.roof_instruction(v) for v in (21, 24, 25, 26, 31, 33, 34, 35)} == {
        21: "mma.sync", 24: "mma.sync", 25: "mma.sync", 26: "mma.sync",
        31: "wgmma", 33: "wgmma", 34: "wgmma", 35: "wgmma"}
    assert tc.roof_instruction(12) is None and tc.roof_versions("f32") == [25, 26, 34]
    assert set(tc.ROOF_GOALS) <= {f"v{v}" for v in tc.roof_versions("bf16")}


# ---------------------------------------------------------------------------------------
# Compiled for both architectures: no spills; wgmma a trap on sm_80
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_roof_unit_compiles_without_spills(arch, tmp_path):
    result = subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O3", f"-arch={arch}", "-Xptxas", "-v", str(UNIT),
                             "-o", str(tmp_path / "roof.cubin")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    found = dict(re.findall(r"Compiling entry function '(\w+)'.*?\n.*?\n\s*(\d+ bytes stack frame, \d+ bytes spill "
                            r"stores, \d+ bytes spill loads)", log))
    assert set(found) == {"dense_roof_mma_bf16", "dense_roof_wgmma_bf16"}, log
    assert all(v == "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" for v in found.values()), found
    assert "wgmma serialization" not in log and "Potential Performance Loss" not in log


def test_the_roof_header_says_its_predictions_before_any_timing():
    text = ROOF.read_text()
    assert "989.4 TFLOP/s" in text and "unverified" in text and "Predicted" in text
    assert "132 SMs × 4,096 FLOP" in text and 132 * 4096 * 1.83e9 == pytest.approx(989.4e12, rel=1e-3)


# ---------------------------------------------------------------------------------------
# tf32: the error measurement, on the emulated kernels
# ---------------------------------------------------------------------------------------
@needs_emulation
def test_the_tf32_errors_are_measured_against_float64_and_cublas_float32s():
    """On the CPU the "cuBLAS" lines are torch's CPU GEMM; the versions are the emulated kernels.
    Plain TF32 (10 bits of mantissa) is hundreds of times float32's error; split-TF32 within the
    goal's 2x, in the emulation (the GPU's tensor cores sum differently: the lease measures them)."""
    errors = tc.tf32_errors([25, 26, 34], gpu.exact_check.emulation_gemm(emulated.SM_COUNT),
                                   device="cpu", sizes=(64, 256))
    for n in ("64", "256"):
        lines = errors[n]["lines"]
        assert lines["cuBLAS float32"]["of_cublas_f32"] == 1.0 and 0 < lines["cuBLAS float32"]["max_abs"] < 1e-5
        assert lines["v25"]["of_cublas_f32"] > 100 and 1e-4 < lines["v25"]["rel"] < 1e-3
        assert lines["v26"]["of_cublas_f32"] <= 2 and lines["v34"]["of_cublas_f32"] <= 2
    goals = {g["goal"]: g for g in tc.tf32_goals({"errors": errors, "timing": {"rows": []}})}
    assert goals["v26 largest error / cuBLAS float32's (every size)"]["verdict"] == "met"
    assert goals["v34 forward / reference (float32, 4096³)"]["verdict"] == "not measured"


def test_a_launch_that_fails_is_an_error_line_not_a_crash():
    def gemm(version, layout, a, b, m, n, k):
        raise ValueError("GEMM version 34 takes its operands through TMA")

    errors = tc.tf32_errors([34], gemm, device="cpu", sizes=(8,))
    assert errors["8"]["lines"]["v34"] == {"error": "GEMM version 34 takes its operands through TMA"}
    goals = tc.tf32_goals({"errors": errors, "timing": {"rows": []}})
    assert [g["verdict"] for g in goals if g["goal"].startswith("v34 largest")] == ["not measured"]


# ---------------------------------------------------------------------------------------
# The shares and the tables, on made-up records
# ---------------------------------------------------------------------------------------
def test_a_share_of_a_roof_is_the_ratio_of_flop_rates_round_by_round():
    stats = {"roof: wgmma": timing.Stats([100.0] * 8), "v33": timing.Stats([400.0] * 8)}
    share = tc.share_of_roof(stats, "v33", 2_000, "roof: wgmma", 1_000)  # twice the work in four times the time
    assert share["roof"] == "wgmma" and share["share"] == pytest.approx(0.5) and share["ci"] == [0.5, 0.5]


@pytest.mark.parametrize("ci, verdict", [([0.86, 0.9], "met"), ([0.7, 0.84], "missed"), ([0.8, 0.9], "not settled"),
                                         (None, "not settled")])
def test_a_goal_is_met_only_when_its_whole_interval_is(ci, verdict):
    assert gpu.verdict(ci, 0.85) == verdict


def _ratio(speed: float) -> dict:
    return {"speed": speed, "ci": [speed - 0.1, speed + 0.1]}


HEADER = {"device": "NVIDIA H100 80GB HBM3", "gpu": {"sm_count": 132, "nvidia_smi": {"clocks.max.sm": "1980 MHz",
                                                                                         "driver_version": "580"}},
          "torch": "2.11", "dtype": "float32", "date": "2026-12-01",
          "command": "python cuda/bench_gpu.py roof tf32 goals16 --json docs/results/cuda_kernels_h100.json"}


def test_the_roof_table_shows_each_line_against_its_own_roof():
    row = {"us": 200.0, "spread_us": 4.0, "tflops": 600.0, "tflops_iqr": [590.0, 610.0]}
    record = {**HEADER, "roof": {
        "rounds": 10, "shape": [4096] * 3, "tolerance": 0.01, "failed": {"v21": "failed the float64 check"},
        "roofs": {"mma.sync": {"blocks": 528, "threads": 256, "blocks_per_sm": 4, "iterations": 16384, "checked": True},
                  "wgmma": {"blocks": 132, "threads": 256, "blocks_per_sm": 1, "iterations": 4096, "checked": True}},
        "checked": {"v21": {"rel_error": 0.5, "ok": False}, "v24": {"rel_error": 0.002, "ok": True}},
        "rows": [{"line": "roof: mma.sync", "instruction": "mma.sync", **row,
                  "of_roof": {"roof": "mma.sync", "share": 1.0, "ci": [1.0, 1.0]}},
                 {"line": "cuBLAS bf16 x·Wᵀ", "instruction": "wgmma", **row, "of_cublas": _ratio(1.0)},
                 {"line": "v24", "instruction": "mma.sync", **row,
                  "of_roof": {"roof": "mma.sync", "share": 0.9, "ci": [0.88, 0.92]}, "of_cublas": _ratio(0.6)}],
        "goals": {"v24": {"roof": "mma.sync", "goal": 0.85, "share": 0.9, "ci": [0.88, 0.92], "verdict": "met"}}}}
    text = tables.table(record)
    assert "| v24 | mma.sync | 200 (4) | 600 (590–610) | 0.900 (0.880–0.920) | 0.600 (0.500–0.700) |" in text
    assert "| roof: mma.sync | mma.sync | 200 (4) | 600 (590–610) | 1.000 (1.000–1.000) | – |" in text
    assert "| cuBLAS bf16 x·Wᵀ | wgmma | 200 (4) | 600 (590–610) | – | 1.000 (0.900–1.100) |" in text
    assert "Goal: v24 ≥ 0.85 of the mma.sync roof: met (0.900, 0.880–0.920)." in text
    assert "mma.sync: 528 blocks of 256 threads (4 an SM), 16384 iterations, every thread's sum exact" in text
    assert "Not timed (failed the float64 check, tolerance 0.01): v21 (5.0e-01)." in text
    assert "Not timed: v21" not in text  # said once, with its error
    assert "NVIDIA H100 80GB HBM3 (132 SMs" in text


def test_the_tf32_table_shows_speed_errors_and_goals():
    row = {"forward_us": 3000.0, "spread_us": 10.0, "gflops": 45000.0, "of_cublas": _ratio(0.9),
           "of_reference": _ratio(1.6)}
    errors = {"4096": {"shape": [4096] * 3, "lines": {
        "cuBLAS float32": {"max_abs": 2e-5, "rel": 3e-7, "of_cublas_f32": 1.0},
        "v26": {"max_abs": 3e-5, "rel": 4e-7, "of_cublas_f32": 1.5},
        "v34": {"error": "the launch failed with cudaError 700"}}}}
    part = {"rounds": 10, "errors": errors,
            "timing": {"shape": [4096] * 3, "rounds": 10, "failed": {"v25": "cudaError 98"},
                       "rows": [{"line": "v26", **row}]}}
    part["goals"] = tc.tf32_goals({**part, "timing": {"rows": [{"line": "v34", **row}]}})
    text = tables.table({**HEADER, "tf32": part})
    assert "| v26 | 3000 (10) | 45000 | 90.0% (80.0–100.0%) | 160.0% |" in text
    assert "Not timed: v25 (cudaError 98)." in text
    assert "| 4096 | v26 | 3.00e-05 | 4.00e-07 | 1.50 |" in text
    assert "| 4096 | v34 | failed: the launch failed with cudaError 700 | – | – |" in text
    assert "| v34 forward / reference (float32, 4096³) | 1.600 (1.500–1.700) | ≥ 1.5 | met |" in text
    assert "| v26 largest error / cuBLAS float32's (every size) | 1.500 | ≤ 2.0 | met |" in text
    assert "| v34 largest error / cuBLAS float32's (every size) | – | ≤ 2.0 | not measured |" in text


def test_the_goals16_table_states_the_distance_to_the_w_read_bound():
    goal = {"shape": [32, 4096, 4096], "cuda_us": 30.0, "reference_us": 60.0, "speed": 2.0, "ci": [1.9, 2.1],
            "goal": 1.0, "met": True, "missed": False}
    part = {"rounds": 10, "version": "automatic", "dtype": "bfloat16", "tolerance": 0.01,
            "checked": {"4096×4096×4096": {"rel_error": 0.002, "ok": True}},
            "goals": {"forward, B=32": goal},
            "w_read": {"shape": [32, 4096, 4096], "w_bytes": 32 * 2**20, "other_bytes": 532480,
                       "copy": {"bytes": 2 * 2**30, "us": 700.0, "bytes_per_s": 3.0e12},
                       "datasheet_bytes_per_s": 3.35e12, "bound_us": 11.36, "datasheet_bound_us": 10.17,
                       "cuda_us": 30.0}}
    text = tables.table({**HEADER, "goals16": part})
    assert "| forward, B=32 | 32, 4096, 4096 | 30 | 60 | 2.000 (1.900–2.100) | ≥ 1.0 | met |" in text
    assert "W is 32 MiB in bfloat16" in text and "(3.00 TB/s, bytes read plus written, of 2 GiB) takes 11.4 µs" in text
    assert "at the datasheet's 3.35 TB/s 10.2 µs; the forward takes 30.0 µs, 2.64 times the measured bound." in text
    failed = {**part, "goals": {}, "checked": {"32×4096×4096": {"error": "cudaError 700", "ok": False}}}
    assert "Not timed: version 0 failed the bfloat16 check against float64 (32×4096×4096: cudaError 700)" in \
        tables.table({**HEADER, "goals16": failed})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without a GPU")
@pytest.mark.parametrize("part", ["roof", "tf32", "goals16"])
def test_the_new_parts_refuse_in_one_line_without_a_gpu(part):
    result = subprocess.run([bench_gpu.sys.executable, "cuda/bench_gpu.py", part], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and "mode 'cuda' is not available here" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_help_names_the_new_parts_with_examples():
    doc = bench_gpu.__doc__
    for part in ("roof", "tf32", "goals16"):
        assert part in bench_gpu.PARTS and re.search(rf"^  {part} +\S", doc, re.M), part
    assert "python cuda/bench_gpu.py roof tf32 goals16 --rounds 10 --json /tmp/tc.json" in doc


# ---------------------------------------------------------------------------------------
# The three parts' logic on the CPU: the emulation stands in for the GPU's library, op and device
# (no GPU code path runs here); each keeps a planted wrong result out of its timing
# ---------------------------------------------------------------------------------------
class _Stage:
    """modes.stage("cuda")'s select_kernel, over the emulation."""

    def __init__(self) -> None:
        self.version = 0

    def select_kernel(self, version: int) -> None:
        self.version = version


def _emulated_library(lib: ctypes.CDLL):
    """The GPU library's roof exports (dense_roof_launch, dense_roof_info), served by the emulation;
    one block an SM."""
    from types import SimpleNamespace

    def dense_roof_launch(kind, blocks, iterations, out, stream):
        return lib.emu_roof(kind, blocks, iterations, out)

    def dense_roof_info(kind, out):
        got = (ctypes.c_int64 * 2)()
        rc = lib.emu_roof_info(kind, got)
        out[0], out[1], out[2] = got[0], got[1], 1
        return rc
    return SimpleNamespace(dense_roof_launch=dense_roof_launch, dense_roof_info=dense_roof_info)


@pytest.fixture
def on_the_cpu(lib, monkeypatch):
    """bench_gpu's tensor-core parts on CPU tensors at small shapes, every kernel emulated."""
    from types import SimpleNamespace

    stage = _Stage()

    def dense(mode):
        return lambda x, w, b: emulated.dense(stage.version)(x, w, b)
    fake_modes = SimpleNamespace(stage=lambda mode: stage, dense=dense)
    for module in (gpu, tc, load_script("cuda/gpu_hand_kernels.py")):  # each part's module reads `modes`
        monkeypatch.setattr(module, "modes", fake_modes)
    monkeypatch.setattr(gpu, "DEVICE", "cpu")
    monkeypatch.setattr(gpu, "library", lambda: _emulated_library(lib))
    monkeypatch.setattr(gpu, "sm_count", lambda: 2)
    monkeypatch.setattr(gpu, "gpu_gemm", lambda: gpu.exact_check.emulation_gemm(emulated.SM_COUNT))
    monkeypatch.setattr(gpu, "BIG", (16, 24, 40))  # multiples of 8: the TMA versions take it
    monkeypatch.setattr(gpu, "SMALL_BATCH", (32, 24, 40))  # the goal is named by its batch
    monkeypatch.setattr(gpu, "CHECK_SHAPES", ((5, 3, 7), (9, 17, 13)))
    monkeypatch.setattr(gpu, "ALIGNED_CHECK", (16, 24, 16))
    monkeypatch.setattr(tc, "TF32_SIZES", (16, 32))
    monkeypatch.setattr(tc, "COPY_BYTES", 1 << 16)
    monkeypatch.setattr(tc, "ROOF_MAX_ITERATIONS", 2)
    return stage


@needs_emulation
def test_the_roof_parts_logic_with_the_emulation_standing_in_for_the_gpu(on_the_cpu):
    saved = []
    part = tc.roof(2, save=lambda: saved.append(1))
    assert part["failed"] == {} and saved
    assert {name: (r["blocks"], r["iterations"], r["checked"]) for name, r in part["roofs"].items()} == {
        "mma.sync": (2, 2, True), "wgmma": (2, 2, True)}
    rows = {r["line"]: r for r in part["rows"]}
    assert set(rows) == {"roof: mma.sync", "roof: wgmma", "cuBLAS bf16 x·Wᵀ",
                         *(f"v{v}" for v in tc.roof_versions("bf16"))}
    assert rows["v24"]["of_roof"]["roof"] == "mma.sync" and rows["v33"]["of_roof"]["roof"] == "wgmma"
    assert rows["roof: wgmma"]["of_roof"]["share"] == pytest.approx(1.0)
    # the FLOPs behind each rate: a GEMM's 2·B·I·O, a roof's blocks × iterations × a block's iteration
    assert rows["v24"]["tflops"] == pytest.approx(2 * 16 * 24 * 40 / rows["v24"]["us"] / 1e6)
    assert part["roofs"]["wgmma"]["flops"] == 2 * 2 * (2 * 4 * 2 * 64 * 256 * 16)
    assert part["goals"]["v24"]["verdict"] in ("met", "missed", "not settled")
    assert on_the_cpu.version == 0  # the automatic choice again, for whatever runs next
    text = tables.table({**HEADER, "roof": part})
    assert "| v24 | mma.sync |" in text and "Goal: v24 ≥ 0.85 of the mma.sync roof:" in text
    assert "bfloat16, forward only, B=16 I=24 O=40, 2 rounds;" in text


@needs_emulation
def test_the_tf32_parts_logic_with_the_emulation_standing_in_for_the_gpu(on_the_cpu):
    part = tc.tf32(2)
    assert set(part["errors"]) == {"16", "32"} and part["timing"]["failed"] == {}
    assert {r["line"] for r in part["timing"]["rows"]} == {"cuBLAS x·Wᵀ", "reference", "v25", "v26", "v34"}
    verdicts = {g["goal"]: g["verdict"] for g in part["goals"]}
    assert verdicts["v26 largest error / cuBLAS float32's (every size)"] == "met"
    text = tables.table({**HEADER, "tf32": part})
    assert "| 32 | v25 |" in text and "| v34 forward / reference (float32, 4096³) |" in text


@needs_emulation
def test_the_goals16_parts_logic_with_the_emulation_standing_in_for_the_gpu(on_the_cpu):
    part = tc.goals16(2)
    assert all(c["ok"] for c in part["checked"].values()) and part["dtype"] == "bfloat16"
    assert set(part["goals"]) == {"forward", "fwd+bwd", "forward, B=32"}
    w = part["w_read"]
    assert w["w_bytes"] == 40 * 24 * 2 and w["other_bytes"] == (32 * 24 + 32 * 40 + 40) * 2  # x, y, b
    assert w["copy"]["bytes"] == 2 << 16 and w["datasheet_bytes_per_s"] is None
    assert w["bound_us"] == pytest.approx((w["w_bytes"] + w["other_bytes"]) / w["copy"]["bytes_per_s"] * 1e6)
    text = tables.table({**HEADER, "goals16": part})
    assert "| forward, B=32 | 32, 24, 40 |" in text and "(no datasheet bandwidth known for this card)" in text
    assert "At B = 32, I = 24, O = 40:" in text


@needs_emulation
def test_the_roof_part_keeps_a_roof_with_one_wrong_sum_out_of_the_timing(on_the_cpu, lib, monkeypatch):
    """A planted wrong sum in one thread of the wgmma roof: caught by the check the GPU run applies,
    recorded, and that roof is not timed (mma.sync's still is)."""
    served = _emulated_library(lib)

    def launch(kind, blocks, iterations, out, stream):
        rc = served.dense_roof_launch(kind, blocks, iterations, out, stream)
        if kind == tc.ROOFS["wgmma"]:
            ctypes.c_float.from_address(out + 4 * 5).value += 1.0  # thread 5's sum one off
        return rc
    monkeypatch.setattr(gpu, "library", lambda: type(served)(dense_roof_launch=launch,
                                                                    dense_roof_info=served.dense_roof_info))
    part = tc.roof(2)
    assert part["failed"]["roof: wgmma"].startswith("wrong result: thread 5 wrote")
    assert part["roofs"]["wgmma"]["checked"] is False and part["roofs"]["mma.sync"]["checked"] is True
    assert {r["line"] for r in part["rows"]} >= {"roof: mma.sync"} and "roof: wgmma" not in {r["line"] for r in
                                                                                                part["rows"]}


@needs_emulation
def test_the_tf32_part_keeps_a_version_with_a_wrong_product_out_of_the_timing(on_the_cpu, monkeypatch):
    """v34's product planted wrong (every element doubled): its error fails the sanity check and it
    is not timed; v25 and v26 still are."""
    emu = gpu.exact_check.emulation_gemm(emulated.SM_COUNT)

    def gemm(version, layout, a, b, m, n, k):
        c = emu(version, layout, a, b, m, n, k)
        return 2 * c if version == 34 else c
    monkeypatch.setattr(gpu, "gpu_gemm", lambda: gemm)
    part = tc.tf32(2)
    assert part["timing"]["failed"] == {"v34": "failed the float64 check"}
    assert {r["line"] for r in part["timing"]["rows"]} == {"cuBLAS x·Wᵀ", "reference", "v25", "v26"}


@needs_emulation
def test_the_goals16_part_does_not_time_a_version_0_that_writes_nan(on_the_cpu, monkeypatch):
    """The op planted to return NaN: the float64 check fails, nothing is timed, the table says why."""
    monkeypatch.setattr(tc.modes, "dense", lambda mode: lambda x, w, b: torch.full(
        (x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype))
    part = tc.goals16(2)
    assert part["goals"] == {} and not any(c["ok"] for c in part["checked"].values())
    assert "Not timed: version 0 failed the bfloat16 check against float64" in tables.table({**HEADER,
                                                                                               "goals16": part})


@needs_emulation
def test_kernel_n_times_version_n_alone_by_its_number_never_version_0(on_the_cpu, monkeypatch):
    """--kernel N (a version never run on a GPU, in a process of its own): the B = 32 table times
    cuBLAS, the reference and v25 alone; the bfloat16 goals are v24's, checked and timed with v24
    selected."""
    monkeypatch.setattr(gpu, "KERNEL", 25)
    part = load_script("cuda/gpu_hand_kernels.py").small(2)
    assert {r["line"] for r in part["rows"]} == {"cuBLAS x·Wᵀ", "reference", "v25"}
    monkeypatch.setattr(gpu, "KERNEL", 24)
    selected = []
    stage = on_the_cpu
    monkeypatch.setattr(tc.modes, "dense", lambda mode: lambda x, w, b: (
        selected.append(stage.version), emulated.dense(stage.version)(x, w, b))[1])
    goals = tc.goals16(2)
    assert goals["version"] == "v24" and set(goals["goals"]) == {"forward", "fwd+bwd", "forward, B=32"}
    assert selected and set(selected) == {24}
