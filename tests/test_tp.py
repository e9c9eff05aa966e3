"""Tensor parallelism (chapter 8): the ring all-gather and reduce-scatter, the autograd pieces,
the sharded layers against the unsharded MLP, training with --tp, checkpoints across tp sizes.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from conftest import world_sizes
from parallel.common.launch import launch
from parallel.common.p2p import RingError
from parallel.dp.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


# ---------------------------------------------------------------------------
# The collectives
# ---------------------------------------------------------------------------

ROWS = [0, 1, 3, 7, 64]


def _data(rank: int, rows: int, dtype: torch.dtype, trailing: tuple = (3,)) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + rows)
    return (torch.randn(rows, *trailing, generator=g) * 1000).to(dtype)


def collective_cases() -> list:
    """Every case's (name, ours, reference, exact?) on this rank; small segments, so the
    wavefront runs with many pieces per chunk."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    with warnings.catch_warnings():  # torch 2.13 calls both torch functions deprecated, and runs them
        warnings.simplefilter("ignore", FutureWarning)
        for dtype in (torch.float32, torch.float64):
            for rows in ROWS:
                for op in ("sum", "avg"):
                    t = _data(rank, rows, dtype)
                    before = t.clone()
                    mine = ring_reduce_scatter(t, op, segment_bytes=64)
                    assert torch.equal(t, before), "reduce-scatter changed its input"
                    if rows % n == 0:  # gloo's own reduce_scatter_tensor takes equal parts only
                        ref = torch.empty(rows // n, 3, dtype=dtype)
                        dist.reduce_scatter_tensor(ref, t.clone())
                    else:  # uneven: the reference is the chunk of a sum of every rank's input
                        ref = sum(_data(r, rows, dtype) for r in range(n))
                        ref = torch.tensor_split(ref, n)[rank]
                    if op == "avg":
                        ref = ref / n
                    out.append((f"reduce_scatter {op} rows={rows} {dtype}", mine, ref, False))
                    # the all-reduce is built from the same steps: for a 1-d tensor (the same
                    # chunks) its chunk is the reduce-scatter's result, bit for bit
                    whole = ring_all_reduce(t.reshape(-1).clone(), op, segment_bytes=64)
                    out.append((f"all_reduce chunk {op} rows={rows} {dtype}",
                                ring_reduce_scatter(t.reshape(-1), op, segment_bytes=64),
                                torch.tensor_split(whole, n)[rank], True))
                # all-gather of uneven parts: rank r passes rows + r rows
                part = _data(rank, rows + rank, dtype)
                got = ring_all_gather(part, segment_bytes=64)
                out.append((f"all_gather uneven rows={rows} {dtype}", got,
                            torch.cat([_data(r, rows + r, dtype) for r in range(n)]), True))
                even = _data(rank, rows, dtype)
                ref = torch.empty(rows * n, 3, dtype=dtype)
                dist.all_gather_into_tensor(ref, even)
                out.append((f"all_gather even rows={rows} {dtype}", ring_all_gather(even, segment_bytes=64),
                            ref, True))
        # 1-d tensors split by elements, including fewer elements than ranks; a 0-d tensor
        for numel in (1, 7):
            t = _data(rank, numel, torch.float64, ())
            ref = torch.tensor_split(sum(_data(r, numel, torch.float64, ()) for r in range(n)), n)[rank]
            out.append((f"reduce_scatter 1-d numel={numel}", ring_reduce_scatter(t), ref, False))
        scalar = torch.tensor(float(rank) + 0.5)
        out.append(("all_gather 0-d", ring_all_gather(scalar), torch.arange(n, dtype=torch.float32) + 0.5, True))
        # a non-contiguous input
        base = _data(rank, 6, torch.float32, (4,)).t()
        ref = torch.cat([_data(r, 6, torch.float32, (4,)).t() for r in range(n)])
        out.append(("all_gather non-contiguous", ring_all_gather(base), ref, True))
    return out


@pytest.mark.parametrize("world_size", world_sizes(1, 2, 3, 4, quick=3))
def test_ring_all_gather_and_reduce_scatter_match_torch_and_agree_across_ranks(world_size):
    results = launch(collective_cases, world_size, deadline_s=180)
    for case, (name, mine, _ref, exact) in enumerate(results[0]):
        for rank, cases in enumerate(results):
            got, expected = cases[case][1], cases[case][2]
            assert got.shape == expected.shape and got.dtype == expected.dtype, (name, rank)
            if exact:
                assert torch.equal(got, expected), (name, rank)
            else:  # our ring adds in another order than gloo: equal up to rounding
                tol = 1e-12 if got.dtype == torch.float64 else 1e-5
                torch.testing.assert_close(got, expected, rtol=tol, atol=tol * 1e4, msg=f"{name} rank {rank}")
        if name.startswith("all_gather"):  # bit-identical on every rank
            for cases in results[1:]:
                assert cases[case][1].numpy().tobytes() == mine.numpy().tobytes(), name


def disagreeing_call(kind: str) -> str:
    rank = dist.get_rank()
    try:
        if kind == "gather-trailing":
            ring_all_gather(torch.zeros(2, 3 + rank))
        elif kind == "gather-dtype":
            ring_all_gather(torch.zeros(2, dtype=[torch.float32, torch.float64][rank % 2]))
        elif kind == "scatter-shape":
            ring_reduce_scatter(torch.zeros(4 + rank, 2))
        elif kind == "scatter-op":
            ring_reduce_scatter(torch.zeros(4), ["sum", "avg"][rank % 2])
        else:  # different collectives
            ring_all_gather(torch.zeros(4)) if rank == 0 else ring_reduce_scatter(torch.zeros(4))
    except RingError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("kind, expected", [
    ("gather-trailing", ["ring_all_gather: ranks passed different shapes", "rank 0: numel 6, shape (2, 3)",
                         "rank 1: numel 8, shape (2, 4)"]),
    ("gather-dtype", ["ring_all_gather: ranks passed different shapes", "float32", "float64"]),
    ("scatter-shape", ["ring_reduce_scatter: ranks passed different tensors or ops", "shape (4, 2)",
                       "shape (5, 2)"]),
    ("scatter-op", ["op sum", "op avg"]),
    ("kinds", ["ranks passed different", "numel 4, shape (4), float32"]),
])
@pytest.mark.slow
def test_ranks_that_disagree_all_get_the_same_clear_error(kind, expected):
    messages = launch(disagreeing_call, 2, (kind,), deadline_s=60)
    assert messages[0] != "no error"
    for m in messages:
        for text in expected:
            assert text in m, (text, m)
    if kind == "kinds":  # each rank names the collective the other one called
        assert "rank 1: reduce_scatter, numel 4" in messages[0] and "rank 0: all_gather, numel 4" in messages[1]
    else:
        assert messages[0] == messages[1]


def test_collective_argument_errors_need_no_process_group():
    with pytest.raises(TypeError, match="ring_all_gather needs a torch.Tensor"):
        ring_all_gather([1.0])
    with pytest.raises(ValueError, match="op must be one of"):
        ring_reduce_scatter(torch.zeros(2), "max")
    with pytest.raises(TypeError, match="op 'avg' needs a floating-point tensor"):
        ring_reduce_scatter(torch.zeros(2, dtype=torch.int64), "avg")


def subgroup_case() -> list:
    """Two groups of two in a world of four: each group gathers and reduces only its own."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    x = torch.full((2,), float(rank))
    return [ring_all_gather(x, mine), ring_reduce_scatter(torch.arange(4.0) + rank, group=mine)]


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_collectives_on_a_subgroup():
    results = launch(subgroup_case, 4, deadline_s=120)
    assert torch.equal(results[0][0], torch.tensor([0.0, 0, 1, 1])) and torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[3][0], torch.tensor([2.0, 2, 3, 3]))
    # group {2, 3}: (0..3 + 2) + (0..3 + 3) = 2·(0..3) + 5, split in two
    assert torch.equal(results[2][1], torch.tensor([5.0, 7])) and torch.equal(results[3][1], torch.tensor([9.0, 11]))
    # group {0, 1}: 2·(0..3) + 1
    assert torch.equal(results[0][1], torch.tensor([1.0, 3])) and torch.equal(results[1][1], torch.tensor([5.0, 7]))


# ---------------------------------------------------------------------------
# The layers: forward and every gradient equal to the unsharded MLP with the same weights
# ---------------------------------------------------------------------------

FEATURES, HIDDEN, OUT, BATCH = 5, 7, 6, 9  # 7 and 9 split unevenly over 2, 3 and 4 ranks
LAYOUTS = ["megatron", "sequence", "sequence-overlap"]


def pair_case(modes_to_run: list[str]) -> list:
    """(name, ours, reference) for the Megatron pair column -> row, in every layout, mode and dtype."""
    from modes import Dense
    from parallel.tp import ColumnParallelDense, RowParallelDense
    from parallel.tp.training import _gather_dim, full_state_dict

    rank, n = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    out = []
    for mode in modes_to_run:
        for precision in ("float64", "float32", "autocast bfloat16"):
            def autocast(precision=precision):
                return torch.autocast("cpu", torch.bfloat16, enabled=precision.startswith("autocast"))
            dtype = torch.float64 if precision == "float64" else torch.float32  # autocast: float32 parameters
            torch.manual_seed(3)
            ref = torch.nn.Sequential(Dense(FEATURES, HIDDEN, mode=mode, dtype=dtype),
                                      Dense(HIDDEN, OUT, mode=mode, dtype=dtype))
            g = torch.Generator().manual_seed(5)
            x = torch.randn(BATCH, FEATURES, generator=g, dtype=dtype)
            grad = torch.randn(BATCH, OUT, generator=g, dtype=dtype)
            xr = x.clone().requires_grad_()
            with autocast():
                y_ref = ref(xr)
            y_ref.backward(grad.to(y_ref.dtype))
            for layout in LAYOUTS:
                sp, overlap = layout != "megatron", layout.endswith("overlap")
                torch.manual_seed(3)  # the same draws as the unsharded layers
                col = ColumnParallelDense(FEATURES, HIDDEN, mode=mode, dtype=dtype, sequence_parallel=sp,
                                          overlap=overlap)
                row = RowParallelDense(HIDDEN, OUT, mode=mode, dtype=dtype, sequence_parallel=sp, overlap=overlap)
                model = torch.nn.Sequential(col, row)
                tag = f"{mode} {precision} {layout}"
                out.append((f"{tag} initial state", full_state_dict(model, None), ref.state_dict()))
                mine = slice(None) if not sp else _rows(BATCH, n, rank)
                xs = x[mine].clone().requires_grad_()
                with autocast():
                    y = model(xs)
                y.backward(grad[mine].to(y.dtype))
                out.append((f"{tag} output", y.detach(), y_ref.detach()[mine]))
                out.append((f"{tag} grad x", xs.grad, xr.grad[mine]))
                for key, p in model.named_parameters():
                    dim = model[int(key[0])].tp_dims[key[2:]]
                    full = p.grad if dim is None or n == 1 else _gather_dim(p.grad, dim, None)
                    out.append((f"{tag} grad {key}", full, dict(ref.named_parameters())[key].grad))
    return out


def _rows(batch: int, n: int, rank: int) -> slice:
    sizes = [batch // n + (1 if r < batch % n else 0) for r in range(n)]
    return slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))


def _pair_modes() -> list[str]:
    from conftest import REASONS

    return [m for m in ("py", "cpp") if REASONS[m] is None]


@pytest.mark.parametrize("tp", world_sizes(1, 2, 3, 4))
def test_megatron_pair_equals_the_unsharded_mlp(tp):
    """Forward and every gradient, for widths and batches that do not divide evenly:
    float64 to 1e-12, float32 allclose, under bfloat16 autocast within a few bfloat16 roundings
    and in the same dtypes; the gathered initial weights are the same bits."""
    results = launch(pair_case, tp, (_pair_modes(),), deadline_s=300) if tp > 1 else [pair_case(_pair_modes())]
    assert len(results[0]) >= 2 * 3 * 8
    for ranks_cases in results:
        for name, ours, ref in ranks_cases:
            if name.endswith("initial state"):
                assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref), name
                continue
            assert ours.shape == ref.shape, name
            assert ours.dtype == ref.dtype, name  # autocast: a bfloat16 output, float32 gradients
            if "float64" in name:
                torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12, msg=name)
            elif "autocast" in name:
                # the row layer's partial sums are rounded to bfloat16 on each rank before the
                # all-reduce, as Megatron's are: a few units of bfloat16's rounding (2^-8) apart
                torch.testing.assert_close(ours.float(), ref.float(), rtol=4 * 2**-8, atol=4 * 2**-8, msg=name)
            else:
                torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------
# Training with --tp: the same curve as --tp 1; checkpoints hold the unsharded model
# ---------------------------------------------------------------------------

QUICK_TP = {"epochs": 2, "batch_size": 60, "hidden": (16, 12, 8), "train_limit": 600, "return_state": True,
            "timeout": 60}


def _same_run(a: dict, b: dict) -> None:
    for ea, eb in zip(a["epochs"], b["epochs"], strict=True):
        assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5), (ea, eb)
        assert ea["accuracy"] == eb["accuracy"], (ea, eb)
    assert a["final_accuracy"] == b["final_accuracy"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        torch.testing.assert_close(a["state"][k], b["state"][k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("mode, world_size, tp", [("py", 2, 2), ("cpp", 4, 2), ("py", 3, 3)])
def test_tensor_parallel_training_gives_the_data_parallel_curve(mode, world_size, tp):
    """hidden (16, 12, 8): a column/row pair and an unpaired column layer (output gathered);
    8 and 12 split unevenly over 3 ranks. The unsharded reference is one process."""
    from distributed import train
    from parallel.common.training import Config

    single = train(Config(mode=mode, world_size=1, **QUICK_TP))
    ranks = launch(train, world_size, (Config(mode=mode, world_size=world_size, tp=tp, **QUICK_TP),),
                   deadline_s=300)
    for r in ranks:  # every rank reports the same run and holds the same unsharded weights
        _same_run(r, single)
    for r in ranks[1:]:
        assert all(torch.equal(r["state"][k], ranks[0]["state"][k]) for k in r["state"])


@pytest.mark.slow
def test_checkpoint_of_a_tp_run_resumes_with_another_tp_and_loads_into_the_plain_mlp(tmp_path):
    from distributed import train
    from parallel.common import data as data_mod
    from parallel.common.training import Config, build_model

    ckpt = str(tmp_path / "ckpt.pt")
    straight = train(Config(world_size=1, **{**QUICK_TP, "epochs": 3}))
    launch(train, 2, (Config(world_size=2, tp=2, checkpoint=ckpt, **{**QUICK_TP, "epochs": 1}),), deadline_s=300)
    state = torch.load(ckpt, weights_only=True)
    plain = build_model(data_mod.synthetic(0).features, QUICK_TP["hidden"], 10, "py")
    plain.load_state_dict(state["model"])  # the unsharded shapes and keys
    assert state["optimizer"]["state"][0]["exp_avg"].shape == plain[0].weight.shape
    # epoch 2 with tp 3 on 3 ranks, epoch 3 in one process
    launch(train, 3, (Config(world_size=3, tp=3, checkpoint=ckpt, resume=True, **{**QUICK_TP, "epochs": 2}),),
           deadline_s=300)
    resumed = train(Config(world_size=1, checkpoint=ckpt, resume=True, **{**QUICK_TP, "epochs": 3}))
    _same_run(resumed, straight)


@pytest.mark.slow
def test_bad_tp_combinations_are_one_clear_error_before_any_rank_starts():
    from conftest import run_script

    result = run_script("distributed.py", "--tp", "3", "--world-size", "2", timeout=60)
    # A user's mistake: exit status 2 and one line (cli.UserError), as every script does.
    assert result.returncode == 2 and "--tp 3 must divide the world size 2" in result.stderr
    result = run_script("distributed.py", "--tp", "4", "--world-size", "4", "--hidden", "16,3", timeout=60)
    assert result.returncode == 2
    assert "hidden layer 2's width 3 cannot be split between 4 tensor-parallel ranks" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # the one error, nothing from a started rank


def test_zero_with_tp_is_refused_before_any_rank_starts():
    from conftest import run_script

    result = run_script("distributed.py", "--tp", "2", "--zero", timeout=60)
    assert result.returncode == 2 and "--zero with --tp > 1 is not supported" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def layout_groups() -> tuple:
    """Inside a rank: its place in a dp × tp layout of tp = 2, and the global ranks of its groups."""
    from parallel.tp.training import make_layout

    layout = make_layout(2)
    return (layout.tp_rank, layout.dp_rank, dist.get_process_group_ranks(layout.tp_group),
            dist.get_process_group_ranks(layout.dp_group), layout.mesh.mesh.tolist())


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_the_layout_puts_tensor_parallel_ranks_side_by_side_and_data_parallel_ranks_across():
    """4 ranks, tp 2: {0, 1} and {2, 3} split the layers, {0, 2} and {1, 3} the batch (DeviceMesh
    on gloo, on the CPU)."""
    grid = [[0, 1], [2, 3]]
    assert launch(layout_groups, 4, deadline_s=120) == [(0, 0, [0, 1], [0, 2], grid), (1, 0, [0, 1], [1, 3], grid),
                                                        (0, 1, [2, 3], [0, 2], grid), (1, 1, [2, 3], [1, 3], grid)]


def test_layer_errors_name_width_and_tp():
    from parallel.tp.layers import TPError, shard_sizes
    from parallel.tp.training import make_layout

    assert shard_sizes(7, 3) == [3, 2, 2]
    with pytest.raises(TPError, match="out_features 3 cannot be split between 4"):
        shard_sizes(3, 4, "out_features")
    with pytest.raises(TPError, match="--tp 2 must divide the world size 1"):
        make_layout(2)


@pytest.mark.slow
def test_bench_tp_writes_every_variant_with_its_split_and_timeline(tmp_path):
    from conftest import run_script

    out = tmp_path / "tp.json"
    result = run_script("distributed.py", "--bench", "tp", "--world-size", "2", "--hidden", "16,8",
                        "--batch-size", "8", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = __import__("json").loads(out.read_text())
    assert [r["variant"] for r in record["results"]] == ["unoverlapped", "overlapped", "dtensor"]
    for r in record["results"]:
        assert r["step_us"] > 0 and r["comm_us"] > 0 and r["compute_us"] > 0, r
    assert {e[0] for e in record["timeline"]["overlapped"]} == {0, 1}
    assert set(record["goals"]) == {"comm_share_at_least_0.30", "overlapped_at_most_0.85_of_unoverlapped",
                                    "overlapped_no_slower_than_dtensor"}
    bad = run_script("distributed.py", "--bench", "tp", "--world-size", "2", "--hidden", "16,7", timeout=60)
    assert bad.returncode == 2 and "divisible by the world size 2" in bad.stderr


# ---------------------------------------------------------------------------
# The autograd pieces: forward as specified, backward its adjoint
# ---------------------------------------------------------------------------

def pieces_case() -> list:
    """(name, got, expected) for every piece's forward and backward; inputs differ per rank."""
    from parallel.tp import layers as tp_mod

    rank, n = dist.get_rank(), dist.get_world_size()

    def inputs(r: int, rows: int = 5, cols: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + r)
        return (torch.randn(rows, cols, generator=g, dtype=torch.float64),
                torch.randn(rows, cols, generator=g, dtype=torch.float64))

    def run(piece, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.clone().requires_grad_()
        y = piece.apply(x, None)
        y.backward(g)
        return y.detach(), x.grad

    out = []
    x, _ = inputs(rank)
    xs = [inputs(r)[0] for r in range(n)]
    total = sum(xs)
    cols = [slice(0, 3), slice(3, 5), slice(5, 7)] if n == 3 else [slice(0, 4), slice(4, 7)]
    rows = [slice(0, 2), slice(2, 4), slice(4, 5)] if n == 3 else [slice(0, 3), slice(3, 5)]
    # CopyToTP: identity forward, sum of the ranks' gradients backward
    y, gx = run(tp_mod.CopyToTP, x, x)
    out += [("CopyToTP forward", y, x), ("CopyToTP backward", gx, total)]
    # ReduceFromTP: sum forward, identity backward
    y, gx = run(tp_mod.ReduceFromTP, x, x)
    out += [("ReduceFromTP forward", y, total), ("ReduceFromTP backward", gx, x)]
    # ScatterFeatures: own columns forward; backward all-gathers the columns (every rank's g)
    part = x[:, cols[rank]]
    y, gx = run(tp_mod.ScatterFeatures, x, part)
    out += [("ScatterFeatures forward", y, part),
            ("ScatterFeatures backward", gx, torch.cat([xs[r][:, cols[r]] for r in range(n)], 1))]
    # GatherFeatures: the inverse; backward keeps this rank's columns
    y, gx = run(tp_mod.GatherFeatures, part, x)
    out += [("GatherFeatures forward", y, torch.cat([xs[r][:, cols[r]] for r in range(n)], 1)),
            ("GatherFeatures backward", gx, x[:, cols[rank]])]
    # GatherBatch: rows of the batch forward; backward reduce-scatters the rows
    mine = x[rows[rank]]
    y, gx = run(tp_mod.GatherBatch, mine, x)
    out += [("GatherBatch forward", y, torch.cat([xs[r][rows[r]] for r in range(n)])),
            ("GatherBatch backward", gx, total[rows[rank]])]
    # ReduceScatterBatch: this rank's rows of the sum forward; backward all-gathers
    y, gx = run(tp_mod.ReduceScatterBatch, x, mine)
    out += [("ReduceScatterBatch forward", y, total[rows[rank]]),
            ("ReduceScatterBatch backward", gx, torch.cat([xs[r][rows[r]] for r in range(n)]))]
    return out


@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_autograd_pieces_forward_and_backward(world_size):
    for cases in launch(pieces_case, world_size, deadline_s=120):
        assert len(cases) == 12
        for name, got, expected in cases:
            assert got.shape == expected.shape, name
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=name)
