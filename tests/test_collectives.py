"""Doubling and halving-doubling all-reduce, the choice by size, the cost model.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from conftest import all_reduce_case, world_sizes
from distributed import train
from parallel.collectives import costmodel
from parallel.collectives.algorithms import ALGORITHMS, RingError, all_reduce, choose
from parallel.common.launch import launch
from parallel.common.training import Config

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

NUMELS = [0, 1, 3, 7, 1000, 12345]
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16)
NOT_RING = tuple(a for a in ALGORITHMS if a not in ("auto", "ring"))  # the ring has its own tests


def collective_cases(big: int) -> list:
    """Every algorithm, size, dtype and op against dist.all_reduce on the same inputs."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for algorithm in ALGORITHMS:
        for numel in NUMELS + ([big] if big and algorithm != "ring" else []):
            for dtype in DTYPES if numel != big else (torch.float32,):
                for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
                    t, expected = all_reduce_case(numel, dtype, op, 100)
                    all_reduce(t, op, algorithm, check=(numel != big))
                    out.append((algorithm, numel, str(dtype), op, t, expected))
    # a non-contiguous tensor is reduced through a contiguous copy and written back in place
    for algorithm in NOT_RING:
        base = torch.arange(12.0).reshape(3, 4) * (rank + 1)
        all_reduce(base.t(), algorithm=algorithm)
        out.append((algorithm, "t()", "float32", "sum", base, torch.arange(12.0).reshape(3, 4) * n * (n + 1) / 2))
    return out


@pytest.mark.parametrize("world_size", world_sizes(1, 2, 3, 4, 5))
def test_every_algorithm_matches_dist_all_reduce_and_is_identical_on_every_rank(world_size):
    big = 2_000_003 if world_size == 3 else 0  # a few million elements once (3: the fold-in path)
    results = launch(collective_cases, world_size, (big,), deadline_s=240)
    for case in range(len(results[0])):
        algorithm, numel, dtype, op, got, expected = results[0][case]
        what = f"{algorithm} {numel} {dtype} {op}"
        if dtype.endswith("int64"):
            assert torch.equal(got, expected), what
        elif dtype.endswith("bfloat16"):  # 8 bits of mantissa; the order of the additions shows
            torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=4.0, msg=what)
        else:
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3, msg=what)
        for other in results[1:]:  # bit-identical across ranks
            assert other[case][4].view(-1).view(torch.uint8).numpy().tobytes() == \
                got.view(-1).view(torch.uint8).numpy().tobytes(), what


