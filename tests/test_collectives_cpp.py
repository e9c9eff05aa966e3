"""The segmented ring with its loop in C++ (parallel/collectives/cpp_loop.py): the Python version's bits.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from conftest import all_reduce_case
from parallel.collectives import cpp_loop
from parallel.common.launch import launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
NEEDS_BUILD = pytest.mark.skipif(cpp_loop.unavailable() is not None, reason=f"{cpp_loop.unavailable()}")


@pytest.fixture(scope="module")
def built():
    """Build once here, before any rank starts (the ranks then load the cached library)."""
    cpp_loop.build()


def cpp_against_python(segment_bytes: int) -> list:
    """Both loops on the same inputs, NaN payloads and infinities included, with segments of
    ``segment_bytes`` (a few bytes: many segments, and the two in flight straddle the steps)."""
    from parallel.collectives import algorithms as collectives
    from parallel.collectives import cpp_loop

    rank, out = dist.get_rank(), []
    collectives.SEGMENT_BYTES = segment_bytes
    # 1000 splits evenly at 2, 4 and 5 ranks, 1001 at none of 2 to 5 (uneven chunks, a short last one)
    for numel in (0, 1, 2, 5, 17, 1000, 1001) + ((300_001,) if segment_bytes >= 1 << 16 else ()):
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
            for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
                t, expected = all_reduce_case(numel, dtype, op, 100)
                if dtype == torch.float32 and numel > 2:
                    t.view(torch.int32)[1] = 0x7FC00000 + rank + 1
                    t[2] = float("inf") if rank % 2 else float("-inf")
                python = collectives.all_reduce(t.clone(), op, "segmented_ring")
                cpp = cpp_loop.segmented_ring(t.clone(), op, check=numel < 100)  # agreeing first, or not
                same = cpp.view(torch.uint8).numpy().tobytes() == python.view(torch.uint8).numpy().tobytes()
                # the integer sums are exact: they must equal dist.all_reduce's (not, say, stay untouched)
                exact = torch.equal(cpp, expected) if dtype == torch.int64 else None
                out.append((numel, str(dtype), op, same, exact))
    return out


@NEEDS_BUILD
@pytest.mark.slow
@pytest.mark.parametrize("world_size,segment_bytes", [(2, 24), (3, 24), (4, 24), (5, 256), (3, 64 << 10)])
def test_the_cpp_loop_gives_the_python_loops_bits(built, world_size, segment_bytes):
    results = launch(cpp_against_python, world_size, (segment_bytes,), deadline_s=240)
    for r in results:  # every case ran on every rank
        assert len(r) == (8 if segment_bytes >= 1 << 16 else 7) * 7
    for case in range(len(results[0])):
        numel, dtype, op, _, _ = results[0][case]
        assert all(r[case][3] for r in results), f"{numel} {dtype} {op}: not the Python loop's bits"
        assert all(r[case][4] in (True, None) for r in results), f"{numel} {dtype} {op}: not dist.all_reduce's sum"


def on_subgroups() -> list:
    """Groups {0, 2} and {1, 3} of a world of four: the op finds each group by its name."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    t = torch.arange(1000.0) + 10 * rank
    return cpp_loop.segmented_ring(t, group=groups[rank % 2]).tolist()


@NEEDS_BUILD
@pytest.mark.slow
def test_the_cpp_loop_on_a_subgroup(built):
    for rank, got in enumerate(launch(on_subgroups, 4, deadline_s=120)):  # (x + 10·r) + (x + 10·(r + 2))
        assert got == (2 * torch.arange(1000.0) + 10 * (2 * (rank % 2) + 2)).tolist(), rank


def refusals() -> list[str]:
    from parallel.common.p2p import RingError

    out = []
    for call in (lambda: cpp_loop.segmented_ring(torch.arange(6.0).view(2, 3).t()),
                 lambda: cpp_loop.segmented_ring(torch.arange(6), "avg"),
                 lambda: cpp_loop.segmented_ring(torch.arange(6.0), "max"),
                 lambda: cpp_loop.segmented_ring(torch.arange(6.0 + dist.get_rank()))):  # numels differ
        try:
            call()
            out.append("no error")
        except (TypeError, ValueError, RingError) as e:
            out.append(str(e))
    return out


