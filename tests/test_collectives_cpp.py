"""The segmented ring with its loop in C++ (parallel/cpp_loop.py): the Python version's bits.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from conftest import REASONS, all_reduce_case
from parallel.launch import launch

pytestmark = [pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
              pytest.mark.skipif(REASONS["cpp"] is not None, reason=f"needs a C++ build: {REASONS['cpp']}")]


@pytest.fixture(scope="module", autouse=True)
def built():
    """Build once here, before any rank starts (the ranks then load the cached library)."""
    from parallel import cpp_loop

    cpp_loop.build()


def cpp_against_python(segment_bytes: int) -> list:
    """Both loops on the same inputs, NaN payloads and infinities included, with segments of
    ``segment_bytes`` (a few bytes: many segments, and the two in flight straddle the steps)."""
    from parallel import collectives, cpp_loop

    rank, out = dist.get_rank(), []
    collectives.SEGMENT_BYTES = segment_bytes
    for numel in (0, 1, 2, 5, 17, 1000, 4099) + ((300_001,) if segment_bytes >= 1 << 16 else ()):
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
            for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
                t, expected = all_reduce_case(numel, dtype, op, 100)
                if dtype == torch.float32 and numel > 2:
                    t.view(torch.int32)[1] = 0x7FC00000 + rank + 1
                    t[2] = float("inf") if rank % 2 else float("-inf")
                python = collectives.all_reduce(t.clone(), op, "segmented_ring")
                cpp = cpp_loop.segmented_ring(t.clone(), op)
                same = cpp.view(torch.uint8).numpy().tobytes() == python.view(torch.uint8).numpy().tobytes()
                out.append((numel, str(dtype), op, same, cpp if numel < 10 else None))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size,segment_bytes", [(2, 24), (3, 24), (5, 256), (3, 64 << 10)])
def test_the_cpp_loop_gives_the_python_loops_bits(world_size, segment_bytes):
    results = launch(cpp_against_python, world_size, (segment_bytes,), deadline_s=240)
    assert len(results[0]) == (8 if segment_bytes >= 1 << 16 else 7) * 7  # every case ran, on every rank
    for case in range(len(results[0])):
        numel, dtype, op, _, small = results[0][case]
        assert all(r[case][3] for r in results), f"{numel} {dtype} {op}: not the Python loop's bits"
        if numel == 1 and dtype.endswith("int64"):  # and those bits are a sum: not, say, untouched
            assert small.item() == sum(all_reduce_case_value(r) for r in range(world_size))


def all_reduce_case_value(rank: int) -> int:
    """The one element all_reduce_case(1, int64, "sum", 100) gives rank ``rank``."""
    g = torch.Generator().manual_seed(7919 * rank + 1)
    return int((torch.randn(1, generator=g) * 100).to(torch.int64).item())


def refusals() -> list[str]:
    from parallel import cpp_loop

    out = []
    for call in (lambda: cpp_loop.segmented_ring(torch.arange(6.0).view(2, 3).t()),
                 lambda: cpp_loop.segmented_ring(torch.arange(6), "avg"),
                 lambda: cpp_loop.segmented_ring(torch.arange(6.0), "max")):
        try:
            call()
            out.append("no error")
        except (TypeError, ValueError) as e:
            out.append(str(e))
    return out


def test_the_cpp_loop_refuses_what_it_cannot_do():
    for messages in launch(refusals, 2, deadline_s=120):
        assert "contiguous" in messages[0]
        assert "floating-point" in messages[1]
        assert "op must be one of" in messages[2]
