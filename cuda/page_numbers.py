"""The numbers in the sentences of chapter 3 (cuda/README.md), by the names its number markers
give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed
from the record or the source that backs it.

The records: the newest forward timing (cuda_gpu_{card}.json, the one the chapter's GEMM table
shows), ncu's counters at 2048³ (ncu_gemm_h200.json), the compiler's figures (cuda_static_sm90.json)
and the CPU's counts (counters.json, at 2048³ and 4096³)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import cli
from record_info import RESULTS, committed, sci

ROOT = Path(__file__).resolve().parent.parent

SHAPE = 4096  # the worklog's forward: 4096³
WARP_FFMA = SHAPE ** 3 / 32
FFMA_PER_CLOCK = 4  # warp FFMAs an SM issues a clock (4 sub-partitions); one shared wavefront a clock
# The metrics the counted and ncu's figures name
LD_REQ, LD_SEC = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
ST_REQ, ST_SEC = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
WF_LD, WF_ST = ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")
X_LD, X_ST = "excessive_wavefronts_mem_shared_op_ld", "excessive_wavefronts_mem_shared_op_st"
SHARED_LD, SHARED_ST = "smsp__inst_executed_op_shared_ld.sum", "smsp__inst_executed_op_shared_st.sum"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
BANK = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{}.sum"


# ---------------------------------------------------------------------------------------
# Formats, as the chapter writes them
# ---------------------------------------------------------------------------------------
def short_e(x: float, digits: int) -> str:
    """3.36e7 -> "3.4e7" (digits significant figures), as ncu's figures are quoted."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def ratio(x: float) -> str:
    """A per-request figure to two decimals, trailing zeros dropped: 16.5, 17.95, 16."""
    return f"{round(x, 2):g}"


# ---------------------------------------------------------------------------------------
# The records, read once
# ---------------------------------------------------------------------------------------
@cache
def timing() -> dict:
    """The newest forward timing record, the one the chapter's GEMM table shows."""
    return cli.load_file("cuda/figures.py").newest_timings(RESULTS)[1]


def timed(v: int) -> dict:
    return {r["line"]: r for r in timing()["gemm"]["rows"]}[f"v{v}"]


def us(v: int) -> float:
    return timed(v)["forward_us"]


def goal(name: str) -> dict:
    return timing()["goals"]["goals"][name]


def clock_hz() -> float:
    return float(timing()["gpu"]["nvidia_smi"]["clocks.max.sm"].split()[0]) * 1e6


def sm_count() -> int:
    return timing()["gpu"]["sm_count"]


def ffma_ms() -> float:
    """The forward's warp FFMAs at the peak: FFMA_PER_CLOCK a clock on every SM."""
    return WARP_FFMA / (sm_count() * FFMA_PER_CLOCK * clock_hz()) * 1e3


def wavefront_ms() -> float:
    """What one shared wavefront per warp FFMA costs: one a clock on every SM."""
    return WARP_FFMA / (sm_count() * clock_hz()) * 1e3


@cache
def ncu_record() -> dict:
    return committed("ncu_gemm_h200.json")


def ncu(kernel: str) -> dict:
    return {k["kernel"]: k["metrics"] for k in ncu_record()["kernels"]}[kernel]


@cache
def static() -> dict[str, dict]:
    return {r["name"]: r for r in committed("cuda_static_sm90.json")["kernels"]}


@cache
def counted(shape: int) -> dict[str, dict]:
    """The CPU's counts at shape³ (cuda/counters.py), by kernel."""
    return {k["kernel"]: k["metrics"] for k in committed("counters.json")["kernels"] if k["shape"] == [shape] * 3}


def nt(v: int) -> str:
    return f"dense_gemm_v{v}_nt_f32"


def c(v: int, key: str, shape: int = SHAPE) -> float:
    """A forward kernel's count at shape³."""
    return counted(shape)[nt(v)][key]


def pct(v: int, metric: str) -> str:
    return f"{ncu(nt(v))[metric]:.0f}%"


def loop(v: int) -> dict:
    return static()[nt(v)]["inner_loop"]


