"""The numbers in the sentences of chapter 6 (tiles/README.md), by the names their number
markers give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each
computed from the record or the source that backs it.

The records: the newest timing at 4096³ (triton_gpu_{card}_4096.json, the one the chapter's
first timing table shows) and the compiler's figures (triton_static_sm90.json, with chapter 3's
cuda_static_sm90.json beside it); the source: the tile configurations in tiles/kernels.py, read
without importing Triton."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import cli
from record_info import RESULTS, committed, in_words, source_match

ROOT = Path(__file__).resolve().parent.parent



# ---------------------------------------------------------------------------------------
# The timing at 4096³
# ---------------------------------------------------------------------------------------
@cache
def timing() -> dict[str, dict]:
    """Line -> its row, in the newest record of the 4096³ timings."""
    found = cli.load_file("docs/records.py").of_kind("triton_gpu_{card}_4096.json", RESULTS)
    if not found:
        raise ValueError("no triton_gpu_{card}_4096.json record in docs/results")
    return {r["line"]: r for r in found[0][1]["results"]}


def forward_us(line: str) -> float:
    return timing()[line]["forward_us"]


# ---------------------------------------------------------------------------------------
# The compiler's figures
# ---------------------------------------------------------------------------------------
def triton_forward() -> dict:
    """Triton's IEEE float32 forward in the static record."""
    return next(k for k in committed("triton_static_sm90.json")["kernels"]
                if k["label"] == "forward" and k["dtype"] == "f32" and k["precision"] == "ieee")


def v8() -> dict:
    """Chapter 3's v8 (the forward: nt, float32) in the record the Triton report compares with."""
    record = ROOT / committed("triton_static_sm90.json")["compare_with"]
    return next(k for k in json.loads(record.read_text())["kernels"] if k["name"] == "dense_gemm_v8_nt_f32")


def v8_k_steps() -> str:
    """The steps of k v8's inner loop covers: its FFMAs over the TM×TN outputs each step updates."""
    tile = v8()["tile"]
    steps, left = divmod(v8()["inner_loop"]["fma"], tile["tm"] * tile["tn"])
    if left:
        raise ValueError(f"v8's inner loop has {v8()['inner_loop']['fma']} FFMAs, not a multiple of TM×TN")
    return str(steps)


# ---------------------------------------------------------------------------------------
# The source's tile configurations
# ---------------------------------------------------------------------------------------
@cache
def _kernels_source() -> dict[str, ast.expr]:
    tree = ast.parse((ROOT / "tiles" / "kernels.py").read_text())
    return {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


@cache
def forward_configs() -> list[tuple[int, int, int, int, int]]:
    """FORWARD_CONFIGS as (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): the comprehension's list."""
    node = _kernels_source()["FORWARD_CONFIGS"]
    if not isinstance(node, ast.ListComp):
        raise ValueError("tiles/kernels.py's FORWARD_CONFIGS is no longer a comprehension over a list")
    return [tuple(c) for c in ast.literal_eval(node.generators[0].iter)]


def tile(bm: int, bn: int) -> str:
    return f"{bm}×{bn}"


def interpreter_tile() -> str:
    config = ast.literal_eval(_kernels_source()["INTERPRETER_CONFIG"])
    return tile(config["BLOCK_M"], config["BLOCK_N"])


NUMBERS: dict[str, Callable[[], str]] = {
    "tiles_triton_pin": lambda: source_match("requirements.txt", r"^triton==(\S+)"),
    # the tiles: the interpreter's, and the range the autotuner chooses among
    "tiles_interpreter_tile": interpreter_tile,
    "tiles_smallest_tile": lambda: tile(*min(forward_configs(), key=lambda c: c[0] * c[1])[:2]),
    "tiles_largest_tile": lambda: tile(*max(forward_configs(), key=lambda c: c[0] * c[1])[:2]),
    "tiles_warps": lambda: " or ".join(str(w) for w in sorted({c[3] for c in forward_configs()})),
    "tiles_fewest_stages": lambda: str(min(c[4] for c in forward_configs())),
    "tiles_most_stages": lambda: str(max(c[4] for c in forward_configs())),
    # the steps of k a main loop covers: Triton's forward, chapter 3's v8
    "tiles_triton_bk": lambda: str(triton_forward()["tile"]["bk"]),
    "tiles_v8_bk": v8_k_steps,
    # the 4096³ timing, as the closing paragraph reads it
    "tiles_triton_tflops": lambda: f"{timing()['triton']['forward_tflops']:.0f}",
    "tiles_triton_of_reference": lambda: f"{forward_us('reference') / forward_us('triton'):.2f}",
    "tiles_triton_of_cuda": lambda: f"{forward_us('cuda') / forward_us('triton'):.1f}",
    "tiles_tf32_speedup": lambda: f"{forward_us('triton') / forward_us('triton, TF32'):.1f}",
    "tiles_triton_tf32_tflops": lambda: f"{timing()['triton, TF32']['forward_tflops']:.0f}",
    "tiles_reference_tf32_tflops": lambda: f"{timing()['reference, TF32']['forward_tflops']:.0f}",
    # the compiler's figures it predicted them from: blocks per SM and registers, Triton's and v8's
    "tiles_triton_blocks": lambda: in_words(triton_forward()["blocks_per_sm"]),
    "tiles_triton_registers": lambda: str(triton_forward()["registers"]),
    "tiles_v8_blocks": lambda: in_words(v8()["blocks_per_sm"]),
    "tiles_v8_registers": lambda: str(v8()["registers"]),
}
