"""The ring, the launcher, the trainer and distributed.py: several processes on gloo, bounded in time.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mnist_files import make_mnist, write_idx

from conftest import ROOT, all_reduce_case, run_script, world_sizes
from distributed import train
from parallel.common import data as data_mod
from parallel.common.checkpoint import CheckpointError
from parallel.common.launch import LaunchError, launch
from parallel.common.p2p import RingError
from parallel.common.training import Config, build_model
from parallel.dp.ring import ring_all_reduce, ring_broadcast_from_rank0

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

QUICK = {"epochs": 2, "batch_size": 60, "hidden": (16,), "train_limit": 600, "return_state": True, "timeout": 60}


# ---------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------

NUMELS = [0, 1, 3, 7, 1000, 12345]


def ring_cases() -> list:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for numel in NUMELS:
        for dtype in (torch.float32, torch.float64, torch.int64):
            for op in ("sum", "avg") if dtype != torch.int64 else ("sum",):
                t, expected = all_reduce_case(numel, dtype, op, 1000)
                # small segments, so the pipelined path runs with many segments per chunk
                ring_all_reduce(t, op, segment_bytes=64)
                out.append((numel, str(dtype), op, t, expected))
    # a non-contiguous tensor: handled through a contiguous copy, written back in place
    base = torch.arange(12.0).reshape(3, 4) * (rank + 1)
    view = base.t()
    ring_all_reduce(view)
    out.append(("t()", "float32", "sum", base, torch.arange(12.0).reshape(3, 4) * sum(range(1, n + 1))))
    return out


@pytest.mark.parametrize("world_size", world_sizes(1, 2, 3, 4, quick=2))
def test_ring_matches_dist_all_reduce_and_is_identical_on_every_rank(world_size):
    results = launch(ring_cases, world_size, deadline_s=180)
    for case in range(len(results[0])):
        numel, dtype, op, got, expected = results[0][case]
        if dtype.endswith("int64"):
            assert torch.equal(got, expected), (numel, dtype, op)
        else:  # the ring adds in another order than gloo: equal up to rounding
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3, msg=f"{numel} {dtype} {op}")
        for other in results[1:]:  # bit-identical across ranks
            assert other[case][3].numpy().tobytes() == got.numpy().tobytes(), (numel, dtype, op)


def scratch_reuse() -> dict:
    """Two rounds of the ring collectives on one thread: the second must reuse the first's
    scratch buffer (a buffer grown in the first round is replaced, not the point), and nothing
    a call returned may live in it."""
    from parallel.collectives.algorithms import all_reduce
    from parallel.common import p2p
    from parallel.dp import ring
    rank, n = dist.get_rank(), dist.get_world_size()
    key = (torch.float32, torch.device("cpu"), "")  # the buffer the algorithms share
    total = n * (n + 1) / 2
    sums, parts = [], []
    for round_ in range(2):
        t = torch.full((n * 5000,), float(rank + 1))
        ring_all_reduce(t, segment_bytes=4096)
        part = ring.ring_reduce_scatter(torch.full((n * 3000,), float(rank + 1)), segment_bytes=4096)
        parts.append((part, part.clone()))
        all_reduce(torch.full((n * 5000,), 7.0), algorithm="two_shot")  # collectives share the buffer
        sums.append(bool((t == total).all() and (part == total).all()))
        if round_ == 0:
            held = p2p._local.buffers[key]
    return {"reused": p2p._local.buffers[key] is held, "sums": all(sums),
            "results_untouched": all(torch.equal(p, kept) for p, kept in parts)}


def alternative_variants() -> dict:
    """The allreduce benchmark's alternatives (each with one of the algorithms' choices undone):
    right sums, the switch each turns off really off during its call, and everything back after it."""
    from parallel.collectives import algorithms as collectives
    from parallel.collectives import bench
    from parallel.common import p2p
    from parallel.dp import ring
    rank, n = dist.get_rank(), dist.get_world_size()
    key = (torch.float32, torch.device("cpu"), "")  # the buffer the algorithms share
    t = torch.full((n * 5000,), float(rank + 1))
    ring_all_reduce(t)
    held, made = p2p._local.buffers[key], []
    posted, post = [], collectives.post  # the segmented ring goes through post only as an alternative

    def counted_posts(*args, **kwargs) -> list:
        posted.append(1)
        return post(*args, **kwargs)
    collectives.post = counted_posts

    class Counted(ring._LateSends):
        def __init__(self) -> None:
            made.append(1)
            super().__init__()
    ring._LateSends = Counted
    fresh, buffer = [], ring.scratch

    def watched(numel: int, like: torch.Tensor, owner: str = "") -> torch.Tensor:
        fresh.append(p2p._local.__dict__.get("buffers", {}).get(key) is not held)
        return buffer(numel, like, owner)
    ring.scratch = watched
    cut, messages = [], p2p._messages

    def counted(x: torch.Tensor, limit: int) -> tuple:
        parts = messages(x, limit)
        cut.append(len(parts) > 1)
        return parts
    p2p._messages = counted
    p2p.MESSAGE_BYTES = 4096  # small enough to cut this test's pieces
    out = {}
    for name, fn in [*bench._alternatives(t).items(),
                     ("segmented_ring (default)", lambda: collectives.all_reduce(t, algorithm="segmented_ring"))]:
        t.fill_(rank + 1)
        made.clear()
        fresh.clear()
        cut.clear()
        posted.clear()
        fn()
        out[name] = (bool((t == n * (n + 1) / 2).all()), len(made), any(fresh), any(cut), bool(posted),
                     ring.LATE_SENDS, p2p._local.buffers[key] is held, p2p.MESSAGE_BYTES,
                     collectives.SEGMENTED_DIRECT)
    return out


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_the_benchmarks_alternatives_switch_only_during_their_call():
    got = launch(alternative_variants, 2, deadline_s=60)[0]
    # (right sums, late-send schedules made, a fresh buffer seen, messages cut, posted through
    # collectives.post, late sends back on, buffer back, message size back, direct posts back on)
    on = (True, True, 4096, True)
    assert got == {"ring, a fresh buffer per call": (True, 1, True, True, False, *on),
                   "ring, a fresh buffer and a wait per send": (True, 0, True, True, False, *on),
                   "two_shot, a wait per send": (True, 0, False, True, True, *on),
                   "ring, one message per piece": (True, 1, False, False, False, *on),
                   "two_shot, one message per block": (True, 0, False, False, True, *on),
                   "segmented_ring, through dist.isend/irecv and a shared scratch": (True, 0, False, False, True, *on),
                   "segmented_ring (default)": (True, 0, False, False, False, *on)}


def segmented_at_sizes() -> dict:
    """The benchmark's segment-size variants: the segments each cuts, its sums, the default after."""
    from parallel.collectives import algorithms as collectives
    from parallel.collectives import bench

    rank, n = dist.get_rank(), dist.get_world_size()
    seen, count = [], collectives._segments_per_chunk
    collectives._segments_per_chunk = lambda b: seen.append(count(b)) or seen[-1]
    try:
        t, out = torch.empty(5 << 20), {}  # 20 MiB of float32: 10 MiB chunks with 2 ranks
        for segment in (1 << 18, 1 << 20, 8 << 20):
            t.fill_(rank + 1)
            bench._segmented_at(t, segment)
            out[segment] = (seen.pop(), bool((t == n * (n + 1) / 2).all()), collectives.SEGMENT_BYTES)
    finally:
        collectives._segments_per_chunk = count
    return out


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_the_benchmarks_segment_sizes_apply_only_during_their_call():
    from parallel.collectives.algorithms import SEGMENT_BYTES

    got = launch(segmented_at_sizes, 2, deadline_s=60)[0]
    # 10 MiB chunks: 40 segments of 256 KiB, 10 of 1 MiB, 2 of 5 MiB (the default, 1 MiB, cuts 10)
    assert got == {1 << 18: (40, True, SEGMENT_BYTES), 1 << 20: (10, True, SEGMENT_BYTES),
                   8 << 20: (2, True, SEGMENT_BYTES)}


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_the_ring_reuses_its_scratch_buffer_and_never_returns_it(world_size):
    for rank, got in enumerate(launch(scratch_reuse, world_size, deadline_s=60)):
        assert got == {"reused": True, "sums": True, "results_untouched": True}, rank