def warps_per_sm(v: int) -> int:
    """The warps resident on an SM: the blocks that fit, times a block's warps."""
    return static()[nt(v)]["threads"] * static()[nt(v)]["blocks_per_sm"] // 32


def issue_ms(v: int) -> float:
    """The issue bound: the loop's instructions per FFMA, less about 4 per 32-bit global load of
    the partial-tile path that full tiles never take, at 4 instructions a clock."""
    return (loop(v)["instructions"] - 4 * loop(v)["ldg"].get("32", 0)) / loop(v)["fma"] * ffma_ms()


def shared_per_ffma(v: int) -> float:
    return (c(v, WF_LD) + c(v, WF_ST)) / WARP_FFMA


def gain(slower: int, faster: int) -> str:
    """How much faster `faster` is than `slower`, in whole percent."""
    return f"{round(100 * (us(slower) / us(faster) - 1))}%"


@cache
def roofline_of() -> dict:
    """What cuda_roofline.png draws from the timing and static records: the card's roofs, the points."""
    figures = cli.load_file("cuda/figures.py")
    return figures.roofline(timing(), committed(figures.STATIC))


def roofline() -> dict[int, dict]:
    return {p["version"]: p for p in roofline_of()["points"]}


def dram_worst() -> int:
    """The version from v3 on whose requested bytes would take the largest share of its time."""
    p = roofline()
    return max((v for v in p if v >= 3), key=lambda v: p[v]["dram_share"])


