"""The numbers in the sentences of chapter 5 (cuda/tensor_cores/README.md), by the names its number markers
give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed
from the record or the source that backs it: the static report (cuda_static_sm90.json), the counters
(counters.json), the TF32 error measurement (tf32_error_cpu.json), chapter 3's timings
(cuda_gpu_h100.json), the kernels' headers (roof.cuh's datasheet arithmetic, the tiles and stages),
cuda/gemm_choice.h, cuda/figures.py's bandwidths and cuda/gpu_tensor_cores.py's goals."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from record_info import committed, in_words, sci

ROOT = Path(__file__).resolve().parent.parent.parent
BIG = 4096  # the chapter's shape, 4096³, and its largest K
LOAD_INSTRUCTIONS = 4  # chapter 3's rule: about 4 instructions per scalar global load (the partial tiles' path)
ISSUE_A_CLOCK = 4  # warp instructions an SM issues a clock (4 sub-partitions)
WAVEFRONT_BYTES = 128  # shared memory serves one wavefront of 128 bytes a clock an SM
MMA_SYNC_SHARE = 0.5  # roof.cuh's prediction for mma.sync: about half the wgmma roof
CUBLAS_OF_WGMMA = (0.7, 0.8)  # the page's assumption: cuBLAS bfloat16 reaches 0.7-0.8 of wgmma's roof
ASSUMED_TFLOPS = 700  # the GEMM beside the reference's sigmoid, at the page's assumed speed
V34_SPLIT_INSTRUCTIONS = (10, 25)  # v34's split: instructions an element, the page's range
V35_OVER_BOUND = (1.3, 1.8)  # v35's predicted time over the W-read bound (partials, a second launch)
KIB, MIB = 1024, 2 ** 20


# ---------------------------------------------------------------------------------------
# The sources, read once
# ---------------------------------------------------------------------------------------
@cache
def _text(path: str) -> str:
    return (ROOT / path).read_text()


@cache
def header_constants(name: str) -> dict[str, int]:
    """A kernel header's integer constants (`kV24BK = 32`), by name."""
    return {k: int(v) for k, v in re.findall(r"\b(k\w+) = (\d+)\b", _text(f"cuda/tensor_cores/{name}"))}