def mismatched_call(kind: str) -> str:
    rank = dist.get_rank()
    t = torch.zeros(10 + rank) if kind == "size" else torch.zeros(10, dtype=[torch.float32, torch.float64][rank % 2])
    try:
        ring_all_reduce(t)
    except RingError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("kind", ["size", "dtype"])
def test_ranks_that_disagree_all_get_a_clear_error(kind):
    messages = launch(mismatched_call, 2, (kind,), deadline_s=60)
    for m in messages:
        assert "ranks passed different tensors or ops" in m
        assert "rank 0: numel 10" in m and ("rank 1: numel 11" in m if kind == "size" else "float64" in m)


def test_ring_argument_errors_need_no_process_group():
    with pytest.raises(ValueError, match="op must be one of"):
        ring_all_reduce(torch.zeros(3), "max")
    with pytest.raises(TypeError, match="op 'avg' needs a floating-point tensor"):
        ring_all_reduce(torch.zeros(3, dtype=torch.int64), "avg")
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        ring_all_reduce([1.0, 2.0])


def broadcast_case() -> list:
    t = torch.tensor([-0.0, 1.5, float("inf"), -2.0]) if dist.get_rank() == 0 else torch.randn(4)
    return ring_broadcast_from_rank0(t).numpy().tobytes()


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_broadcast_is_bit_exact_including_negative_zero():
    results = launch(broadcast_case, 3, deadline_s=60)
    assert results[0] == results[1] == results[2] == torch.tensor([-0.0, 1.5, float("inf"), -2.0]).numpy().tobytes()


def test_the_public_names_are_where_a_reader_looks():
    """From parallel, and from each chapter's folder; looked up only when used, so that a script
    run with -m prints its --help without importing torch first."""
    import parallel
    from parallel.dp import ring as ring_module
    from parallel.tp import ColumnParallelDense, RowParallelDense, layers

    assert parallel.ring_all_reduce is ring_module.ring_all_reduce is ring_all_reduce
    assert parallel.ColumnParallelDense is ColumnParallelDense is layers.ColumnParallelDense
    assert parallel.RowParallelDense is RowParallelDense is layers.RowParallelDense
    code = "import sys, parallel, parallel.collectives, parallel.dp, parallel.tp; print('torch' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert imported.stdout.strip() == "False", imported.stderr


# ---------------------------------------------------------------------------
# The ring on one screen (parallel/dp/simple.py), and the loop that uses it
# ---------------------------------------------------------------------------

def short_ring_cases() -> list:
    from parallel.dp.simple import ring_all_reduce as short_ring

    n, out = dist.get_world_size(), []
    for numel in (1, n, 7 * n + 1, 1000, 12345):  # fewer elements than ranks, and uneven chunks
        for dtype in (torch.float32, torch.float64, torch.int64):
            t, expected = all_reduce_case(numel, dtype, "sum", 1000)
            short_ring(t)
            out.append((numel, str(dtype), t, expected))
    return out


@pytest.mark.parametrize("world_size", world_sizes(1, 2, 3, quick=3))
def test_the_short_ring_matches_dist_all_reduce_and_is_identical_on_every_rank(world_size):
    results = launch(short_ring_cases, world_size, deadline_s=120)
    for case, (numel, dtype, got, expected) in enumerate(results[0]):
        if dtype.endswith("int64"):
            assert torch.equal(got, expected), (numel, dtype)
        else:  # another order of additions than gloo's: equal up to rounding
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-3, msg=f"{numel} {dtype}")
        for other in results[1:]:  # every chunk is finished on one rank and copied: the same bits
            assert other[case][2].numpy().tobytes() == got.numpy().tobytes(), (numel, dtype)


def short_loop_weights() -> dict:
    from parallel.common.p2p import SENT_BYTES
    from parallel.dp import simple

    before = SENT_BYTES["data"]  # the production ring's counter: the short loop must not use it
    weights = {"short ring": simple.train().state_dict(),
               "dist.all_reduce": simple.train(all_reduce=dist.all_reduce).state_dict()}
    return {**weights, "production ring bytes": SENT_BYTES["data"] - before}