def v12_slicing() -> dict[str, int]:
    """v12's slices at B = 32, I = O = 4096 (cuda/static_report.py's skinny_slices): the places
    (blocks that fit on every SM at once), the tiles, the slices asked and taken, the k-steps."""
    sr = cli.load_file("cuda/static_report.py")
    entry, tile = sr.TILES[12], static()[nt(12)]["tile"]
    per_sm = entry["min_blocks"]["f32"]
    places, tiles = sm_count() * per_sm, -(-32 // tile["bm"]) * -(-SHAPE // tile["bn"])
    slices = sr.skinny_slices(32, SHAPE, SHAPE, tile["bm"], tile["bn"], entry["bk"], per_sm, sm_count())
    steps = SHAPE // entry["bk"]
    return {"places": places, "tiles": tiles, "asked": -(-places // tiles), "slices": slices, "steps": steps,
            "bk": entry["bk"], "per_slice": steps // slices, "blocks": tiles * slices}


def ncu_store_counter(v: int) -> float:
    return ncu(nt(v))[BANK.format("st")]


def ncu_false_store_shares() -> list[float]:
    """ncu's store bank-conflict counter over the stores, where the addresses make no conflict (v3-v5)."""
    return [ncu_store_counter(v) / counted(2048)[nt(v)][SHARED_ST] for v in (3, 4, 5)]


def grad_sectors_per_request() -> str:
    """The backward's three kernels at 4096×4096: sectors per load request, one figure for all three."""
    found = {ratio(k[LD_SEC] / k[LD_REQ]) for name, k in counted(SHAPE).items()
             if name.startswith("dense_sigmoid_grad_v")}
    if len(found) != 1:
        raise ValueError(f"the backward's kernels differ in sectors per request: {sorted(found)}")
    return found.pop()


def _per_version() -> dict[str, Callable[[], str]]:
    """The figures the versions' entries give: each timed version's time and share of cuBLAS's speed
    (to a tenth; whole where v5-v8 are compared), and the registers each entry names."""
    found: dict[str, Callable[[], str]] = {}
    for v in (1, 3, 4, 5, 6, 8, 9, 10, 11, 12):  # v2 and v7 say "v1's" and "v6's"
        found[f"cuda_v{v}_registers"] = lambda v=v: str(static()[nt(v)]["registers"])
    for v in range(1, 10):
        found[f"cuda_v{v}_us"] = lambda v=v: f"{us(v):,.0f}"
        found[f"cuda_v{v}_of_cublas"] = lambda v=v: f"{100 * timed(v)['of_cublas']['speed']:.1f}%"
    for v in (5, 6, 7, 8):  # "v5 to v8 ... run at 29%, 57%, 60% and 74%"
        found[f"cuda_v{v}_of_cublas_whole"] = lambda v=v: f"{round(100 * timed(v)['of_cublas']['speed'])}%"
    return found


NUMBERS: dict[str, Callable[[], str]] = {
    **_per_version(),
    # the GPU check: every timed version against the float64 reference
    "cuda_checked_up_to": lambda: str(max(r["version"] for r in timing()["check"]["rows"])),
    "cuda_check_worst_error": lambda: sci(max(max(r["rel_errors"].values()) for r in timing()["check"]["rows"])),
    # the arithmetic behind the predictions
    "cuda_warp_ffma": lambda: sci(WARP_FFMA, 3),
    "cuda_ffma_ms": lambda: f"{ffma_ms():.2f}",
    "cuda_wavefront_ms": lambda: f"{wavefront_ms():.2f}",
    # v1-v3: coalescing and shared tiles
    "cuda_v1_sectors_per_request": lambda: ratio(c(1, LD_SEC) / c(1, LD_REQ)),
    "cuda_v1_load_requests": lambda: sci(c(1, LD_REQ)),
    "cuda_v2_sectors_per_request": lambda: ratio(c(2, LD_SEC) / c(2, LD_REQ)),
    "cuda_v2_nn_sectors_per_request": lambda: ratio(counted(SHAPE)["dense_gemm_v2_nn_f32"][LD_SEC]
                                                    / counted(SHAPE)["dense_gemm_v2_nn_f32"][LD_REQ]),
    "cuda_v1_nn_ncu_us": lambda: f"{ncu('dense_gemm_v1_nn_f32')['gpu__time_duration.sum'] / 1e3:,.0f}",
    "cuda_v2_nn_ncu_us": lambda: f"{ncu('dense_gemm_v2_nn_f32')['gpu__time_duration.sum'] / 1e3:,.0f}",
    "cuda_v3_load_requests": lambda: sci(c(3, LD_REQ), 3),
    "cuda_v3_sectors_per_request": lambda: f"{c(3, LD_SEC) / c(3, LD_REQ):.2f}",
    "cuda_v3_shared_wavefronts": lambda: sci(c(3, WF_LD)),
    "cuda_v3_wavefronts_per_ffma": lambda: f"{c(3, WF_LD) / WARP_FFMA:g}",
    # v4-v6: register blocking, vector loads; ncu at 2048³
    "cuda_v4_shared_wavefronts": lambda: sci(c(4, WF_LD)),
    "cuda_v4_threads": lambda: str(static()[nt(4)]["threads"]),
    "cuda_v1_warps_per_sm": lambda: str(warps_per_sm(1)),
    "cuda_v3_threads": lambda: f"{static()[nt(3)]['threads']:,}",
    "cuda_v3_warps_per_sm": lambda: str(warps_per_sm(3)),
    "cuda_v3_lds128": lambda: str(loop(3)["lds"]["128"]),
    "cuda_v3_lds32": lambda: str(loop(3)["lds"]["32"]),
    "cuda_v4_warps_per_sm": lambda: str(warps_per_sm(4)),
    "cuda_v5_warps_per_sm": lambda: str(warps_per_sm(5)),
    "cuda_v6_warps_per_sm": lambda: str(warps_per_sm(6)),
    "cuda_v4_over_v3": lambda: gain(3, 4),
    "cuda_v3_occupancy": lambda: pct(3, OCCUPANCY),
    "cuda_v4_occupancy": lambda: pct(4, OCCUPANCY),
    "cuda_v5_occupancy": lambda: pct(5, OCCUPANCY),
    "cuda_v6_occupancy": lambda: pct(6, OCCUPANCY),
    "cuda_v3_sm_throughput": lambda: pct(3, SM),
    "cuda_v4_sm_throughput": lambda: pct(4, SM),
    "cuda_v5_sm_throughput": lambda: pct(5, SM),
    "cuda_v6_sm_throughput": lambda: pct(6, SM),
    "cuda_v7_sm_throughput": lambda: pct(7, SM),
    "cuda_v8_sm_throughput": lambda: pct(8, SM),
    "cuda_v5_shared_wavefronts": lambda: sci(c(5, WF_LD)),
    "cuda_v5_load_requests": lambda: sci(c(5, LD_REQ)),
    "cuda_v6_load_requests": lambda: sci(c(6, LD_REQ)),
    "cuda_v5_load_sectors": lambda: sci(c(5, LD_SEC)),
    "cuda_v6_load_sectors": lambda: sci(c(6, LD_SEC)),
    "cuda_v6_sectors_per_request": lambda: ratio(c(6, LD_SEC) / c(6, LD_REQ)),
    # v7, v8: warp tiles, double buffering
    "cuda_v7_shared_load_change": lambda: f"{round(100 * (c(7, WF_LD) / c(6, WF_LD) - 1))}%".replace("-", "−"),
    "cuda_v6_loop_instructions": lambda: f"{loop(6)['instructions']:,}",
    "cuda_v7_loop_instructions": lambda: f"{loop(7)['instructions']:,}",
    "cuda_v8_flop_per_byte": lambda: f"{static()[nt(8)]['napkin']['flop_per_byte']:.1f}",
    "cuda_v8_loop_instructions": lambda: f"{loop(8)['instructions']:,}",
    "cuda_v8_loop_ffma": lambda: str(loop(8)["fma"]),
    "cuda_v7_loop_ldg32": lambda: str(loop(7)["ldg"]["32"]),
    "cuda_v8_loop_ldg32": lambda: str(loop(8)["ldg"]["32"]),
    "cuda_v7_over_v6": lambda: gain(6, 7),
    "cuda_v8_over_v7": lambda: gain(7, 8),
    "cuda_v6_shared_per_ffma": lambda: f"{shared_per_ffma(6):.2f}",
    "cuda_v6_shared_ms": lambda: f"{shared_per_ffma(6) * wavefront_ms():.1f}",
    "cuda_v6_ms": lambda: f"{us(6) / 1e3:.1f}",
    # v9-v12
    "cuda_v9_slices": lambda: str(cli.load_file("cuda/static_report.py").splitk_slices(32, SHAPE, SHAPE, 128, 128,
                                                                                        sm_count())),
    "cuda_sm_count": lambda: str(sm_count()),
    "cuda_v9_nn_registers": lambda: str(static()["dense_gemm_v9_nn_f32"]["registers"]),
    "cuda_v9_over_v8": lambda: f"{round(100 * (us(9) / us(8) - 1), 1)}%",
    "cuda_small_us": lambda: f"{goal('forward, B=32')['cuda_us']:.0f}",
    "cuda_small_reference_us": lambda: f"{goal('forward, B=32')['reference_us']:.0f}",
    "cuda_v8_excess_stores": lambda: sci(c(8, X_ST)),
    "cuda_v8_shared_per_ffma": lambda: f"{shared_per_ffma(8):.3f}",
    "cuda_v10_extra_shared_bytes": lambda: str(static()[nt(10)]["shared_bytes"] - static()[nt(8)]["shared_bytes"]),
    "cuda_v11_threads": lambda: str(static()[nt(11)]["threads"]),
    "cuda_v11_warps_per_sm": lambda: str(warps_per_sm(11)),
    "cuda_v10_shared_per_ffma": lambda: f"{shared_per_ffma(10):.3f}",
    "cuda_v10_issue_ms": lambda: f"{issue_ms(10):.1f}",
    "cuda_v11_issue_ms": lambda: f"{issue_ms(11):.1f}",
    "cuda_v11_fewer_shared_loads": lambda: f"{round(100 * (1 - c(11, WF_LD) / c(10, WF_LD)))}%",
    "cuda_v10_shared_wavefronts": lambda: sci(c(10, WF_LD)),
    "cuda_v11_shared_wavefronts": lambda: sci(c(11, WF_LD)),
    "cuda_v10_store_sectors_per_request": lambda: ratio(c(10, ST_SEC) / c(10, ST_REQ)),
    "cuda_v11_store_sectors_per_request": lambda: ratio(c(11, ST_SEC) / c(11, ST_REQ)),
    "cuda_v12_places": lambda: str(v12_slicing()["places"]),
    "cuda_v12_tiles": lambda: str(v12_slicing()["tiles"]),
    "cuda_v12_asked": lambda: str(v12_slicing()["asked"]),
    "cuda_v12_steps": lambda: str(v12_slicing()["steps"]),
    "cuda_v12_bk": lambda: str(v12_slicing()["bk"]),
    "cuda_v12_per_slice": lambda: str(v12_slicing()["per_slice"]),
    "cuda_v12_slices": lambda: str(v12_slicing()["slices"]),
    "cuda_v12_blocks": lambda: str(v12_slicing()["blocks"]),
    "cuda_v12_empty": lambda: str(v12_slicing()["places"] - v12_slicing()["blocks"]),
    # autotuning's predictions, the goal
    "cuda_v8_issue_ratio": lambda: f"{us(8) / 1e3 / issue_ms(8):.2f}",
    "cuda_forward_goal": lambda: f"{goal('forward')['goal']:.2f}",
    "cuda_forward_goal_ms": lambda: f"{goal('forward')['reference_us'] / goal('forward')['goal'] / 1e3:.2f}",
    # the backward's kernels: g and y read, dz written, 4 bytes each, at the timed card's bandwidth
    "cuda_grad_predicted_us": lambda: f"{3 * SHAPE * SHAPE * 4 / roofline_of()['bandwidth'] * 1e6:.0f}",
    "cuda_grad_sectors_per_request": grad_sectors_per_request,
    # the static figures: the one entry that spills
    "cuda_v4_sm80_spill_bytes": lambda: str(committed("cuda_static_sm90.json")["archs"]["sm_80"]["entries"][nt(4)]
                                            ["spill_stores"]),
    # the roofline figure's numbers
    "cuda_roof_min": lambda: f"{min(100 * roofline()[v]['of_roof'] for v in range(5, 10)):.0f}%",
    "cuda_roof_max": lambda: f"{max(100 * roofline()[v]['of_roof'] for v in range(5, 10)):.0f}%",
    "cuda_dram_share_max": lambda: f"{100 * roofline()[dram_worst()]['dram_share']:.0f}%",
    "cuda_dram_worst": lambda: str(dram_worst()),
    "cuda_v1_requested_bytes": lambda: sci(roofline()[1]["requested_bytes"]),
    "cuda_v1_dram_share": lambda: f"{100 * roofline()[1]['dram_share']:.0f}%",
    "cuda_ncu_operands_mib": lambda: f"{3 * 4 * ncu_record()['shape'][0] ** 2 / 2 ** 20:.0f}",
    # bank conflicts at 2048³, counted and by ncu's counter
    "cuda_v5_excess_loads": lambda: f"{c(5, X_LD, 2048):,.0f}",
    "cuda_v5_ncu_bank_loads": lambda: short_e(ncu(nt(5))[BANK.format("ld")], 2),
    "cuda_v6_excess_stores": lambda: f"{c(6, X_ST, 2048):,.0f}",
    "cuda_ncu_bank_stores_min": lambda: f"{min(ncu_store_counter(v) for v in range(6, 10)) / 1e6:.1f}",
    "cuda_ncu_bank_stores_max": lambda: f"{max(ncu_store_counter(v) for v in range(6, 10)) / 1e6:.1f}",
    "cuda_v12_excess_stores": lambda: f"{c(12, X_ST, 2048):,.0f}",
    "cuda_v12_excess_stores_4096": lambda: short_e(c(12, X_ST), 3),
    "cuda_ncu_false_stores_min": lambda: f"{100 * min(ncu_false_store_shares()):.0f}",
    "cuda_ncu_false_stores_max": lambda: f"{100 * max(ncu_false_store_shares()):.0f}%",
}