@cache
def _py_constants(path: str) -> dict[str, object]:
    """A Python module's literal module-level constants, read without importing it (no torch)."""
    found = {}
    for node in ast.parse(_text(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


@cache
def _roof() -> tuple[int, int, float]:
    """roof.cuh's datasheet arithmetic: SMs, bfloat16 FLOPs a clock an SM, the tensor cores' GHz."""
    comments = " ".join(re.sub(r"\n\s*//", " ", _text("cuda/tensor_cores/roof.cuh")).split())
    sms, flops, ghz = re.search(r"(\d+) SMs × ([\d,]+) FLOP a clock at ([\d.]+) GHz", comments).groups()
    return int(sms), int(flops.replace(",", "")), float(ghz)


def _sm_macs() -> int:
    """Hopper's bfloat16 multiply-adds a clock an SM on its tensor cores."""
    return _roof()[1] // 2


@cache
def _shape(kind: str) -> tuple[int, int, int]:
    """m, n, k of the roof's instruction of that kind (gpu_tensor_cores.py's ROOF_INSTRUCTIONS)."""
    instruction = _py_constants("cuda/gpu_tensor_cores.py")["ROOF_INSTRUCTIONS"][kind]
    m, n, k = re.search(r"\.m(\d+)n(\d+)k(\d+)\.", instruction).groups()
    return int(m), int(n), int(k)


def _mma_macs() -> int:
    m, n, k = _shape("mma.sync")
    return m * n * k


def _mma_4096() -> int:
    return BIG ** 3 // _mma_macs()


def _mma_clocks() -> float:
    """Clocks an SM spends on one m16n8k16 at the predicted mma.sync roof."""
    return _mma_macs() / (_sm_macs() * MMA_SYNC_SHARE)


def static(version: int, dtype: str = "bf16") -> dict:
    """The sm_90a record of a version's nt kernel (cuda_static_sm90.json's "kernels")."""
    (k,) = [k for k in committed("cuda_static_sm90.json")["kernels"]
            if k["version"] == version and k["dtype"] == dtype and k["layout"] == "nt"]
    return k


def _tile(version: int, dtype: str = "bf16", warp: bool = False) -> str:
    """A version's block tile (or a warp's, a warpgroup's) as the page writes it, "128×128"."""
    t = static(version, dtype)["tile"]
    return f"{t['wm']}×{t['wn']}" if warp else f"{t['bm']}×{t['bn']}"


def _products(version: int) -> int:
    """mma's a split-TF32 version issues for one product (1 plain, 3 split)."""
    return static(version, "f32")["napkin"]["tensor_cores"]["products"]


def _loop(version: int, dtype: str = "bf16") -> dict:
    return static(version, dtype)["inner_loop"]


def _without_path(version: int, dtype: str = "bf16") -> int:
    """The main loop's instructions less the partial tiles' scalar global loads."""
    loop = _loop(version, dtype)
    return loop["instructions"] - LOAD_INSTRUCTIONS * loop["ldg"].get("16" if dtype == "bf16" else "32", 0)


def _issue_bound(version: int) -> tuple[float, float]:
    """Instructions per mma in the main loop, with and without the partial tiles' path."""
    loop = _loop(version)
    return loop["instructions"] / loop["mma"], _without_path(version) / loop["mma"]


def counted(version: int) -> dict:
    """A version's bfloat16 forward in the counters' record at 4096³."""
    return {k["kernel"]: k["metrics"] for k in committed("counters.json")["kernels"] if k["shape"] == [BIG] * 3}[
        f"dense_gemm_v{version}_nt_bf16"]


def _wavefronts(version: int) -> dict[str, float]:
    c = counted(version)
    return {"ld": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"],
            "st": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"],
            "ldgsts": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum"],
            "ldsm": c["smsp__inst_executed_op_ldsm.sum"]}


def _h100() -> dict:
    return committed("cuda_gpu_h100.json")


def _issue_ghz() -> float:
    """Chapter 3's clock: nvidia-smi's maximum SM clock on the timed H100."""
    return int(_h100()["gpu"]["nvidia_smi"]["clocks.max.sm"].split()[0]) / 1e3


@cache
def _chapter_3_ratios() -> tuple[float, float]:
    """v7's and v8's measured time over chapter 3's issue bound (loop instructions, less 4 per scalar
    global load, per FFMA, at 4 FFMA a clock an SM), unrounded."""
    kernels = {k["name"]: k for k in committed("cuda_static_sm90.json")["kernels"]}
    timed = {r["line"]: r["forward_us"] for r in _h100()["gemm"]["rows"]}
    sms = _h100()["gpu"]["sm_count"]
    ffma_ms = BIG ** 3 / 32 / (sms * ISSUE_A_CLOCK * _issue_ghz() * 1e9) * 1e3
    ratios = []
    for v in (7, 8):
        loop = kernels[f"dense_gemm_v{v}_nt_f32"]["inner_loop"]
        bound_ms = (loop["instructions"] - LOAD_INSTRUCTIONS * loop["ldg"].get("32", 0)) / loop["fma"] * ffma_ms
        ratios.append(timed[f"v{v}"] / 1e3 / bound_ms)
    return ratios[0], ratios[1]


def _ratios() -> tuple[float, float]:
    """Chapter 3's 1.1 to 1.4, as the page states them and its predictions use them."""
    lo, hi = _chapter_3_ratios()
    return round(lo, 1), round(hi, 1)


def _range(lo: float, hi: float, digits: int) -> str:
    return f"{round(lo, digits):g}-{round(hi, digits):g}"




def _int(x: float) -> str:
    assert x == int(x), x
    return f"{int(x):,}"


# ---------------------------------------------------------------------------------------
# The idea: FLOPs per instruction, the peaks
# ---------------------------------------------------------------------------------------
def _roof_tflops() -> float:
    sms, flops, ghz = _roof()
    return round(sms * flops * ghz * 1e9 / 1e12, 1)


def _ffma_sm_flops() -> int:
    return 128 * 2  # an SM's 128 FFMA lanes, 2 FLOPs each


def _chapter_3_peak() -> str:
    return f"{_h100()['gpu']['sm_count'] * _ffma_sm_flops() * _issue_ghz() * 1e9 / 1e12:.1f}"


def _roof_prediction() -> str:
    comments = " ".join(re.sub(r"\n\s*//", " ", _text("cuda/tensor_cores/roof.cuh")).split())
    return re.search(r"Predicted: (\d+-\d+) TFLOP/s", comments).group(1)


def _fragment(rows: int, cols: int) -> str:
    return _int(rows * cols / 32)


# ---------------------------------------------------------------------------------------
# Part 1's predictions
# ---------------------------------------------------------------------------------------
def _v21_requests() -> float:
    return counted(21)["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]


def _v21_sectors() -> str:
    return f"{counted(21)['l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum'] / _v21_requests():.0f}"


def _per_mma(version: int, *kinds: str) -> float:
    w = _wavefronts(version)
    return sum(w[k] for k in kinds) / _mma_4096()


def _v23_bounds() -> tuple[float, float, float]:
    """v23's shared-memory bound and its issue bounds with and without the partial tiles' path."""
    with_path, without = _issue_bound(23)
    return _wavefronts_allowed() / _per_mma(23, "ld", "st"), _issue_slots() / with_path, _issue_slots() / without


def _issue_slots() -> float:
    return ISSUE_A_CLOCK * _mma_clocks()


def _wavefronts_allowed() -> float:
    return _mma_clocks()  # one wavefront a clock


def _v23_predicted() -> str:
    shared, low, high = _v23_bounds()
    lo, hi = _ratios()
    return _range(min(round(shared, 2), round(low, 2)) / hi, min(round(shared, 2), round(high, 2)) / lo, 1)


def _v24_bound() -> float:
    return _issue_slots() / _issue_bound(24)[1]


def _v24_at_chapter_3() -> tuple[float, float]:
    lo, hi = _ratios()
    return _v24_bound() / hi, _v24_bound() / lo


def _v24_predicted() -> tuple[float, float]:
    lo, hi = _v24_at_chapter_3()
    return round(lo, 1), round(hi, 1)


def _part_1_of_cublas() -> str:
    lo, hi = _v24_predicted()
    return _range(lo * MMA_SYNC_SHARE / CUBLAS_OF_WGMMA[1], hi * MMA_SYNC_SHARE / CUBLAS_OF_WGMMA[0], 1)


# ---------------------------------------------------------------------------------------
# TF32 and split-TF32
# ---------------------------------------------------------------------------------------
def gemm_errors(k: int) -> dict[str, dict]:
    """The forward GEMM's errors at K = k in the TF32 record, by variant."""
    return {r["variant"]: r for r in committed("tf32_error_cpu.json")["results"]
            if r["in"] == k and r["tensor"] == "forward GEMM"}


def v26_by(model: str) -> float:
    """v26's error at K = 4096 summed by one accumulation model, over torch's CPU float32's."""
    e = gemm_errors(BIG)["v26"]
    return e["error_by_accumulation"][model] / e["float32_error"]


def _v26_of_v8(model: str) -> float:
    """v26's error at K = 4096 summed by one accumulation model, over chapter 3's v8's."""
    e = gemm_errors(BIG)
    return e["v26"]["error_by_accumulation"][model] / e["v8"]["error"]


def _v26_fails_from() -> str:
    return str(min(k for k in committed("tf32_error_cpu.json")["shape"]["in"] if not gemm_errors(k)["v26"]["passed"]))


def _cublas_f32_tflops() -> float:
    (row,) = [r for r in _h100()["gemm"]["rows"] if r["line"] == "cuBLAS x·Wᵀ"]
    return row["gflops"] / 1e3


def _of_cublas_f32(flop_per_sm_clock: float) -> float:
    """A speed of so many FLOPs a clock an SM at the tensor cores' clock, slowed by v8's measured ratio,
    over cuBLAS float32's."""
    sms, _, ghz = _roof()
    return flop_per_sm_clock * sms * ghz * 1e9 / 1e12 / _ratios()[1] / _cublas_f32_tflops()


def _m16n8k8_flops() -> int:
    return 2 * 16 * 8 * 8


def _tf32_speeds(version: int) -> tuple[float, float]:
    """v25's or v26's speed over cuBLAS float32's from its issue slots, with and without the partial
    tiles' path: a warp's 32 useful m16n8k8 a pass (v26 issues three for each)."""
    loop = _loop(version, "f32")
    useful = 32 * _m16n8k8_flops()
    return (_of_cublas_f32(ISSUE_A_CLOCK * useful / loop["instructions"]),
            _of_cublas_f32(ISSUE_A_CLOCK * useful / _without_path(version, "f32")))


def _truncating_over_v8() -> str:
    e = gemm_errors(BIG)
    return str(round(e["v26"]["error"] / e["v8"]["error"]))


# ---------------------------------------------------------------------------------------
# Part 2
# ---------------------------------------------------------------------------------------
def _v31() -> dict[str, float]:
    h = header_constants("v31_wgmma.cuh")
    loop = _loop(31)
    tensor = loop["mma"] * h["kV31BM"] * h["kV31BN"] * 16 / _sm_macs()
    stage = (h["kV31BM"] + h["kV31BN"]) * h["kV31BK"] * 2
    shared = 2 * stage / WAVEFRONT_BYTES
    with_path, without = _issue_bound(31)
    return {"tensor": tensor, "stage": stage, "shared": shared,
            "with": tensor / (with_path * loop["mma"]), "without": tensor / (without * loop["mma"])}


def _v33() -> dict[str, float]:
    h = header_constants("v33_warp_specialized.cuh")
    stage = (h["kV33BM"] + h["kV33BN"]) * 64 * 2
    consumers = h["kV33BM"] // 64
    reads = consumers * (64 + h["kV33BN"]) * 64 * 2
    clocks = consumers * 4 * 64 * h["kV33BN"] * 16 / _sm_macs()
    return {"stage": stage, "reads": reads, "clocks": clocks}


def _setmaxnreg(which: str) -> int:
    header = _text("cuda/tensor_cores/v33_warp_specialized.cuh")
    return int(re.search(rf"setmaxnreg_{which}<(\d+)>\(\)", header).group(1))


def v33_registers() -> int:
    """Registers v33's warpgroups hold after setmaxnreg: the producer's 128 threads, the consumers'."""
    threads = static(33)["threads"]
    return 128 * _setmaxnreg("dec") + (threads - 128) * _setmaxnreg("inc")


def _v34() -> dict[str, float]:
    h = header_constants("v34_split_tf32_wgmma.cuh")
    mma = _loop(34, "f32")["mma"]
    tensor = mma * h["kV34BM"] * h["kV34BN"] * 8 / (_sm_macs() / 2)  # TF32 at half bfloat16's multiply-adds
    elements = (h["kV34BM"] + h["kV34BN"]) * h["kV34BK"] // 128
    clocks = [tensor + elements * c for c in V34_SPLIT_INSTRUCTIONS]
    flops = 2 * h["kV34BM"] * h["kV34BN"] * h["kV34BK"]  # a k-step's useful FLOPs, one block an SM
    return {"mma": mma, "tensor": tensor, "elements": elements, "clocks": clocks,
            "speeds": [_of_cublas_f32(flops / c) for c in clocks]}


def _bandwidth(card: str) -> float:
    """The datasheet's bandwidth (cuda/figures.py's BANDWIDTH), bytes a second."""
    (bw,) = [v for k, v in _py_constants("cuda/figures.py")["BANDWIDTH"].items() if card in k]
    return bw


def _w_bytes() -> int:
    return BIG * BIG * 2  # W in bfloat16


def _us(nbytes: float, card: str) -> float:
    return nbytes / _bandwidth(card) * 1e6


def _v35_slices() -> int:
    return static(35)["napkin"]["slices"]


def v35_blocks() -> int:
    """v35's blocks at B = 32, 4096 out: its tiles times its slices."""
    h, at = header_constants("v35_small_batch.cuh"), static(35)["napkin"]["slices_at"]
    return (at["out"] // h["kV35BN"]) * (at["batch"] // h["kV35BM"]) * _v35_slices()


def _batch() -> int:
    """The small batch of chapter 3's goal ("forward, B=32") and of v35's slices."""
    return _h100()["goals"]["goals"]["forward, B=32"]["shape"][0]


def _small_reference_us() -> float:
    return _h100()["goals"]["goals"]["forward, B=32"]["reference_us"]


# ---------------------------------------------------------------------------------------
# What the stage runs: gemm_choice.h's tables
# ---------------------------------------------------------------------------------------
@cache
def choices(table: str) -> dict[tuple[str, str], list[str]]:
    """A table of cuda/gemm_choice.h (kChoices, kPredictedChoices): (shape, dtype) -> its versions in order."""
    text = _text("cuda/gemm_choice.h")
    block = text[text.index(f"constexpr Choice {table}[] = {{"):]
    by: dict[tuple[str, str], list[str]] = {}
    for shape, dtype, version in re.findall(r"\{(k\w+), (k\w+), (\w+)\}", block[:block.index("};")]):
        by.setdefault((shape, dtype), []).append(version)
    return by


def _choice(table: str, shape: str, dtype: str, at: int) -> str:
    return choices(table)[shape, dtype][at]


NUMBERS: dict[str, Callable[[], str]] = {
    # the idea
    "tc_warp_ffma_flops": lambda: str(32 * 2),
    "tc_mma_flops": lambda: _int(2 * _mma_macs()),
    "tc_frag_a": lambda: _fragment(_shape("mma.sync")[0], _shape("mma.sync")[2]),
    "tc_frag_b": lambda: _fragment(_shape("mma.sync")[2], _shape("mma.sync")[1]),
    "tc_frag_c": lambda: _fragment(_shape("mma.sync")[0], _shape("mma.sync")[1]),
    "tc_sm_flops": lambda: _int(_roof()[1]),
    "tc_over_ffma": lambda: _int(_roof()[1] / _ffma_sm_flops()),
    "tc_ffma_sm_flops": lambda: str(_ffma_sm_flops()),
    "tc_roof_tflops": lambda: f"{_roof_tflops():.1f}",
    "tc_sms": lambda: str(_roof()[0]),
    "tc_tensor_ghz": lambda: f"{_roof()[2]:.2f}",
    "tc_chapter_3_peak": _chapter_3_peak,
    "tc_issue_ghz": lambda: f"{_issue_ghz():.2f}",
    "tc_wgmma_over_mma": lambda: _int(_shape("wgmma")[0] * _shape("wgmma")[1] * _shape("wgmma")[2] / _mma_macs()),
    "tc_roof_predicted": _roof_prediction,
    # part 1's unit of account
    "tc_mma_clocks": lambda: f"{_mma_clocks():g}",
    "tc_mma_sync_macs": lambda: _int(_sm_macs() * MMA_SYNC_SHARE),
    "tc_sm_macs": lambda: _int(_sm_macs()),
    "tc_issue_slots": lambda: f"{_issue_slots():g}",
    "tc_wavefronts_allowed": lambda: f"{_wavefronts_allowed():g}",
    "tc_mma_4096": lambda: _int(_mma_4096()),
    # v21
    "tc_v21_warp_tile": lambda: _tile(21, warp=True),
    "tc_v21_bound": lambda: f"{_issue_slots() / _issue_bound(21)[0]:.2f}",
    "tc_v21_per_mma": lambda: f"{_issue_bound(21)[0]:g}",
    "tc_v21_loads": lambda: f"{_loop(21)['ldg']['16'] / _loop(21)['mma']:g}",
    "tc_v21_requests": lambda: sci(_v21_requests()),
    "tc_v21_sectors": _v21_sectors,
    # v22 and v23: the bank conflicts
    "tc_v22_warps": lambda: in_words(static(22)["napkin"]["tensor_cores"]["warps"]).capitalize(),
    "tc_v22_tile": lambda: _tile(22),
    "tc_v22_k_step": lambda: str(static(22)["tile"]["bk"]),
    "tc_v22_bound": lambda: f"{_wavefronts_allowed() / _per_mma(22, 'ld', 'st'):.2f}",
    "tc_v22_each": lambda: f"{_wavefronts(22)['ld'] / _wavefronts(22)['ldsm']:g}",
    "tc_v23_each": lambda: f"{_wavefronts(23)['ld'] / _wavefronts(23)['ldsm']:g}",
    "tc_v22_ldmatrix_per_mma": lambda: f"{_per_mma(22, 'ld'):g}",
    "tc_v22_staging_per_mma": lambda: f"{_per_mma(22, 'st'):g}",
    "tc_v22_per_mma": lambda: f"{_per_mma(22, 'ld', 'st'):g}",
    "tc_ldsm_requests": lambda: sci(_wavefronts(23)["ldsm"]),
    "tc_v22_wavefronts": lambda: sci(_wavefronts(22)["ld"]),
    "tc_v23_wavefronts": lambda: sci(_wavefronts(23)["ld"]),
    "tc_v22_per_matrix": lambda: f"{_wavefronts(22)['ld'] / _wavefronts(22)['ldsm'] / 4:g}",
    "tc_v23_per_matrix": lambda: f"{_wavefronts(23)['ld'] / _wavefronts(23)['ldsm'] / 4:g}",
    "tc_swizzle_registers": lambda: str(static(23)["registers"] - static(22)["registers"]),
    "tc_v23_registers": lambda: str(static(23)["registers"]),
    "tc_v23_blocks": lambda: str(static(23)["blocks_per_sm"]),
    "tc_v23_predicted": _v23_predicted,
    "tc_v23_per_mma": lambda: f"{_per_mma(23, 'ld', 'st'):g}",
    "tc_v23_shared_bound": lambda: f"{_v23_bounds()[0]:.2f}",
    "tc_v23_instructions": lambda: str(_loop(23)["instructions"]),
    "tc_v23_mma": lambda: str(_loop(23)["mma"]),
    "tc_v23_without": lambda: str(_without_path(23)),
    "tc_v23_loads": lambda: str(_loop(23)["ldg"]["16"]),
    "tc_v23_issue_bound": lambda: _range(_v23_bounds()[1], _v23_bounds()[2], 2),
    "tc_ratio_low": lambda: f"{_ratios()[0]:.1f}",
    "tc_ratio_high": lambda: f"{_ratios()[1]:.1f}",
    # v24
    "tc_v24_warps": lambda: in_words(static(24)["napkin"]["tensor_cores"]["warps"]).capitalize(),
    "tc_v24_warp_tile": lambda: _tile(24, warp=True),
    "tc_v24_tile": lambda: _tile(24),
    "tc_v24_bk": lambda: str(header_constants("v24_pipeline.cuh")["kV24BK"]),
    "tc_v24_stages": lambda: str(header_constants("v24_pipeline.cuh")["kV24Stages"]),
    "tc_v24_predicted": lambda: _range(*_v24_predicted(), 1),
    "tc_v24_goal": lambda: f"{_py_constants('cuda/gpu_tensor_cores.py')['ROOF_GOALS']['v24'][1]:g}",
    "tc_v24_ldmatrix_per_mma": lambda: f"{_per_mma(24, 'ld'):g}",
    "tc_v24_copies_per_mma": lambda: f"{_per_mma(24, 'ldgsts'):g}",
    "tc_v24_ldmatrix": lambda: sci(_wavefronts(24)["ld"]),
    "tc_v24_copies": lambda: sci(_wavefronts(24)["ldgsts"]),
    "tc_v24_per_mma": lambda: f"{_per_mma(24, 'ld', 'ldgsts'):g}",
    "tc_v24_instructions": lambda: str(_loop(24)["instructions"]),
    "tc_v24_mma": lambda: str(_loop(24)["mma"]),
    "tc_v24_issue_per_mma": lambda: f"{round(_issue_bound(24)[1])}",
    "tc_v24_bound": lambda: f"{_v24_bound():.2f}",
    "tc_v24_at_chapter_3": lambda: _range(*_v24_at_chapter_3(), 2),
    # TF32 and split-TF32
    "tc_tf32_fails_by": lambda: f"{gemm_errors(BIG)['tf32']['ratio']:.0f}",
    "tc_v26_rounded": lambda: f"{v26_by('exact'):.2f}",
    "tc_v26_rounded_of_v8": lambda: f"{_v26_of_v8('exact'):.2f}",
    "tc_v26_fails_from": _v26_fails_from,
    "tc_v26_cut": lambda: f"{v26_by('h100'):.0f}",
    "tc_v26_roundings": lambda: _int(_products(26) * BIG // 8),  # its products' mma's per k-step of 8
    "tc_split_products": lambda: f"{gemm_errors(BIG)['split']['ratio']:.2f}",
    "tc_cublas_f32_tflops": lambda: f"{_cublas_f32_tflops():.1f}",
    "tc_v8_ratio": lambda: f"{_chapter_3_ratios()[1]:.2f}",
    "tc_v26_products": lambda: in_words(_products(26)),
    "tc_v25_speed": lambda: _range(*_tf32_speeds(25), 1),
    "tc_v25_instructions": lambda: str(_loop(25, "f32")["instructions"]),
    "tc_v25_mma": lambda: str(_loop(25, "f32")["mma"]),
    "tc_m16n8k8_flops": lambda: _int(_m16n8k8_flops()),
    "tc_v25_without": lambda: str(_without_path(25, "f32")),
    "tc_v26_speed": lambda: f"{_tf32_speeds(26)[0]:.2f}",  # "about": the whole loop's, the path's a little more
    "tc_v26_instructions": lambda: _int(_loop(26, "f32")["instructions"]),
    "tc_v26_mma": lambda: str(_loop(26, "f32")["mma"]),
    "tc_v26_registers": lambda: str(static(26, "f32")["registers"]),
    "tc_v26_blocks": lambda: in_words(static(26, "f32")["blocks_per_sm"]),
    "tc_truncating_over_v8": _truncating_over_v8,
    # v31-v33
    "tc_v31_tile": lambda: _tile(31),
    "tc_v31_tensor_clocks": lambda: f"{_v31()['tensor']:g}",
    "tc_v31_stage_kib": lambda: f"{_v31()['stage'] / KIB:g}",
    "tc_v31_shared_clocks": lambda: f"{_v31()['shared']:g}",
    "tc_v31_shared_bound": lambda: f"{_v31()['tensor'] / _v31()['shared']:.2f}",
    "tc_v31_instructions": lambda: str(_loop(31)["instructions"]),
    "tc_v31_without": lambda: str(_without_path(31)),
    "tc_v31_issue_bound": lambda: _range(_v31()["with"], _v31()["without"], 2),
    "tc_v32_stages": lambda: str(header_constants("v32_tma.cuh")["kV32Stages"]),
    "tc_v32_threads": lambda: str(static(32)["threads"]),
    "tc_v32_shared": lambda: _int(static(32)["dynamic_shared_bytes"]),
    "tc_v32_blocks": lambda: in_words(static(32)["blocks_per_sm"]),
    "tc_v33_consumers": lambda: in_words(static(33)["threads"] // 128 - 1),  # all warpgroups but the producer
    "tc_v33_accumulators": lambda: str(static(33)["tile"]["wn"] // 2),  # 64×256 over a warpgroup's 128 threads
    "tc_v33_warp_tile": lambda: _tile(33, warp=True),
    "tc_v33_tile": lambda: _tile(33),
    "tc_v33_dec": lambda: str(_setmaxnreg("dec")),
    "tc_v33_inc": lambda: str(_setmaxnreg("inc")),
    "tc_v33_registers": lambda: _int(v33_registers()),
    "tc_v33_stages": lambda: str(header_constants("v33_warp_specialized.cuh")["kV33Stages"]),
    "tc_v33_stage_kib": lambda: f"{_v33()['stage'] / KIB:g}",
    "tc_v33_clocks": lambda: _int(_v33()["clocks"]),
    "tc_v33_reads_kib": lambda: f"{_v33()['reads'] / KIB:g}",
    "tc_v33_bytes_a_clock": lambda: f"{(_v33()['stage'] + _v33()['reads']) / _v33()['clocks']:g}",
    # v34
    "tc_v34_speed": lambda: _range(min(_v34()["speeds"]), max(_v34()["speeds"]), 1),
    "tc_v34_goal": lambda: f"{_py_constants('cuda/gpu_tensor_cores.py')['TF32_SPEED_GOALS']['v34']:g}",
    "tc_v34_mma": lambda: str(_v34()["mma"]),
    "tc_v34_bk": lambda: str(header_constants("v34_split_tf32_wgmma.cuh")["kV34BK"]),
    "tc_v34_tensor_clocks": lambda: f"{_v34()['tensor']:g}",
    "tc_v34_elements": lambda: str(_v34()["elements"]),
    "tc_v34_blocks": lambda: in_words(static(34, "f32")["blocks_per_sm"]),
    "tc_v34_shared": lambda: _int(static(34, "f32")["dynamic_shared_bytes"]),
    "tc_v34_clocks": lambda: "-".join(f"{round(c, -1):,.0f}" for c in _v34()["clocks"]),
    # v35 and the small batch
    "tc_small_batch": lambda: str(_batch()),
    "tc_w_mib": lambda: f"{_w_bytes() / MIB:g}",
    "tc_w_h100_us": lambda: f"{_us(_w_bytes(), 'H100'):.1f}",
    "tc_w_h200_us": lambda: f"{_us(_w_bytes(), 'H200'):.1f}",
    "tc_h100_tbs": lambda: f"{_bandwidth('H100') / 1e12:.2f}",
    "tc_h200_tbs": lambda: f"{_bandwidth('H200') / 1e12:.1f}",
    "tc_v35_slices": lambda: str(_v35_slices()),
    "tc_v35_blocks": lambda: str(v35_blocks()),
    "tc_v35_places": lambda: str(2 * static(35)["napkin"]["slices_at"]["sm_count"]),
    "tc_v35_sms": lambda: str(static(35)["napkin"]["slices_at"]["sm_count"]),
    "tc_v35_w_rows": lambda: str(static(35)["tile"]["bn"]),  # Cᵀ's rows: W's
    "tc_v35_x_rows": lambda: str(static(35)["tile"]["bm"]),
    "tc_v35_predicted_us": lambda: "-".join(f"{_us(_w_bytes(), 'H100') * r:.0f}" for r in V35_OVER_BOUND),
    "tc_v35_over_bound": lambda: _range(*V35_OVER_BOUND, 1),
    "tc_v35_partials_mib": lambda: f"{_v35_slices() * _batch() * BIG * 4 / MIB:g}",
    "tc_small_reference_us": lambda: f"{_small_reference_us():.0f}",
    "tc_small_of_bound": lambda: f"{_small_reference_us() / _us(BIG * BIG * 4, 'H100'):.1f}",
    # what the stage runs
    "tc_choice_fills": lambda: _choice("kPredictedChoices", "kFillsGpu", "kBF16", 0),
    "tc_choice_small": lambda: _choice("kPredictedChoices", "kSmallBatch", "kBF16", 0),
    "tc_choice_fills_else": lambda: _choice("kPredictedChoices", "kFillsGpu", "kBF16", 1),
    "tc_choice_small_else": lambda: _choice("kPredictedChoices", "kSmallBatch", "kBF16", 1),
    "tc_f32_fills": lambda: _choice("kChoices", "kFillsGpu", "kF32", 0),
    "tc_f32_small": lambda: _choice("kChoices", "kSmallBatch", "kF32", 0),
    # the lease's table and the margins
    "tc_goal_forward": lambda: f"{_py_constants('cuda/gpu_tensor_cores.py')['GOALS16']['forward']:.1f}",
    "tc_goal_fwd_bwd": lambda: f"{_py_constants('cuda/gpu_tensor_cores.py')['GOALS16']['fwd+bwd']:.2f}",
    "tc_goal_small": lambda: f"{_py_constants('cuda/gpu_tensor_cores.py')['GOALS16']['forward, B=32']:.1f}",
    "tc_tf32_error_goal": lambda: f"{max(_py_constants('cuda/gpu_tensor_cores.py')['TF32_ERROR_GOALS'].values()):g}",
    "tc_part_1_of_cublas": _part_1_of_cublas,
    "tc_sigmoid_h100_us": lambda: f"{_us(2 * _w_bytes(), 'H100'):.0f}",
    "tc_sigmoid_h200_us": lambda: f"{_us(2 * _w_bytes(), 'H200'):.0f}",
    "tc_assumed_gemm_us": lambda: f"{2 * BIG ** 3 / (ASSUMED_TFLOPS * 1e12) * 1e6:.0f}",
}