def test_the_short_loop_trains_as_one_process_does_and_as_with_dist_all_reduce():
    from parallel.dp import simple

    torch.manual_seed(0)
    untrained = simple.train(steps=0).state_dict()
    alone = simple.train().state_dict()  # no process group here: one process, the whole batch
    assert not torch.equal(alone["0.weight"], untrained["0.weight"])
    for rank in launch(short_loop_weights, 2, deadline_s=120):
        assert rank["production ring bytes"] == 0
        assert_same_weights(rank["short ring"], alone)
        assert_same_weights(rank["short ring"], rank["dist.all_reduce"])


# ---------------------------------------------------------------------------
# Data: sharding, the data order, IDX files
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("size, world_size", [(128, 2), (130, 4), (3, 4), (0, 3)])
def test_shards_are_disjoint_and_cover_the_batch(size, world_size):
    batch = torch.randperm(1000)[:size]
    parts = [data_mod.shard(batch, r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat(parts), batch)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_epoch_order_is_deterministic_and_reshuffled_per_epoch():
    a = data_mod.epoch_batches(100, 32, seed=1, epoch=0)
    assert [len(b) for b in a] == [32, 32, 32, 4]
    assert all(torch.equal(x, y) for x, y in zip(a, data_mod.epoch_batches(100, 32, seed=1, epoch=0)))
    assert not torch.equal(torch.cat(a), torch.cat(data_mod.epoch_batches(100, 32, seed=1, epoch=1)))
    assert torch.equal(torch.cat(a).sort().values, torch.arange(100))


def test_synthetic_data_is_deterministic_and_balanced():
    """Bit for bit, also in another process: every rank builds the data itself."""
    import hashlib

    a, b = data_mod.synthetic(3), data_mod.synthetic(3)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    code = ("import hashlib, torch; torch.set_num_threads(1); from parallel.common.data import synthetic; "
            "print(hashlib.sha256(synthetic(3).train.x.numpy().tobytes()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.stdout.strip() == hashlib.sha256(a.train.x.numpy().tobytes()).hexdigest(), other.stderr
    assert not torch.equal(a.train.x, data_mod.synthetic(4).train.x)
    counts = torch.bincount(a.train.y, minlength=10)
    assert a.classes == 10 and counts.min() > 0.7 * counts.float().mean()


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_reader_any_image_size(tmp_path, compress):
    make_mnist(tmp_path, compress=compress)
    ds = data_mod.mnist(tmp_path)
    assert ds.features == 30 and len(ds.test) == 40 and len(ds.train) + len(ds.val) == 120


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b"\x00\x00\x08\x03" + p.read_bytes()[4:-7]), "file has"),          # truncated
    (lambda p: p.write_bytes(b"\x12\x34" + p.read_bytes()[2:]), "bad magic number"),
    (lambda p: p.write_bytes(p.read_bytes()[:2] + b"\x0d" + p.read_bytes()[3:]), "value type 0x0d"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.unlink(), "not found"),
])
def test_corrupt_idx_files_name_the_file(tmp_path, damage, message):
    make_mnist(tmp_path)
    target = tmp_path / "train-images-idx3-ubyte"
    damage(target)
    with pytest.raises(data_mod.DataError, match=message) as err:
        data_mod.mnist(tmp_path)
    assert "train-images-idx3-ubyte" in str(err.value)


def test_image_and_label_counts_must_agree(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", torch.zeros(39))
    with pytest.raises(data_mod.DataError, match="holds 40 images but .*t10k-labels-idx1-ubyte holds 39 labels"):
        data_mod.mnist(tmp_path)


def test_bad_gzip_is_a_data_error(tmp_path):
    make_mnist(tmp_path, compress=True)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(data_mod.DataError, match="t10k-images-idx3-ubyte.gz: cannot read it"):
        data_mod.mnist(tmp_path)


# ---------------------------------------------------------------------------
# Training: the same weights as one process, as DDP, with or without overlap
# ---------------------------------------------------------------------------

def ddp_train(config: Config) -> dict:
    """The reference: torch's DistributedDataParallel on the same data order and shards."""
    from torch.nn.parallel import DistributedDataParallel

    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(config.seed)
    ds = data_mod.synthetic(config.seed)
    x, y = ds.train.x[: config.train_limit], ds.train.y[: config.train_limit]
    model = build_model(ds.features, config.hidden, ds.classes, config.mode)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    for epoch in range(config.epochs):
        for batch in data_mod.epoch_batches(len(x), config.batch_size, config.seed, epoch):
            idx = data_mod.shard(batch, rank, n)
            F.cross_entropy(ddp(x[idx]), y[idx]).backward()  # equal shards: DDP's mean is the global mean
            opt.step()
            opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["py", "cpp"])
def test_data_parallel_matches_one_process_and_ddp(mode):
    single = train(Config(mode=mode, world_size=1, **QUICK))["state"]
    ours = {}
    for world_size in (2, 3):
        ranks = launch(train, world_size, (Config(mode=mode, world_size=world_size, **QUICK),), deadline_s=240)
        for r in ranks[1:]:
            assert_same_weights(r["state"], ranks[0]["state"], exact=True)  # identical on every rank
        assert_same_weights(ranks[0]["state"], single)
        ours[world_size] = ranks[0]["state"]
    ddp = launch(ddp_train, 2, (Config(mode=mode, world_size=2, **QUICK),), deadline_s=240)
    assert_same_weights(ours[2], ddp[0])


def ddp_hook_weights(steps: int = 6) -> dict:
    """Inside a rank: the same model trained by DDP twice, its buckets reduced by gloo's
    all_reduce (DDP's default) and by our ring (parallel/dp/ddp.py); small buckets, so there are
    several."""
    from torch.nn.parallel import DistributedDataParallel

    from parallel.common.p2p import SENT_BYTES
    from parallel.dp.ddp import ddp_with_our_ring

    rank, n = dist.get_rank(), dist.get_world_size()
    ds = data_mod.synthetic(0)

    def run(wrap) -> dict:
        torch.manual_seed(0)
        model = build_model(ds.features, (48, 48), ds.classes, "py")
        ddp = wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for i in range(steps):
            idx = data_mod.shard(torch.arange(i * 40, (i + 1) * 40), rank, n)  # equal shards: DDP averages
            F.cross_entropy(ddp(ds.train.x[idx]), ds.train.y[idx]).backward()
            opt.step()
            opt.zero_grad()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    default = run(lambda m: DistributedDataParallel(m, bucket_cap_mb=0.004))
    before = SENT_BYTES["data"]
    ours = run(lambda m: ddp_with_our_ring(m, bucket_cap_mb=0.004))
    return {"default": default, "our ring": ours, "ring bytes": SENT_BYTES["data"] - before}