def on_a_subgroup() -> list:
    """Groups {0, 2} and {1, 3} of a world of four: group ranks are not global ranks."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    out = []
    for algorithm in ALGORITHMS:
        t = torch.arange(5.0) + 10 * rank
        out.append((algorithm, all_reduce(t, algorithm=algorithm, group=groups[rank % 2])))
    return out


def test_every_algorithm_on_a_subgroup():
    for rank, results in enumerate(launch(on_a_subgroup, 4, deadline_s=120)):
        for algorithm, got in results:  # (0..4 + 10·r) + (0..4 + 10·(r + 2))
            assert torch.equal(got, 2 * torch.arange(5.0) + 10 * (2 * (rank % 2) + 2)), algorithm


def nan_payloads() -> list[bytes]:
    """Each rank's NaN carries its own payload: which payload survives a + b depends on the
    order of the operands, so this shows whether every rank computed the same expression."""
    rank, out = dist.get_rank(), []
    for algorithm in NOT_RING:
        t = torch.tensor([0.5, -0.0, 1.0, 3.0], dtype=torch.float32)
        t.view(torch.int32)[0] = 0x7FC00000 + rank + 1   # a quiet NaN, payload rank + 1
        if rank % 2:
            t.view(torch.int32)[2] = 0x7FC00000 + 16 * (rank + 1)
        all_reduce(t, algorithm=algorithm)
        out.append(t.numpy().tobytes())
    return out


def mismatched_calls() -> list[str]:
    rank, out = dist.get_rank(), []
    for algorithm in NOT_RING:  # after a RingError the ranks are still in step
        try:
            all_reduce(torch.zeros(10 + rank), algorithm=algorithm)
            out.append("no error")
        except RingError as e:
            out.append(str(e))
    return out


def edge_cases() -> tuple[list[bytes], list[str]]:
    return nan_payloads(), mismatched_calls()


@pytest.mark.parametrize("world_size", world_sizes(3, 4, quick=3))
def test_nan_payloads_identical_on_every_rank_and_disagreeing_ranks_all_get_a_clear_error(world_size):
    results = launch(edge_cases, world_size, deadline_s=60)
    for i, algorithm in enumerate(NOT_RING):
        assert all(r[0][i] == results[0][0][i] for r in results), algorithm
        values = torch.frombuffer(bytearray(results[0][0][i]), dtype=torch.float32)
        assert math.isnan(values[0]) and values[1].item() == 0.0 and math.copysign(1, values[1].item()) == -1
        for _, messages in results:
            assert "ranks passed different tensors or ops" in messages[i], algorithm
            assert f"rank {world_size - 1}: numel {9 + world_size}" in messages[i], algorithm


def split_into_messages(message_bytes: int) -> list:
    """Every collective with each tensor cut into messages of ``message_bytes`` (p2p.post),
    and with one message per tensor: the same bits must come out."""
    from parallel.common import p2p
    from parallel.dp import ring

    rank, out, default = dist.get_rank(), [], p2p.MESSAGE_BYTES
    for numel in (1, 17, 1000, 4099):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            results = []
            for size in (message_bytes, 0):
                p2p.MESSAGE_BYTES = size
                try:
                    t, expected = all_reduce_case(numel, dtype, "sum", 100)
                    got = [all_reduce(t.clone(), algorithm=a) for a in ALGORITHMS if a != "auto"]
                    rows = t.view(-1, 1)  # uneven shards along dimension 0 for the two halves of the ring
                    got += [ring.ring_reduce_scatter(rows, segment_bytes=256),
                            ring.ring_all_gather(rows[: rank + 1], segment_bytes=256),
                            ring.ring_all_reduce(t.clone(), segment_bytes=256)]
                finally:
                    p2p.MESSAGE_BYTES = default
                results.append([g.view(-1).view(torch.uint8).numpy().tobytes() for g in got])
            out.append((numel, str(dtype), results[0] == results[1], got[0], expected))
    return out


@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_messages_cut_small_give_the_same_bits_as_one_message(world_size):
    for results in zip(*launch(split_into_messages, world_size, (12,), deadline_s=120)):
        for numel, dtype, same, got, expected in results:
            assert same, f"{numel} {dtype}: cutting the messages changed the result"
            if dtype.endswith("bfloat16"):
                torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=4.0)
            else:
                torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3)


def segmented_against_the_ring(segment_bytes: int) -> list:
    """The segmented ring with segments of ``segment_bytes`` (so a chunk of a few hundred bytes
    goes in many, and the two in flight straddle the steps) against ring_all_reduce: the same
    additions in the same order must give the same bits, NaN payloads included."""
    from parallel.collectives import algorithms as collectives
    from parallel.dp import ring

    rank, out = dist.get_rank(), []
    collectives.SEGMENT_BYTES = segment_bytes
    for numel in (1, 2, 5, 17, 1000, 1001):  # 1001: chunks uneven at 2, 3 and 5 ranks, dozens of segments each
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
            for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
                t, expected = all_reduce_case(numel, dtype, op, 100)
                if dtype == torch.float32 and numel > 2:  # NaNs with this rank's payload, and infinities
                    t.view(torch.int32)[1] = 0x7FC00000 + rank + 1
                    t[2] = float("inf") if rank % 2 else float("-inf")
                    expected = t.clone()
                    dist.all_reduce(expected)
                    expected /= dist.get_world_size() if op == "avg" else 1
                theirs = ring.ring_all_reduce(t.clone(), op)
                for direct in (True, False):  # as it posts by default, and as the benchmark's alternative
                    collectives.SEGMENTED_DIRECT = direct
                    mine = all_reduce(t.clone(), op, "segmented_ring")
                    same = mine.view(-1).view(torch.uint8).numpy().tobytes() == \
                        theirs.view(-1).view(torch.uint8).numpy().tobytes()
                    out.append((numel, str(dtype), op, same, mine, expected))
    collectives.SEGMENTED_DIRECT = True
    return out


@pytest.mark.parametrize("world_size", world_sizes(2, 3, 5, quick=1))  # 16 s at 2 ranks: slow suite
def test_the_segmented_ring_gives_the_rings_bits_with_many_segments(world_size):
    results = launch(segmented_against_the_ring, world_size, (24,), deadline_s=120)
    for case in range(len(results[0])):
        numel, dtype, op, same, got, expected = results[0][case]
        what = f"{numel} {dtype} {op}"
        assert all(r[case][3] for r in results), what + ": not the ring's bits"
        assert all(torch.equal(r[case][4].view(torch.uint8) if r[case][4].is_floating_point() else r[case][4],
                               got.view(torch.uint8) if got.is_floating_point() else got) for r in results), what
        if dtype.endswith("float32") and numel > 2:  # NaN where dist.all_reduce has NaN: -inf + inf, a NaN
            assert math.isnan(got[1]) and math.isnan(got[2]), what
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3, equal_nan=True, msg=what)
        elif dtype.endswith("bfloat16"):
            torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=4.0, msg=what)
        elif dtype.endswith("int64"):
            assert torch.equal(got, expected), what
        else:
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3, msg=what)


def test_two_steps_in_flight_and_each_finished_before_the_one_two_later_is_posted():
    from parallel.collectives.algorithms import _in_pairs

    events: list[str] = []
    _in_pairs(5, lambda i: (events.append(f"post {i}") or i,), lambda i: events.append(f"finish {i}"))
    assert events == ["post 0", "post 1", "finish 0", "post 2", "finish 1", "post 3", "finish 2", "post 4",
                      "finish 3", "finish 4"]
    events.clear()
    _in_pairs(1, lambda i: (events.append(f"post {i}") or i,), lambda i: events.append(f"finish {i}"))
    assert events == ["post 0", "finish 0"]


def test_a_tensor_is_cut_into_nearly_equal_messages_of_about_message_bytes():
    from parallel.common import p2p

    t = torch.arange(1001, dtype=torch.float64)  # 8008 bytes
    for limit, count in ((0, 1), (1 << 20, 1), (8008, 1), (8000, 2), (1024, 8), (12, 668), (8, 1001)):
        parts = p2p._messages(t, limit)
        sizes = [p.numel() for p in parts]
        assert len(parts) == count and max(sizes) - min(sizes) <= 1, limit
        assert torch.equal(torch.cat(parts), t)


def test_argument_errors_need_no_process_group():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        all_reduce(torch.zeros(3), algorithm="tree")
    with pytest.raises(ValueError, match="op must be one of"):
        all_reduce(torch.zeros(3), "max")
    with pytest.raises(TypeError, match="op 'avg' needs a floating-point tensor"):
        all_reduce(torch.zeros(3, dtype=torch.int64), "avg")
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        all_reduce([1.0])


# ---------------------------------------------------------------------------
# The cost model and the choice by size
# ---------------------------------------------------------------------------

def test_model_formulas():
    link = costmodel.Link(alpha=1.0, beta=0.01, gamma=0.0)
    n, nbytes = 4, 800
    assert costmodel.ring(n, nbytes, link) == pytest.approx(2 * 3 * 1.0 + 2 * 3 / 4 * 800 * 0.01)
    assert costmodel.one_shot(n, nbytes, link) == pytest.approx(1.0 + 3 * 8)
    assert costmodel.two_shot(n, nbytes, link) == pytest.approx(2 * 1.0 + 2 * 3 / 4 * 8)
    adding = costmodel.Link(alpha=0.0, beta=0.0, gamma=0.01)  # who adds how much
    assert costmodel.ring(n, nbytes, adding) == pytest.approx(costmodel.two_shot(n, nbytes, adding)) == \
        pytest.approx(3 / 4 * 8)  # chunks smaller than a piece: the ring adds all of them in the open
    assert costmodel.one_shot(n, nbytes, adding) == pytest.approx(3 * 8)
    # chunks of four pieces: only the first piece's addition of each reduce step is charged
    big = 16 * costmodel.PIECE_BYTES
    assert costmodel.ring(n, big, adding) == pytest.approx(3 * costmodel.PIECE_BYTES * 0.01)
    assert costmodel.two_shot(n, big, adding) == pytest.approx(3 / 4 * big * 0.01)
    assert costmodel.reduce_scatter(n, big, adding) == pytest.approx(costmodel.ring(n, big, adding))
    assert costmodel.doubling(n, nbytes, link) == pytest.approx(2 * (1.0 + 8))
    assert costmodel.halving_doubling(n, nbytes, link) == pytest.approx(4 * 1.0 + 2 * 3 / 4 * 8)
    # 5 ranks: the power of two below is 4, and the extra rank costs a hand-in and a hand-back
    assert costmodel.doubling(5, nbytes, link) == pytest.approx(2 * 9 + 2 * 9)
    assert costmodel.ring(1, nbytes, link) == costmodel.doubling(1, nbytes, link) == 0
    assert costmodel.one_shot(1, nbytes, link) == costmodel.two_shot(1, nbytes, link) == 0


def test_direct_steps_have_their_own_line():
    both = costmodel.Link(alpha=1.0, beta=0.01, gamma=0.0, alpha_direct=3.0, beta_direct=0.02)
    n, nbytes = 4, 800
    # one-shot: one direct step of (n − 1)·N bytes; two-shot: two of (n − 1)/n·N
    assert costmodel.one_shot(n, nbytes, both) == pytest.approx(3.0 + 3 * 800 * 0.02)
    assert costmodel.two_shot(n, nbytes, both) == pytest.approx(2 * 3.0 + 2 * 3 / 4 * 800 * 0.02)
    # the ring, doubling and halving-doubling talk to one peer per step: α and β
    assert costmodel.ring(n, nbytes, both) == pytest.approx(2 * 3 * 1.0 + 2 * 3 / 4 * 800 * 0.01)
    assert costmodel.doubling(n, nbytes, both) == pytest.approx(2 * (1.0 + 8))
    # without a direct fit a direct step costs α + β·bytes
    assert costmodel.Link(alpha=1.0, beta=0.01).direct() == (1.0, 0.01)
    # a costlier direct step hands 256 KiB at 4 ranks from two-shot to a one-peer algorithm
    # (here halving-doubling: the ring's bytes in 2·log₂4 = 4 steps instead of 6)
    cheap = costmodel.Link(alpha=100e-6, beta=1e-9, gamma=0.25e-9)
    dear = costmodel.Link(alpha=100e-6, beta=1e-9, gamma=0.25e-9, alpha_direct=300e-6, beta_direct=1.2e-9)
    assert costmodel.choose(4, 256 << 10, cheap) == "two_shot"
    assert costmodel.choose(4, 256 << 10, dear) == "halving_doubling"


def test_fit_record_with_direct_steps_is_read_and_shown(tmp_path):
    points = [{"bytes": m, "measured_us": 1.0, "fitted_us": 1.0, "residual_pct": 0.0} for m in costmodel.SIZES]
    fits = {"2": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9, "gamma_s_per_byte": 1e-10, "bandwidth_gbs": 1.0,
                  "add_gbs": 10.0, "points": points},
            "3": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9, "gamma_s_per_byte": 1e-10, "bandwidth_gbs": 1.0,
                  "add_gbs": 10.0, "points": points, "alpha_direct_s": 5e-4, "beta_direct_s_per_byte": 2e-9,
                  "direct_points": [dict(p, residual_pct=-7.0) for p in points]}}
    record = {"fits": fits, "threads_per_rank": 1, "device": "cpu", "torch": "x", "date": "d", "command": "c"}
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(record))
    links = costmodel.fitted_links(path)
    assert costmodel.fitted_links()[2] != links[2]  # the committed fit, unchanged by reading another
    assert links[2].direct() == (1e-4, 1e-9)
    assert links[3].direct() == (5e-4, 2e-9)
    table = costmodel.fit_table(record)
    assert "| 2 | 100 |" in table and "| = α | = β | — |" in table
    assert "| 500 | 2.000 | -7% |" in table


def test_the_chapters_cost_table_prices_exactly_the_algorithms_implemented():
    """Each row of parallel/collectives/README.md's cost table is an all-reduce that
    algorithms.py runs and costmodel.py prices (or the fold-in they add), and each of those has
    a row: no row for an algorithm the code does not have."""
    from conftest import ROOT

    text = (ROOT / "parallel" / "collectives" / "README.md").read_text()
    table = text[text.index("| algorithm | latency term"):].split("\n\n")[0].splitlines()[2:]
    names = [row.split("|")[1].strip() for row in table]
    keys = [name.split(" (")[0].split(",")[0].removeprefix("recursive ").replace("-", "_").replace(" ", "_")
            for name in names]
    assert sorted(keys) == sorted([*costmodel.PREDICT, "fold_in"]), names
    assert set(costmodel.PREDICT) == set(ALGORITHMS) - {"auto"}


def test_the_model_knows_the_rings_piece_size():
    from parallel.dp.ring import DEFAULT_SEGMENT_BYTES, _pieces

    assert costmodel.PIECE_BYTES == DEFAULT_SEGMENT_BYTES
    # the piece the model charges is the piece the ring cuts, whole pieces and split ones alike
    for n, nbytes in [(2, 4 << 20), (3, 16 << 20), (4, 16 << 20), (3, 64 << 20), (4, 24 << 20)]:
        chunks = list(torch.tensor_split(torch.empty(nbytes // 4), n))
        pieces, _ = _pieces(chunks, DEFAULT_SEGMENT_BYTES)
        assert 4 * pieces[0][0].numel() == pytest.approx(costmodel.ring_piece(n, nbytes), abs=4)
    # 16 MiB over 3 ranks: chunks of 5⅓ MiB go as two pieces of 2⅔ MiB, not as 4 MiB + 1⅓ MiB
    assert costmodel.ring_piece(3, 16 << 20) == pytest.approx((16 << 20) / 6)


def test_the_model_knows_the_segmented_rings_segments():
    from parallel.collectives import algorithms as collectives

    assert costmodel.SEGMENT_BYTES == collectives.SEGMENT_BYTES
    # the segments the model charges are the ones the code cuts
    for n, nbytes in [(2, 1 << 20), (2, 4 << 20), (3, 16 << 20), (4, 16 << 20), (2, 64 << 20), (3, 24 << 20)]:
        longest = torch.tensor_split(torch.empty(nbytes // 4), n)[0].numel() * 4
        s, m = costmodel.ring_segments(n, nbytes)
        assert collectives._segments_per_chunk(longest) == s, (n, nbytes)
        assert longest / s == pytest.approx(m, abs=4)
    # at least two segments a chunk (one is added while the other travels), at most SEGMENT_BYTES each
    assert costmodel.ring_segments(2, 1 << 20) == (2, 256 << 10)
    assert costmodel.ring_segments(2, 16 << 20) == (8, 1 << 20)
    assert costmodel.ring_segments(3, 16 << 20) == (6, (16 << 20) / 18)
    link = costmodel.Link(alpha=1.0, beta=0.01, gamma=0.001)
    # 2 ranks, 800 bytes: 2 segments of 200 bytes, the wire's 2.0 a segment beats (α + 2.0)/2 = 1.5
    assert costmodel.segmented_ring(2, 800, link) == pytest.approx(2 * (1.0 + 2 * 2.0) + 200 * 0.001)
    # 4 ranks, 80 bytes: segments of 10 bytes, (α + 0.1)/2 = 0.55 a step when α dominates
    assert costmodel.segmented_ring(4, 80, link) == pytest.approx(2 * (1.0 + 3 * 2 * 0.55) + 10 * 0.001)
    assert costmodel.segmented_ring(1, 80, link) == 0


def test_choice_follows_the_model():
    latency_bound = costmodel.Link(alpha=100e-6, beta=1e-9, gamma=0.25e-9)
    # one step while (n − 1)·N·β is small next to α, then two steps and the ring's bytes
    assert costmodel.choose(4, 4096, latency_bound) == "one_shot"
    assert costmodel.choose(4, 256 << 10, latency_bound) == "two_shot"
    # once a segment's transfer outlasts α, two segments in flight hide every α but one a phase
    assert costmodel.choose(4, 4 << 20, latency_bound) == "segmented_ring"
    assert costmodel.choose(4, 64 << 20, latency_bound) == "segmented_ring"
    # ... which the ring's wavefront, charged 2(n − 1)·α, does not
    assert costmodel.segmented_ring(4, 64 << 20, latency_bound) < costmodel.ring(4, 64 << 20, latency_bound)
    # at 2 ranks one-shot is doubling, and ties go to the direct one
    assert costmodel.choose(2, 4096, latency_bound) == "one_shot"
    assert costmodel.choose(2, 64 << 20, latency_bound) == "segmented_ring"
    # past DIRECT_MAX_RANKS the direct ones are not offered: the log-step and ring algorithms are
    many = costmodel.DIRECT_MAX_RANKS * 2
    assert costmodel.choose(many, 4096, latency_bound) == "doubling"
    assert costmodel.choose(many, 1 << 20, latency_bound) == "halving_doubling"
    assert costmodel.choose(many, 64 << 20, latency_bound) == "segmented_ring"
    for n in (2, 3, 4, 5):
        for nbytes in costmodel.SIZES:
            assert choose(nbytes // 4, 4, n) == costmodel.choose(n, nbytes, costmodel.link_for(n))
    assert choose(10, 4, 1) == "ring"
    for n in (2, 3, 4, 5):  # on NCCL a fixed rule, not this machine's gloo fit
        assert {choose(nbytes // 4, 4, n, "nccl") for nbytes in costmodel.SIZES} == {"ring"}


def test_fit_recovers_a_line():
    points = [(m, 50e-6 + 2e-9 * m) for m in costmodel.SIZES]
    alpha, beta = costmodel.fit_line(points)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and beta == pytest.approx(2e-9, rel=1e-6)


def test_committed_fit_is_read():
    links = costmodel.fitted_links()
    assert {2, 3, 4} <= set(links), "parallel/collectives/alphabeta_gloo.json lacks world sizes 2-4"
    assert all(link.alpha > 0 and link.beta > 0 for link in links.values())


def test_show_and_predict_use_the_fit_they_are_given_and_say_which(tmp_path, capsys):
    """A fit made with `fit --json PATH` is used by `--fit PATH`, not silently replaced by the
    one auto reads; stderr names the fit either way."""
    record = json.loads(costmodel.FIT_PATH.read_text())
    for fit in record["fits"].values():  # a slower machine: ten times the fixed costs
        fit["alpha_s"] *= 10
        if "alpha_direct_s" in fit:
            fit["alpha_direct_s"] *= 10
    mine = tmp_path / "fit.json"
    mine.write_text(json.dumps(record))
    projections = {}
    for given in (None, mine):
        out = tmp_path / f"predict_{'mine' if given else 'default'}.json"
        args = ["predict", "--hidden", "64", "--compute-ms", "10", "--optimizer-ms", "1", "--json", str(out)]
        assert costmodel.main(args + (["--fit", str(given)] if given else [])) == 0
        said = capsys.readouterr()
        shown = str(given) if given else "parallel/collectives/alphabeta_gloo.json"
        assert f"using the fit in {shown}" in said.err and f"gloo: the fit in {shown};" in said.out
        predicted = json.loads(out.read_text())
        assert predicted["fit"] == shown
        projections[shown] = {(r["ranks"], r["strategy"]): r["comm_s"] for r in predicted["projections"]
                              if r["fabric"] == "gloo"}
    default, slower = projections.values()
    assert all(slower[k] > default[k] for k in default)
    assert costmodel.main(["show", "--fit", str(mine)]) == 0
    said = capsys.readouterr()
    assert f"using the fit in {mine}" in said.err and "2 ranks: 4 KiB→" in said.out


# ---------------------------------------------------------------------------
# ZeRO stage 1
# ---------------------------------------------------------------------------

QUICK = {"epochs": 2, "batch_size": 60, "hidden": (16,), "train_limit": 600, "return_state": True, "timeout": 60}


def assert_close_runs(a: dict, b: dict) -> None:
    for x, y in zip(a["epochs"], b["epochs"], strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["accuracy"] == y["accuracy"]
    assert a["final_accuracy"] == b["final_accuracy"]
    for k in a["state"]:
        torch.testing.assert_close(a["state"][k], b["state"][k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("world_size", world_sizes(2, 3, quick=1))  # 3: 698 parameters: padded shards
def test_zero_trains_like_plain_data_parallelism(world_size):
    plain = launch(train, world_size, (Config(world_size=world_size, **QUICK),), deadline_s=240)
    zero = launch(train, world_size, (Config(world_size=world_size, zero=True, **QUICK),), deadline_s=240)
    for r in zero[1:]:  # every rank ends with the same weights
        for k in r["state"]:
            assert torch.equal(r["state"][k], zero[0]["state"][k]), k
    assert_close_runs(zero[0], plain[0])


def zero_state_bytes() -> tuple[int, int]:
    from parallel.collectives.zero import ZeroAdam

    torch.manual_seed(0)
    model = torch.nn.Linear(100, 10)  # 1010 parameters
    opt = ZeroAdam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 100)).sum().backward()
    opt.step()
    return opt.state_bytes(), opt.shard_numel


@pytest.mark.parametrize("world_size", world_sizes(2, 4))
def test_zero_optimizer_state_falls_as_one_over_world_size(world_size):
    for state_bytes, shard in launch(zero_state_bytes, world_size, deadline_s=60):
        assert shard == -(-1010 // world_size)
        assert state_bytes == 2 * 4 * shard + 4  # two float32 moments of the shard, and the step counter


def zero_twins(steps: int = 5) -> dict:
    """Inside a rank: the same model and batches, stepped by ZeroAdam in our loop (the loss
    scaled by the global batch, gradients reduce-scattered by the optimiser) and by torch's
    ZeroRedundancyOptimizer behind DDP (gradients averaged by DDP, parameters broadcast by their
    owners)."""
    from torch.nn.parallel import DistributedDataParallel

    from parallel.collectives.zero import ZeroAdam, torch_zero
    from parallel.common import data as data_mod
    from parallel.common.training import build_model

    rank, n = dist.get_rank(), dist.get_world_size()
    ds = data_mod.synthetic(0)
    batches = [torch.arange(i * 32, (i + 1) * 32) for i in range(steps)]  # equal shards: DDP's mean is global

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(ds.features, (24, 24), ds.classes, "py")

    ours = model()
    opt = ZeroAdam(ours.parameters(), lr=1e-2)
    for batch in batches:
        idx = data_mod.shard(batch, rank, n)
        (F.cross_entropy(ours(ds.train.x[idx]), ds.train.y[idx], reduction="sum") / len(batch)).backward()
        opt.step()
        opt.zero_grad()
    theirs = model()
    ddp, zro = DistributedDataParallel(theirs), torch_zero(theirs.parameters(), lr=1e-2)
    for batch in batches:
        idx = data_mod.shard(batch, rank, n)
        F.cross_entropy(ddp(ds.train.x[idx]), ds.train.y[idx]).backward()
        zro.step()
        zro.zero_grad()
    untrained = model()
    return {name: {k: v.detach().clone() for k, v in m.state_dict().items()}
            for name, m in (("ZeroAdam", ours), ("ZeroRedundancyOptimizer", theirs), ("untrained", untrained))}


def test_zero_adam_and_torchs_zero_redundancy_optimizer_train_alike():
    for rank in launch(zero_twins, 2, deadline_s=120):
        ours, theirs = rank["ZeroAdam"], rank["ZeroRedundancyOptimizer"]
        for k in ours:
            assert not torch.equal(ours[k], rank["untrained"][k]), k
            torch.testing.assert_close(ours[k], theirs[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_zero_and_plain_checkpoints_are_interchangeable(tmp_path):
    three = {**QUICK, "epochs": 3}
    straight = launch(train, 2, (Config(**three),), deadline_s=240)[0]
    for first, then in ((True, False), (False, True)):
        ckpt = str(tmp_path / f"from_{'zero' if first else 'plain'}.pt")
        launch(train, 2, (Config(checkpoint=ckpt, zero=first, **{**QUICK, "epochs": 1}),), deadline_s=240)
        state = torch.load(ckpt, weights_only=True)
        # torch.optim.Adam's own format: one entry per parameter, of the parameter's full shape
        assert [tuple(s["exp_avg"].shape) for s in state["optimizer"]["state"].values()] == \
            [tuple(v.shape) for v in state["model"].values()]
        resumed = launch(train, 2, (Config(checkpoint=ckpt, resume=True, zero=then, **three),), deadline_s=240)[0]
        assert_close_runs(resumed, straight)


def test_allreduce_table_judges_the_goal_with_intervals():
    from parallel.collectives.bench import allreduce_table, cpp_loop_table

    def row(nbytes: int, variant: str, ratio: float, ci: list[float] | None) -> dict:
        return {"bytes": nbytes, "variant": variant, "time_us": 100.0, "spread_us": 5.0, "busbw_gbs": 1.0,
                "busbw_ratio_to_dist": ratio, "ratio_spread": 0.1, "ratio_ci": ci,
                **({"algorithm": "doubling"} if variant == "auto" else {})}

    results = []
    for nbytes, ratio, ci in ((4096, 0.95, [0.92, 0.99]), (16384, 0.85, [0.70, 1.10]), (65536, 0.60, [0.50, 0.70])):
        results += [row(nbytes, "auto", ratio, ci), row(nbytes, "dist.all_reduce", 1.0, [1.0, 1.0]),
                    row(nbytes, "ring", 0.5, [0.4, 0.6])]
    record = {"results": results, "world_size": 2, "backend": "gloo", "threads_per_rank": 1, "device": "cpu",
              "torch": "x", "date": "d", "command": "c"}
    text = allreduce_table(record)
    assert "| 16 KiB | doubling |" in text and "0.85 (0.70–1.10)" in text and "95% CI" in text
    assert "| 0.85 (0.70–1.10) | 0.50 | — |" in text  # no segmented ring in this record
    results.append(row(16384, "segmented_ring", 0.97, [0.9, 1.0]))
    assert "| 0.85 (0.70–1.10) | 0.50 | 0.97 |" in allreduce_table(record)
    assert "met at 4 KiB; missed at 16 KiB, 64 KiB; significantly below 0.90 (interval under it) at 64 KiB." in text
    assert "alternative" not in text  # no alternative in the record: no such table
    results += [row(65536, "two_shot", 0.9, [0.85, 0.95]),
                {**row(65536, "two_shot, a wait per send", 0.8, [0.75, 0.85]),
                 "time_over_default": 1.12, "time_over_default_ci": [1.05, 1.2]}]
    assert "| 64 KiB | two_shot, a wait per send | 0.80 (0.75–0.85) | 0.90 (0.85–0.95) | 1.12 (1.05–1.20) |" in \
        allreduce_table(record)
    results[-1] = {**row(65536, "two_shot, a wait per send (before)", 0.8, [0.75, 0.85]),  # as a record may name it
                   "time_over_now": 1.12, "time_over_now_ci": [1.05, 1.2]}
    assert "| 64 KiB | two_shot, a wait per send | 0.80 (0.75–0.85) | 0.90 (0.85–0.95) | 1.12 (1.05–1.20) |" in \
        allreduce_table(record)
    assert "loop in C++" not in allreduce_table(record)
    results += [row(65536, "segmented_ring", 0.8, [0.7, 0.9]),
                {**row(65536, "segmented ring, loop in C++", 0.88, [0.8, 0.95]),
                 "time_over_python_loop": 0.91, "time_over_python_loop_ci": [0.85, 0.99]}]
    assert "| 64 KiB | 0.88 (0.80–0.95) | 0.80 (0.70–0.90) | 0.91 (0.85–0.99) |" in allreduce_table(record)
    alone = cpp_loop_table(record)  # the chapter's marker "cpploop": that table and the run's line only
    assert alone.startswith("| size | segmented ring, loop in C++") and "auto picks" not in alone
    assert "| 64 KiB | 0.88 (0.80–0.95) | 0.80 (0.70–0.90) | 0.91 (0.85–0.99) |" in alone and "`c`" in alone
    with pytest.raises(ValueError, match="no C\\+\\+ loop"):
        cpp_loop_table({**record, "results": [r for r in results if "C++" not in r["variant"]]})
    for r in results:  # a record from before intervals: IQRs, and no significance claimed
        r.pop("ratio_ci")
    old = allreduce_table(record)
    assert "(paired, IQR)" in old and "significantly" not in old


def test_goal_table_shows_the_first_table_and_the_threads_setting_only():
    from parallel.collectives.bench import allreduce_table, goal_table

    def row(nbytes: int, variant: str, ratio: float) -> dict:
        return {"bytes": nbytes, "variant": variant, "time_us": 100.0, "spread_us": 5.0, "busbw_gbs": 1.0,
                "busbw_ratio_to_dist": ratio, "ratio_spread": 0.1, "ratio_ci": [ratio - 0.05, ratio + 0.05],
                **({"algorithm": "one_shot"} if variant == "auto" else {})}

    results = [row(4096, "auto", 0.8), row(4096, "dist.all_reduce", 1.0), row(4096, "ring", 0.5),
               row(4 << 20, "auto", 1.0), row(4 << 20, "dist.all_reduce", 1.0), row(4 << 20, "ring", 0.9),
               row(4 << 20, "ring, 1 MiB pieces", 0.7), row(4 << 20, "ring, 16 MiB pieces", 0.8)]
    record = {"results": results, "world_size": 4, "backend": "gloo", "threads_per_rank": 1, "device": "cpu",
              "torch": "x", "date": "d", "command": "c"}
    full, goal = allreduce_table(record), goal_table(record)
    assert "ring, 1 MiB pieces" in full and "ring, 1 MiB pieces" not in goal
    assert goal.split("\n\n")[:2] == full.split("\n\n")[:2]  # the same first table and verdict
    assert "met at 4 MiB; missed at 4 KiB" in goal and goal.endswith("`c`") and "I/O threads" not in goal
    assert "gloo's I/O threads left alone (the default). 4 ranks" in goal_table({**record, "gloo_io_nice": None})
    assert "$DENSE_GLOO_IO_NICE=batch. 4 ranks" in goal_table({**record, "gloo_io_nice": "batch"})



def test_allreduce_table_compares_segment_sizes_per_loop():
    from parallel.collectives.bench import CPP_LOOP, allreduce_table, segment_variant

    def row(variant: str, ratio: float, algorithm: str | None = None) -> dict:
        return {"bytes": 16 << 20, "variant": variant, "time_us": 100.0, "spread_us": 5.0, "busbw_gbs": 1.0,
                "busbw_ratio_to_dist": ratio, "ratio_spread": 0.1, "ratio_ci": [ratio - 0.05, ratio + 0.05],
                **({"algorithm": algorithm} if algorithm else {})}

    base = [row("auto", 0.93, "segmented_ring"), row("dist.all_reduce", 1.0), row("ring", 0.5),
            row("segmented_ring", 0.88)]
    header = {"world_size": 4, "backend": "gloo", "threads_per_rank": 1, "device": "cpu", "torch": "x",
              "date": "d", "command": "c"}
    # before "segment_bytes" was recorded the default was 2 MiB, and 1 and 8 MiB ran beside it
    old = allreduce_table({**header, "results": base + [row(segment_variant(1 << 20), 0.90),
                                                         row(segment_variant(8 << 20), 0.84)]})
    assert "(95% CI), 1 MiB segments | 2 MiB segments (default) | 8 MiB segments |" in old
    assert "| 16 MiB | Python | 0.90 (0.85–0.95) | 0.88 (0.83–0.93) | 0.84 (0.79–0.89) |" in old
    assert "| C++ |" not in old and "(C++)" not in old
    new = allreduce_table({**header, "segment_bytes": 1 << 20, "auto_cpp_loop": True,
                           "results": base + [{**row(CPP_LOOP, 0.95), "time_over_python_loop": 0.9,
                                               "time_over_python_loop_ci": [0.85, 0.95]},
                                              row(segment_variant(2 << 20), 0.86),
                                              row(segment_variant(8 << 20), 0.80),
                                              row(segment_variant(2 << 20, cpp=True), 0.89)]})
    assert "(95% CI), 1 MiB segments (default) | 2 MiB segments | 8 MiB segments |" in new
    assert "| 16 MiB | Python | 0.88 (0.83–0.93) | 0.86 (0.81–0.91) | 0.80 (0.75–0.85) |" in new
    assert "| 16 MiB | C++ | 0.95 (0.90–1.00) | 0.89 (0.84–0.94) | — |" in new
    assert "| 16 MiB | segmented-ring (C++) |" in new

def _burst_record(variants: tuple[str, ...], why: str | None = None) -> dict:
    from parallel.collectives.bench import BURSTS

    results = [{"bytes": nbytes, "calls_in_a_row": k, "variant": v, "time_us": 1000.0 * k + i, "spread_us": 1.0,
                "busbw_ratio_to_dist": 0.9 + i / 100, "ratio_ci": [0.8, 1.0],
                **({"predicted_us": 777.0 + i} if v in ("ring", "two_shot", "segmented_ring") else {})}
               for nbytes in (4 << 20, 16 << 20) for k in BURSTS for i, v in enumerate(variants)]
    return {"results": results, "world_size": 4, "backend": "gloo", "threads_per_rank": 1, "device": "cpu",
            "torch": "x", "date": "d", "command": "c", **({"without_cpp_loop": why} if why else {})}


def test_burst_table_shows_every_size_and_burst_with_the_models_time():
    """A record from before the segmented ring was timed (ring and two-shot only) renders as it did."""
    from parallel.collectives.bench import BURSTS, burst_table

    text = burst_table(_burst_record(("ring", "two_shot", "dist.all_reduce")))
    assert text.splitlines()[0] == ("| size | calls in a row | ring µs per call | two-shot µs per call "
                                    "| all_reduce µs per call | ring / all_reduce busbw (paired, 95% CI) "
                                    "| two-shot / all_reduce |")
    assert "| 16 MiB | 8 | 8000 | 8001 | 8002 | 0.90 (0.80–1.00) | 0.91 (0.80–1.00) |" in text
    assert "4 MiB: ring 777, two-shot 778; 16 MiB: ring 777, two-shot 778 µs" in text
    assert len([line for line in text.splitlines() if line.startswith("| 4 MiB |")]) == len(BURSTS)


def test_burst_table_shows_the_segmented_ring_and_its_cpp_loop_or_why_not():
    from parallel.collectives.bench import BURST_VARIANTS, CPP_LOOP, burst_table

    text = burst_table(_burst_record(BURST_VARIANTS))
    header = text.splitlines()[0]
    assert "| segmented ring µs per call | C++ loop µs per call | all_reduce µs per call |" in header
    assert header.endswith("| segmented ring / all_reduce | C++ loop / all_reduce |")
    assert "| 4 MiB | 2 | 2000 | 2001 | 2002 | 2003 | 2004 | 0.90 (0.80–1.00) | 0.91 (0.80–1.00) " \
           "| 0.92 (0.80–1.00) | 0.93 (0.80–1.00) |" in text
    assert "4 MiB: ring 777, two-shot 778, segmented ring 779;" in text  # the C++ loop is not a model's algorithm
    assert "median / mean" not in text  # a record without the tails shows no tails table
    record = _burst_record(BURST_VARIANTS)
    for r in record["results"]:
        r.update(mean_us=r["time_us"] + 500, p90_us=r["time_us"] + 3000)
    tails = burst_table(record).split("One call at a time (1 in a row)")[1]
    assert "| 4 MiB | 1000 / 1500 / 4000 | 1001 / 1501 / 4001 | 1002 / 1502 / 4002 | 1003 / 1503 / 4003 " \
           "| 1004 / 1504 / 4004 |" in tails
    without = burst_table(_burst_record(tuple(v for v in BURST_VARIANTS if v != CPP_LOOP), why="no compiler (test)"))
    assert "C++ loop" not in without.splitlines()[0] and "Without the C++ loop: no compiler (test)." in without


def test_predict_validation_shows_the_models_communication_and_the_all_reduce_inside_the_step(tmp_path, capsys):
    """A zero record's dp row carries each rank's time inside the gradient all-reduce; predict
    shows it beside the model's communication. A record without it shows a dash."""
    results = [{"variant": "compute only", "step_us": 10000.0}, {"variant": "adam step alone", "step_us": 2000.0},
               {"variant": "dp", "step_us": 20000.0, "allreduce_in_step_us_by_rank": [6000.0, 4500.0],
                "allreduce_in_step_waiting_us_by_rank": [1500.0, 0.0]},
               {"variant": "zero", "step_us": 18000.0}]
    record = {"benchmark": "zero", "world_size": 2, "parameters": costmodel.mlp_parameters([64]), "hidden": [64],
              "batch_per_rank": 8,
              "results": results}
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(record))
    results[2] = {k: v for k, v in results[2].items() if k == "variant" or k == "step_us"}
    old.write_text(json.dumps(record))
    out = tmp_path / "p.json"
    assert costmodel.main(["predict", "--hidden", "64", "--validate", str(new), str(old), "--json", str(out)]) == 0
    validation = json.loads(out.read_text())["validation"]
    dp = [v for v in validation if v["strategy"] == "dp"]
    expected_comm = costmodel.project("gloo", 2, record["parameters"], 0.01, 0.002, [64], 8)["dp"]["comm_s"]
    assert [v["model_comm_s"] for v in dp] == [pytest.approx(expected_comm)] * 2
    assert dp[0]["allreduce_in_step_s"] == [pytest.approx(6e-3), pytest.approx(4.5e-3)]
    assert dp[0]["allreduce_waiting_s"] == [pytest.approx(1.5e-3), 0.0]
    assert "allreduce_in_step_s" not in dp[1] and "allreduce_waiting_s" not in dp[1]
    table = capsys.readouterr().out
    assert f"| {expected_comm * 1e3:.2f} | 4.50–6.00 | 0.00–1.50 |" in table
    assert f"| {expected_comm * 1e3:.2f} | — | — |" in table