def test_the_cpp_loop_refuses_what_it_cannot_do():
    """Mistakes are found before the C++ runs (so without a build): no hang, a clear error."""
    for messages in launch(refusals, 2, deadline_s=120):
        assert "contiguous" in messages[0]
        assert "floating-point" in messages[1]
        assert "op must be one of" in messages[2]
        assert "6" in messages[3] and "7" in messages[3], messages[3]  # each rank's numel, named


def auto_before_and_after_loading() -> list:
    """``auto`` picking the segmented ring (forced here, so that small tensors take it): the
    Python loop until this process loads the library, the C++ loop after, the same bits both
    times, non-contiguous tensors included. The Python loop's ``_in_pairs`` counts its calls."""
    from parallel.collectives import algorithms as collectives
    from parallel.collectives import cpp_loop

    python_loops, run_pairs = [], collectives._in_pairs
    collectives._in_pairs = lambda *a: python_loops.append(1) or run_pairs(*a)
    collectives.choose = lambda *a: "segmented_ring"
    collectives.SEGMENT_BYTES = 40  # many segments a chunk
    out = []
    for load in (False, True):
        if load:
            cpp_loop.build()
        for numel, dtype, op in ((1000, torch.float32, "sum"), (999, torch.float64, "avg"), (77, torch.int64, "sum")):
            t, expected = all_reduce_case(numel, dtype, op, 100)
            python = collectives.all_reduce(t.clone(), op, "segmented_ring")
            del python_loops[:]
            auto = collectives.all_reduce(t.clone(), op)
            strided = torch.stack([t, t], 1)[:, 0]  # every other element of a (numel, 2) tensor
            assert not strided.is_contiguous()
            auto_strided = collectives.all_reduce(strided, op)
            same = (auto.view(torch.uint8).numpy().tobytes() == python.view(torch.uint8).numpy().tobytes()
                    and torch.equal(auto_strided, auto))
            exact = torch.equal(auto, expected) if dtype == torch.int64 else None
            out.append((load, str(dtype), len(python_loops), same, exact))
    return out


@NEEDS_BUILD
@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_auto_runs_the_cpp_loop_once_the_process_has_loaded_it(built, world_size):
    for rank, cases in enumerate(launch(auto_before_and_after_loading, world_size, deadline_s=240)):
        for load, dtype, python_loops, same, exact in cases:
            # two calls (auto on a contiguous and on a strided tensor), two phases each
            assert python_loops == (0 if load else 4), (rank, load, dtype, python_loops)
            assert same, (rank, load, dtype)
            assert exact in (True, None), (rank, load, dtype)


def one_rank_loaded() -> tuple[int, bytes, bytes]:
    """Rank 0 has loaded the library, the others have not: ``auto`` runs the C++ loop on rank 0
    and the Python loop elsewhere. They send the same messages, so they interoperate."""
    from parallel.collectives import algorithms as collectives
    from parallel.collectives import cpp_loop

    collectives.choose = lambda *a: "segmented_ring"
    collectives.SEGMENT_BYTES = 40
    if dist.get_rank() == 0:
        cpp_loop.build()
    t, _ = all_reduce_case(1001, torch.float32, "avg", 100)
    auto = collectives.all_reduce(t.clone(), "avg")
    python = collectives.all_reduce(t.clone(), "avg", "segmented_ring")
    return int(collectives.loop_in_cpp()), auto.numpy().tobytes(), python.numpy().tobytes()


@NEEDS_BUILD
@pytest.mark.slow
def test_ranks_with_and_without_the_cpp_loop_interoperate(built):
    results = launch(one_rank_loaded, 3, deadline_s=240)
    assert [loaded for loaded, _, _ in results] == [1, 0, 0]
    for _, auto, python in results:
        assert auto == python == results[0][2]