def test_ddp_with_our_ring_as_its_comm_hook_trains_as_ddp_does():
    for rank in launch(ddp_hook_weights, 2, deadline_s=120):
        assert rank["ring bytes"] > 0  # the buckets went round our ring
        assert_same_weights(rank["our ring"], rank["default"])


@pytest.mark.slow
def test_overlap_and_small_buckets_change_nothing_but_speed():
    base = launch(train, 2, (Config(**QUICK),), deadline_s=240)[0]["state"]
    other = launch(train, 2, (Config(overlap=False, bucket_kb=1, **QUICK),), deadline_s=240)[0]["state"]
    assert_same_weights(base, other, exact=True)


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_interrupted_and_resumed_run_ends_with_exactly_the_same_weights(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    straight = launch(train, 2, (Config(**{**QUICK, "epochs": 3}),), deadline_s=240)[0]
    launch(train, 2, (Config(checkpoint=ckpt, **{**QUICK, "epochs": 1}),), deadline_s=240)
    assert not list(tmp_path.glob("*.tmp*")), "a temporary checkpoint file was left behind"
    resumed = launch(train, 2, (Config(checkpoint=ckpt, resume=True, **{**QUICK, "epochs": 3}),), deadline_s=240)[0]
    assert_same_weights(resumed["state"], straight["state"], exact=True)
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2, 3]
    for a, b in zip(resumed["epochs"], straight["epochs"]):
        assert (a["loss"], a["accuracy"]) == (b["loss"], b["accuracy"])
    state = torch.load(ckpt, weights_only=True)
    assert state["epoch"] == 3 and set(state) >= {"model", "optimizer", "epoch", "data_order", "rng"}


def test_checkpoint_of_another_model_or_garbage_is_a_clear_error(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    train(Config(world_size=1, checkpoint=ckpt, **{**QUICK, "epochs": 1}))
    with pytest.raises(CheckpointError, match="different model"):
        train(Config(world_size=1, checkpoint=ckpt, resume=True, **{**QUICK, "hidden": (8,)}))
    with pytest.raises(CheckpointError, match="different model"):
        train(Config(world_size=1, checkpoint=ckpt, resume=True, mode="cpp", **QUICK))
    Path(ckpt).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as caught:
        train(Config(world_size=1, checkpoint=ckpt, resume=True, **QUICK))
    # one line, with the cause and without the paragraph of advice torch's loader wraps it in
    message = str(caught.value)
    assert "\n" not in message and "Unsupported operand" in message and "file an issue" not in message, message
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        train(Config(world_size=1, checkpoint=str(tmp_path / "absent.pt"), resume=True, **QUICK))


# ---------------------------------------------------------------------------
# Faults: a dead peer and a hung peer end the run with a clear error, within the timeout
# ---------------------------------------------------------------------------

def train_with_fault(config: Config, fault: str) -> dict:
    if dist.get_rank() == 1:
        def strike() -> None:
            time.sleep(1.0)
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:  # hang: stop this rank dead without closing its connections
                os.kill(os.getpid(), signal.SIGSTOP)
        threading.Thread(target=strike, daemon=True).start()
    return train(config)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_failed_peer_stops_the_run_with_a_clear_error(fault):
    config = Config(**{**QUICK, "epochs": 1000, "train_limit": None, "timeout": 8})
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(train_with_fault, 2, (config, fault), timeout_s=config.timeout, deadline_s=120)
    elapsed = time.monotonic() - started
    message = str(err.value)
    assert "rank 0:" in message and "rank 1:" in message
    if fault == "kill":
        assert "rank 1: killed by SIGKILL" in message
    assert elapsed < 60, f"took {elapsed:.0f} s to notice"


def abort_while_exiting() -> int:
    import atexit
    atexit.register(os.abort)  # would run in the interpreter's teardown, which a rank skips
    return 1


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
def test_a_rank_skips_the_interpreters_teardown_once_its_result_is_written():
    """gloo's worker threads, kept by a group that outlives destroy_process_group (as DDP's
    does), can abort a rank during that teardown (parallel/common/launch.py, ``_leave``)."""
    assert launch(abort_while_exiting, 2, deadline_s=60) == [1, 1]


def threads_around_a_destroyed_group() -> tuple[int, int, int]:
    """Inside a rank: how many threads this process has before a new group, once our
    collectives ran on it, and after it was destroyed. (Counted, not named: gloo's threads
    name themselves a moment after they start.)"""
    from parallel.collectives.algorithms import ALGORITHMS, all_reduce

    def count() -> int:
        return len(os.listdir("/proc/self/task"))

    before = count()
    group = dist.new_group(list(range(dist.get_world_size())))
    for algorithm in ALGORITHMS:
        all_reduce(torch.ones(10), algorithm=algorithm, group=group)
    during = count()
    dist.destroy_process_group(group)
    del group
    return before, during, count()


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are counted in Linux's /proc")
def test_our_collectives_keep_no_destroyed_group_alive():
    """A cache that held the group would keep gloo's threads running after
    destroy_process_group, into the interpreter's teardown, where they abort the process."""
    for before, during, after in launch(threads_around_a_destroyed_group, 2, deadline_s=60):
        assert during > before and after == before


# ---------------------------------------------------------------------------
# gloo's I/O threads: left alone, unless asked, and then only in our own ranks (parallel/common/threads.py)
# ---------------------------------------------------------------------------

def thread_priorities() -> list[tuple[str, str, int, bool]]:
    """Inside a rank, after making tensor-parallel groups (each gloo group starts an I/O thread
    of its own) and then a group of the user's own: every thread's name, scheduling policy and
    niceness, read from the kernel directly, and whether it is an I/O thread of the user's group."""
    from parallel.common.threads import io_threads
    from parallel.tp.training import make_layout

    def wait_for_io_threads(count: int) -> list[int]:  # gloo's I/O thread names itself a moment late
        deadline = time.monotonic() + 10
        while len(io_threads()) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return io_threads()

    make_layout(dist.get_world_size())
    ours = wait_for_io_threads(2)  # the world's group and the tensor-parallel group
    users = dist.new_group(list(range(dist.get_world_size())))
    dist.all_reduce(torch.ones(1), group=users)
    theirs = set(wait_for_io_threads(len(ours) + 1)) - set(ours)
    policy = {os.SCHED_OTHER: "other", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}
    return [(Path(f"/proc/self/task/{tid}/comm").read_text().strip(), policy[os.sched_getscheduler(int(tid))],
             os.getpriority(os.PRIO_PROCESS, int(tid)), int(tid) in theirs)
            for tid in os.listdir("/proc/self/task")]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities come from Linux's /proc")
@pytest.mark.parametrize("setting", [None, "batch", "idle", "0", "19", "7"])
def test_gloo_io_threads_are_left_alone_unless_asked_and_then_only_ours_change(monkeypatch, setting):
    """By default (and with 0) no thread's scheduling changes. Asked for, the setting reaches the
    I/O threads of the groups our launcher and our layout made: "batch" gives SCHED_BATCH, "idle"
    SCHED_IDLE, a number that niceness under the normal policy; a group the user made, and every
    other thread, keep the normal policy at niceness 0."""
    from parallel.common.threads import IO_NICE_VAR, IO_THREAD_NAME

    if setting is None:
        monkeypatch.delenv(IO_NICE_VAR, raising=False)
    else:
        monkeypatch.setenv(IO_NICE_VAR, setting)  # the spawned ranks inherit it
    want = {None: ("other", 0), "batch": ("batch", 0), "idle": ("idle", 0)}.get(setting) or ("other", int(setting))
    for threads in launch(thread_priorities, 2, deadline_s=60):
        ours = [(policy, nice) for name, policy, nice, users in threads if name == IO_THREAD_NAME and not users]
        assert len(ours) >= 2 and ours == [want] * len(ours), threads
        assert sum(users for *_, users in threads) == 1, threads
        assert all((policy, nice) == ("other", 0) for name, policy, nice, users in threads
                   if name != IO_THREAD_NAME or users), threads


def io_thread_nices_once_named(wait_s: float = 5.0) -> list:
    """The I/O threads' settings, once gloo's I/O thread has named itself (it does so a moment
    after it starts: read at once, on a busy machine, the list can still be empty)."""
    from parallel.common.threads import io_thread_nices, io_threads

    deadline = time.monotonic() + wait_s
    while not io_threads() and time.monotonic() < deadline:
        time.sleep(0.001)
    return io_thread_nices()


def io_settings_in_a_group_we_did_not_launch(folder: str) -> list:
    """As under torchrun: this process joins a group by itself (no launcher of ours started it)."""
    from parallel.common.launch import run_in_process_group

    return run_in_process_group(io_thread_nices_once_named, (), "gloo", 30, f"file://{folder}/store", 0, 1)


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities come from Linux's /proc")
def test_the_io_setting_is_never_applied_outside_our_own_ranks(tmp_path):
    code = ("import sys, json; sys.path[:0] = ['.', 'tests']; from test_parallel import "
            f"io_settings_in_a_group_we_did_not_launch as f; print(json.dumps(f({str(tmp_path)!r})))")
    from parallel.common.threads import IO_NICE_VAR

    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, IO_NICE_VAR: "idle"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [0]  # the one I/O thread, left alone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities come from Linux's /proc")
def test_lowering_waits_for_an_io_thread_that_names_itself_late():
    """Gloo's I/O thread names itself a moment after it starts; a search made before that must
    not miss it. A stand-in thread renames itself 0.2 s late and keeps running until checked."""
    from parallel.common.threads import IO_THREAD_NAME, io_threads, lower_io_priority

    started, checked, tid = threading.Event(), threading.Event(), []

    def late_io_thread() -> None:
        tid.append(threading.get_native_id())
        started.set()
        time.sleep(0.2)
        Path(f"/proc/self/task/{tid[0]}/comm").write_text(IO_THREAD_NAME)
        checked.wait(30)

    thread = threading.Thread(target=late_io_thread)
    before = len(io_threads())
    thread.start()
    try:
        started.wait(30)
        assert lower_io_priority("idle", expect=before + 1) == 1
        assert os.sched_getscheduler(tid[0]) == os.SCHED_IDLE
        assert lower_io_priority("idle", expect=before + 1) == 0  # already so: nothing changed
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER  # the caller is left alone
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0
    finally:
        checked.set()
        thread.join()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities come from Linux's /proc")
@pytest.mark.parametrize("setting, recorded", [("7", 7), ("idle", "idle"), (None, None)])
def test_benchmark_records_say_what_priority_the_io_threads_had(tmp_path, monkeypatch, setting, recorded):
    """A record states the setting (None: left alone, the default) and what every rank's I/O
    threads had when it was written."""
    from parallel.common.threads import IO_NICE_VAR

    monkeypatch.delenv(IO_NICE_VAR, raising=False)  # None: the default
    out = tmp_path / "overhead.json"
    env = {IO_NICE_VAR: setting} if setting else {}
    result = run_script("distributed.py", "--bench", "overhead", "--world-size", "2", "--json", str(out),
                        timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["gloo_io_nice"] == recorded
    assert record["gloo_io_thread_nices"] == {str(recorded or 0): 2}  # one group, one I/O thread per rank


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities come from Linux's /proc")
def test_the_fit_record_says_what_priority_the_io_threads_had(tmp_path):
    """The α-β fit, like the benchmarks, records the setting and what the ranks' I/O threads had."""
    from parallel.common.threads import IO_NICE_VAR

    out = tmp_path / "fit.json"
    result = run_script("-m", "parallel.collectives.costmodel", "fit", "--world-sizes", "2", "--rounds", "1",
                        "--json", str(out), timeout=180, env={IO_NICE_VAR: "7"})
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["gloo_io_nice"] == 7
    assert record["fits"]["2"]["gloo_io_thread_nices"] == {"7": 2}
    assert "gloo's I/O threads at niceness 7" in result.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU time comes from Linux's /proc")
def test_thread_cpu_puts_each_threads_time_under_its_kind():
    """Work on the main thread counts as "main", work on another Python thread as "other"."""
    from parallel.common.threads import THREAD_KINDS, thread_cpu_s

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before = thread_cpu_s()
    assert set(before) == set(THREAD_KINDS)
    spin(0.2)
    middle = thread_cpu_s()
    assert middle["main"] - before["main"] >= 0.15
    spun, leave = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (spin(0.2), spun.set(), leave.wait(30)))
    worker.start()
    try:
        assert spun.wait(30)
        alive = thread_cpu_s()  # read while the worker lives: an ended thread takes its time with it
    finally:
        leave.set()
        worker.join(30)
    assert alive["other"] - middle["other"] >= 0.15
    for kind in ("gloo I/O", "gloo worker"):  # idle, if an earlier test left a process group here
        assert alive[kind] - middle[kind] < 0.1


def small_allreduce(path: str) -> str:
    """Inside a rank: bench.allreduce at two small sizes and three rounds (the real one takes
    minutes); returns what the rank wrote on stderr."""
    import contextlib
    import io

    from parallel.collectives import bench

    bench.SIZES = [4 << 10, 16 << 10]
    bench._rounds = lambda nbytes: 3
    bench._cpp_loop_everywhere = lambda: "not needed at these sizes"  # no C++ build in this test
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        bench.allreduce(Config(), Path(path))
    return said.getvalue()


@pytest.mark.slow
def test_the_allreduce_benchmark_says_how_far_it_has_got(tmp_path):
    """Rank 0 reports each size as it completes, on stderr; the record holds the results only."""
    out = tmp_path / "allreduce.json"
    said = launch(small_allreduce, 2, (str(out),), deadline_s=240)
    lines = said[0].splitlines()
    assert lines[0].startswith("allreduce: 2 sizes, 4 KiB to 16 KiB"), said[0]
    assert re.fullmatch(r"allreduce: 4 KiB done \(1/2, \d+ s\)", lines[1]), said[0]
    assert re.fullmatch(r"allreduce: 16 KiB done \(2/2, \d+ s\)", lines[2]), said[0]
    assert said[1] == ""  # one rank speaks for all
    record = json.loads(out.read_text())
    assert {r["bytes"] for r in record["results"]} == {4 << 10, 16 << 10}
    assert "done" not in out.read_text()


def small_burst(path: str) -> None:
    """Inside a rank: bench.burst at two small sizes and three rounds (the real one takes minutes)."""
    from parallel.collectives import bench

    bench.BURST_SIZES = [4 << 10, 64 << 10]
    bench._burst_rounds = lambda nbytes: 3
    bench.burst(Config(), Path(path))


@pytest.mark.slow
def test_burst_benchmark_times_every_variant_at_every_size_and_burst(tmp_path):
    """--bench burst: one row per size, burst length and variant, the C++ loop included where it
    builds (and why not where it does not), the model's time for the model's algorithms, and
    all_reduce as the reference of the pairing."""
    from parallel.collectives import cpp_loop
    from parallel.collectives.bench import BURST_VARIANTS, BURSTS, CPP_LOOP

    with_cpp = cpp_loop.unavailable() is None
    if with_cpp:
        cpp_loop.build()  # before the ranks start, as distributed.py does
    out = tmp_path / "burst.json"
    launch(small_burst, 2, (str(out),), deadline_s=240)
    record = json.loads(out.read_text())
    variants = [v for v in BURST_VARIANTS if with_cpp or v != CPP_LOOP]
    rows = {(r["bytes"], r["calls_in_a_row"], r["variant"]): r for r in record["results"]}
    assert set(rows) == {(b, k, v) for b in (4 << 10, 64 << 10) for k in BURSTS for v in variants}
    assert (record["without_cpp_loop"] is None) == with_cpp
    for r in record["results"]:
        v = r["variant"]
        assert r["time_us"] > 0 and ("predicted_us" in r) == (v in ("ring", "two_shot", "segmented_ring"))
        assert r["mean_us"] > 0 and r["p90_us"] >= r["time_us"]  # the 90th percentile is not below the median
        if v == "dist.all_reduce":
            assert r["busbw_ratio_to_dist"] == 1.0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU time comes from Linux's /proc")
def test_cpu_benchmark_finds_gloos_work_on_its_worker_threads_and_ours_on_the_main_thread(tmp_path):
    """--bench cpu: dist.all_reduce's CPU time shows on gloo's worker threads and ours on the main
    thread (the classification works), and no more cores are busy than the machine has."""
    from parallel.collectives import cpp_loop
    from parallel.collectives.bench import CPP_LOOP, CPU_SIZES, CPU_VARIANTS

    out = tmp_path / "cpu.json"
    result = run_script("distributed.py", "--bench", "cpu", "--world-size", "2", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    rows = {(r["bytes"], r["variant"]): r for r in record["results"]}
    with_cpp = cpp_loop.unavailable() is None  # the C++ loop runs where it can be built, and says so where not
    assert set(rows) == {(b, v) for b in CPU_SIZES for v in CPU_VARIANTS + ((CPP_LOOP,) if with_cpp else ())}
    assert (record["without_cpp_loop"] is None) == with_cpp
    if with_cpp:
        for b in CPU_SIZES:  # paired with the Python loop: a median inside its interval
            loop = rows[(b, CPP_LOOP)]
            low, high = loop["cpu_over_python_loop_ci"]
            assert low <= loop["cpu_over_python_loop"] <= high
        assert "with its loop in C++ over the Python loop's" in result.stdout
    for (_, variant), r in rows.items():
        by = r["cpu_us_by_thread"]
        if variant == "dist.all_reduce":
            assert by["gloo worker"] > 0.1 * r["cpu_us"] and r["cpu_over_dist"] == 1.0
        else:  # ours posts and adds on the main thread; gloo's I/O threads, at their own priority,
            # may spin for most of the rest on a machine with more busy threads than cores
            assert by["gloo worker"] < 0.02 * r["cpu_us"] and by["main"] > 0.05 * r["cpu_us"], (variant, by)
        assert 0 < r["cores_busy"] <= 1.1 * record["cores"]
    assert "CPU / gloo's" in result.stdout


def clocks_compared(unreadable_on: int | None) -> bool:
    """Inside a rank: harness.one_clock, with the boot id unreadable on one rank if asked."""
    from parallel.common import harness

    if dist.get_rank() == unreadable_on:
        real = Path.read_bytes

        def read_bytes(self: Path) -> bytes:
            if str(self).endswith("boot_id"):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)
        Path.read_bytes = read_bytes
    return harness.one_clock()


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ranks' clocks are compared via Linux's boot id")
def test_ranks_compare_clocks_only_when_every_rank_can_read_the_boot_id():
    assert launch(clocks_compared, 2, (None,), deadline_s=60) == [True, True]  # one machine, one boot
    assert launch(clocks_compared, 2, (1,), deadline_s=60) == [False, False]  # no error, no hang


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ranks' clocks are compared via Linux's boot id")
def test_zero_benchmark_splits_the_dp_all_reduce_into_waiting_and_the_call(tmp_path):
    """Each rank's time inside the dp step's all-reduce is its wait for the last rank to arrive
    plus the call after that; no rank can finish before the last one has arrived."""
    out = tmp_path / "zero.json"
    result = run_script("distributed.py", "--bench", "zero", "--world-size", "2", "--hidden", "16,16",
                        "--json", str(out), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    dp = next(r for r in json.loads(out.read_text())["results"] if r["variant"] == "dp")
    inside = dp["allreduce_in_step_us_by_rank"]
    waiting = dp["allreduce_in_step_waiting_us_by_rank"]
    after = dp["allreduce_in_step_after_last_arrival_us_by_rank"]
    assert len(inside) == len(waiting) == len(after) == 2
    for i, w, a in zip(inside, waiting, after):
        assert w >= 0 and a > 0
        assert w + a == pytest.approx(i, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["x", "20", "-1", "1.5", "IDLE", "Batch", ""])
def test_a_bad_io_priority_setting_is_a_clear_error(monkeypatch, bad):
    from parallel.common.threads import IO_NICE_VAR, io_nice

    monkeypatch.setenv(IO_NICE_VAR, bad)
    with pytest.raises(ValueError, match=f"{IO_NICE_VAR} must be 'batch' .* 'idle' .* or an integer from 0"):
        io_nice()
    result = run_script("distributed.py", "--world-size", "2", "--epochs", "1", timeout=120,
                        env={IO_NICE_VAR: bad})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert IO_NICE_VAR in result.stderr.strip().splitlines()[-1]


def test_ionice_needs_a_peer():
    result = run_script("-m", "parallel.collectives.ionice", "--world-size", "1", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--world-size must be at least 2" in result.stderr


@pytest.mark.parametrize("bad, says", [("-1", "must be at least 0"), ("x", "expected a whole number")])
def test_ionice_refuses_a_bad_busy_count(bad, says):
    result = run_script("-m", "parallel.collectives.ionice", "--busy", bad, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--busy" in result.stderr and says in result.stderr


@pytest.mark.parametrize("bad", ["19", "19,19", "19,20", "idle,x", "0,19,idle"])
def test_ionice_takes_two_different_settings(bad):
    result = run_script("-m", "parallel.collectives.ionice", "--settings", bad, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "setting" in result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities come from Linux's /proc")
def test_ionice_keeps_other_processes_busy_and_stops_them(tmp_path):
    """--busy N: N spinning processes run throughout the launches (counted from /proc while the
    script runs) and are gone when it ends; the record and the table say so."""
    from parallel.collectives import ionice

    def spinners() -> int:
        count = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                count += Path(f"/proc/{pid}/cmdline").read_bytes().endswith(b"while True: pass\0")
            except OSError:  # ended meanwhile
                continue
        return count

    out, before = tmp_path / "busy.json", spinners()
    script = subprocess.Popen([sys.executable, "-m", "parallel.collectives.ionice", "--world-size", "2", "--pairs", "1",
                               "--rounds", "5", "--settings", "0,batch", "--busy", "2", "--json", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, deadline = 0, time.monotonic() + 60
    while script.poll() is None and time.monotonic() < deadline:
        seen = max(seen, spinners() - before)
        time.sleep(0.05)
    stdout, stderr = script.communicate(timeout=180)
    assert script.returncode == 0, stderr
    assert seen == 2 and spinners() == before
    record = json.loads(out.read_text())
    assert record["busy"] == 2 and [la["io_thread_nices"] for la in record["launches"]] == [[0], ["batch"]]
    assert "2 other processes spinning on the CPU meanwhile" in ionice.table(record)
    assert "mean: nice 0 → SCHED_BATCH" in stdout


@pytest.mark.slow
def test_ionice_compares_niceness_19_with_sched_idle(tmp_path):
    from parallel.collectives import ionice

    out = tmp_path / "ionice.json"
    result = run_script("-m", "parallel.collectives.ionice", "--world-size", "2", "--pairs", "1", "--rounds", "5",
                        "--settings", "19,idle", "--json", str(out), timeout=180)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["settings"] == [19, "idle"] and [la["nice"] for la in record["launches"]] == [19, "idle"]
    assert [la["io_thread_nices"] for la in record["launches"]] == [[19], ["idle"]]  # the setting took effect
    for s in record["summary"]:
        assert s["mean_ratio_range"][0] <= s["mean_ratio_idle_to_19"] <= s["mean_ratio_range"][1]
    assert "mean: nice 19 → SCHED_IDLE" in result.stdout and "SCHED_IDLE: " in result.stdout
    assert ionice.table(record) in result.stdout


@pytest.mark.slow
def test_ionice_compares_both_settings_and_records_them(tmp_path):
    out = tmp_path / "ionice.json"
    result = run_script("-m", "parallel.collectives.ionice", "--world-size", "2", "--pairs", "1", "--rounds", "5",
                        "--json", str(out), timeout=180)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert [la["nice"] for la in record["launches"]] == [0, 19]
    assert [la["io_thread_nices"] for la in record["launches"]] == [[0], [19]]  # the setting took effect
    assert {s["variant"] for s in record["summary"]} == {
        "all_reduce auto, 4 KiB", "dist.all_reduce, 4 KiB", "all_reduce auto, 1 MiB", "dist.all_reduce, 1 MiB"}
    for s in record["summary"]:
        assert s["mean_us_nice0"] > 0 and s["mean_us_nice19"] > 0
        assert s["mean_ratio_range"][0] <= s["mean_ratio_19_to_0"] <= s["mean_ratio_range"][1]
    assert "| all_reduce auto, 4 KiB |" in result.stdout


# ---------------------------------------------------------------------------
# distributed.py as a user runs it
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_default_run_learns_and_writes_json_and_plot(tmp_path):
    out = tmp_path / "run.json"
    args = ["distributed.py", "-m", "py", "--json", str(out)]
    plotting = __import__("importlib").util.find_spec("matplotlib") is not None
    if plotting:
        args += ["--plot", str(tmp_path / "run.png")]
    started = time.monotonic()
    result = run_script(*args, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 120
    lines = [line for line in result.stdout.splitlines() if line.startswith("epoch")]
    assert len(lines) == 5 and "samples/s" in lines[0] and "comm" in lines[0]
    record = json.loads(out.read_text())
    assert record["final_accuracy"] > 0.8  # chance is 0.1
    assert [e["epoch"] for e in record["epochs"]] == [1, 2, 3, 4, 5]
    assert {"loss", "accuracy", "samples_per_s", "comm_s"} <= record["epochs"][0].keys()
    if plotting:
        assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"


def check_trace(record: dict, overlap: bool) -> None:
    """What every recorded step must show, measured on any machine."""
    assert [s["step"] for s in record["steps"]] == list(range(2, 10))
    buckets = len(record["bucket_bytes"])
    width = max(record["hidden"])  # a parameter larger than the cap gets a bucket of its own
    assert buckets > 2 and max(record["bucket_bytes"]) <= max(record["bucket_kb"] * 1024, width * width * 4)
    overlapped = []
    for step in record["steps"]:
        assert len(step["ranks"]) == 2
        for rank in step["ranks"]:
            assert 0 < rank["forward_end_s"] < rank["backward_end_s"] <= rank["step_end_s"]
            assert len(rank["buckets"]) == buckets
            for b in rank["buckets"]:
                assert b["ready"] <= b["start"] <= b["end"] <= rank["step_end_s"]
                assert b["ready"] <= rank["backward_end_s"]  # a gradient is ready before backward returns
                if not overlap:
                    assert b["start"] >= rank["backward_end_s"]
        overlapped.append(all(r["buckets"][0]["start"] < r["backward_end_s"] for r in step["ranks"]))
    assert any(overlapped) == overlap  # the first bucket goes while backward still runs: only with overlap


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_trace_records_the_buckets_against_the_backward(tmp_path, overlap):
    out = tmp_path / "trace.json"
    # Layers as wide as the chapter's traced run: backward, after the first bucket is ready, then
    # outlasts the communication thread's wake-up. At 64 wide, under load on 2 cores, some runs
    # had no recorded step in which the first bucket started before backward ended.
    result = run_script("distributed.py", "--hidden", "512,512,512", "--bucket-kb", "256", "--epochs", "1",
                        "--trace", str(out), *([] if overlap else ["--no-overlap"]), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["overlap"] == overlap and record["data_parallel_ranks"] == 2
    check_trace(record, overlap)


@pytest.mark.slow
def test_trace_needs_buckets_to_record():
    for args in (["--zero"], ["--world-size", "1"], ["--world-size", "2", "--tp", "2"], ["--bench", "step"]):
        result = run_script("distributed.py", "--trace", "/tmp/never_written.json", *args, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "--trace" in result.stderr.strip().splitlines()[-1], result.stderr


def made_up_trace(overlap: bool) -> dict:
    """A trace record as distributed.py --trace writes it, with times made up (for the figure)."""
    def rank(shift: float) -> dict:
        buckets = [{"ready": 0.004 + 0.002 * b + shift, "start": 0.0045 + 0.003 * b + shift,
                    "end": 0.007 + 0.003 * b + shift} for b in range(3)]
        return {"forward_end_s": 0.003, "backward_end_s": 0.011 + shift, "step_end_s": 0.014 + shift,
                "buckets": buckets}
    return {"benchmark": "trace", "overlap": overlap, "bucket_bytes": [8192, 8192, 2600], "bucket_kb": 8,
            "hidden": [64, 64], "mode": "py", "data_parallel_ranks": 2, "backend": "gloo",
            "steps": [{"step": s, "ranks": [rank(0.0), rank(0.001 * s)]} for s in range(2, 10)]}


@pytest.mark.plot
@pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is None,
                    reason="matplotlib (optional) not installed")
@pytest.mark.slow
def test_the_overlap_figure_is_drawn_from_a_trace(tmp_path):
    record = tmp_path / "trace.json"
    record.write_text(json.dumps(made_up_trace(True)))
    for extra in ([], ["--step", "4"]):
        png = tmp_path / f"overlap{len(extra)}.png"
        result = run_script("-m", "parallel.dp.trace", str(record), "--out", str(png), *extra, timeout=120)
        assert result.returncode == 0, result.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = run_script("-m", "parallel.dp.trace", str(record), "--out", str(tmp_path / "x.png"), "--step", "12")
    assert result.returncode == 2 and "the record holds steps [2, 3, 4, 5, 6, 7, 8, 9]" in result.stderr


@pytest.mark.slow
def test_mnist_from_idx_files(tmp_path):
    make_mnist(tmp_path, n_train=600, n_test=100, compress=True)
    result = run_script("distributed.py", "--data", "mnist", "--data-dir", str(tmp_path), "--epochs", "2",
                        "--batch-size", "50", "--hidden", "16", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test accuracy" in result.stdout


@pytest.mark.slow
def test_cli_errors_exit_non_zero_with_the_reason(tmp_path):
    result = run_script("distributed.py", "--data", "mnist", "--data-dir", str(tmp_path), "--world-size", "1",
                        timeout=120)
    assert result.returncode == 1 and "not found" in result.stderr and "nothing is downloaded" in result.stderr
    result = run_script("distributed.py", "--resume", timeout=60)
    assert result.returncode != 0 and "--resume needs --checkpoint" in result.stderr
    result = run_script("distributed.py", "--hidden", "a,b", timeout=60)
    assert result.returncode == 2 and "--hidden takes widths" in result.stderr
    assert "Examples:" in run_script("distributed.py", "--help").stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_nodes_on_loopback(tmp_path):
    """torchrun --nnodes 2: each "node" is a torchrun on this machine; a taken port is retried."""
    for _attempt in range(3):
        port = _free_port()
        procs = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
             "distributed.py", "-m", "py", "--epochs", "1", "--json", str(tmp_path / f"node{node}.json")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
        try:
            outputs = [p.communicate(timeout=240)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
        if all(p.returncode == 0 for p in procs):
            break
        if "address already in use" not in "".join(outputs).lower():
            pytest.fail("torchrun failed:\n" + "\n".join(o[-2000:] for o in outputs))
    record = json.loads((tmp_path / "node0.json").read_text())
    assert record["world_size"] == 2 and record["final_accuracy"] > 0.3
    assert not (tmp_path / "node1.json").exists()  # only global rank 0 writes
