"""Training in bfloat16: --dtype (the forward under torch.autocast) and --grad-dtype (what the
gradients are summed in), their dtypes everywhere, the bytes they send, checkpoints, the
command line's refusals, and the bf16 benchmark's record.

Functions that run inside the ranks are top-level, so the spawned processes can import them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from conftest import run_script
from distributed import train
from parallel.common import data as data_mod
from parallel.common import training
from parallel.common.launch import launch
from parallel.common.training import Config, build_model
from parallel.dp.trainer import DataParallel

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

# Small and short; the learning rate high enough that two epochs of 600 samples learn (test accuracy 0.4)
QUICK = {"epochs": 2, "batch_size": 60, "hidden": (16,), "train_limit": 600, "return_state": True, "timeout": 60,
         "lr": 2e-2}


def float_dtypes(state: dict) -> set[torch.dtype]:
    """Every floating-point tensor's dtype in a (nested) state dict."""
    found = set()
    for v in state.values():
        if isinstance(v, dict):
            found |= float_dtypes(v)
        elif isinstance(v, torch.Tensor) and v.is_floating_point():
            found.add(v.dtype)
    return found


class Recording(DataParallel):
    """Plain data parallelism that notes the dtypes it sees: every layer's output (in training
    and in evaluation), the gradients when the optimiser is about to step, and the optimiser."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.outputs: set[tuple[str, torch.dtype]] = set()
        self.grads: set[torch.dtype] = set()

    def build_model(self, ds: data_mod.Dataset) -> nn.Module:
        model = super().build_model(ds)
        for layer in model:
            layer.register_forward_hook(lambda m, args, out: self.outputs.add((type(m).__name__, out.dtype)))
        return model

    def make_optimizer(self, model: nn.Module):
        self.opt = super().make_optimizer(model)
        return self.opt

    def after_backward(self) -> None:
        super().after_backward()
        self.grads |= {p.grad.dtype for p in self.opt.param_groups[0]["params"]}


def test_bfloat16_autocast_computes_in_bfloat16_and_keeps_float32_weights_gradients_and_adam_state():
    how = Recording(Config(world_size=1, dtype="bfloat16", **QUICK))
    result = training.train(how.config, how)
    # every layer, the Dense layers of mode py and the torch head, computed in bfloat16, in
    # training and in evaluation (evaluation runs last: a float32 output there would show here)
    assert how.outputs == {("Dense", torch.bfloat16), ("Linear", torch.bfloat16)}
    assert how.grads == {torch.float32}
    with training.autocast(how.config):  # the loss, as the loop computes it: autocast to float32
        assert F.cross_entropy(torch.ones(4, 10, dtype=torch.bfloat16), torch.arange(4)).dtype == torch.float32
    assert float_dtypes(result["state"]) == {torch.float32}
    assert float_dtypes(how.opt.state_dict()["state"]) == {torch.float32}
    losses = [e["loss"] for e in result["epochs"]]
    assert losses[1] < losses[0] and result["final_accuracy"] > 0.3  # 10 classes: chance is 0.1

    plain = Recording(Config(world_size=1, **QUICK))
    reference = training.train(plain.config, plain)
    assert plain.outputs == {("Dense", torch.float32), ("Linear", torch.float32)}  # float32: no autocast
    for k, v in result["state"].items():  # the same training, rounded differently: close, not equal
        assert not torch.equal(v, reference["state"][k]), k
        # Adam moves a weight by about lr per step whatever the gradient's size, so where rounding
        # flips a tiny gradient's sign the weights part by a few lr; nowhere by more
        torch.testing.assert_close(v, reference["state"][k], rtol=0, atol=5 * QUICK["lr"], msg=k)


def test_a_bfloat16_run_resumed_from_its_checkpoint_keeps_float32_state_and_ends_where_it_would(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    config = {**QUICK, "world_size": 1, "dtype": "bfloat16", "epochs": 2}
    straight = train(Config(**config))
    train(Config(**{**config, "epochs": 1}, checkpoint=ckpt))
    saved = torch.load(ckpt, weights_only=True)
    assert float_dtypes(saved["model"]) == {torch.float32}
    assert float_dtypes(saved["optimizer"]["state"]) == {torch.float32}
    resumed = train(Config(**config, checkpoint=ckpt, resume=True))
    assert float_dtypes(resumed["state"]) == {torch.float32}
    for k, v in resumed["state"].items():
        assert torch.equal(v, straight["state"][k]), k


@pytest.mark.parametrize("args, says", [
    (["-m", "ptx", "--dtype", "bfloat16"], "mode ptx computes in float32 and float64 only"),
    (["--grad-dtype", "bfloat16", "--world-size", "1"], "nothing is sent"),
    (["--grad-dtype", "bfloat16", "--world-size", "2", "--tp", "2"], "nothing is sent"),
    (["--bench", "zero", "--grad-dtype", "bfloat16"], "belong to training, not to --bench"),
    (["--dtype", "float16"], "invalid choice"),
])
def test_precision_mistakes_are_one_line_before_any_rank_starts(args, says):
    done = run_script("distributed.py", *args, timeout=120)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""  # no rank started, nothing trained


def test_a_runs_table_names_its_precision_and_a_float32_run_says_nothing_new():
    from parallel.common.runs import table

    record = {"epochs": [{"epoch": 1, "loss": 1.0, "accuracy": 0.5, "samples_per_s": 100.0, "comm_s": 0.1}],
              "final_accuracy": 0.5, "world_size": 2, "backend": "gloo", "torch": "2.13.0+cpu",
              "date": "2026-01-01", "command": "python distributed.py",
              "config": {"data": "synthetic", "mode": "py", "hidden": [16], "batch_size": 60, "tp": 1}}
    assert "mode py, hidden [16]" in table(record)  # a record older than the fields
    record["config"].update(dtype="float32", grad_dtype="float32")
    assert "mode py, hidden [16]" in table(record)
    record["config"].update(dtype="bfloat16", grad_dtype="bfloat16")
    assert "mode py, bfloat16 autocast, gradients summed in bfloat16, hidden [16]" in table(record)


def test_the_ddp_hook_takes_float32_or_bfloat16_and_says_so_before_any_process_group():
    from parallel.dp.ddp import ddp_with_our_ring

    with pytest.raises(ValueError, match="grad_dtype must be one of torch.float32, torch.bfloat16"):
        ddp_with_our_ring(nn.Linear(2, 2), grad_dtype=torch.float16)


def test_dividing_in_float32_before_the_cast_rounds_once_where_dividing_in_bfloat16_rounds_twice():
    """Why ring_hook_bf16 divides by n before casting (parallel/dp/ddp.py): at n = 3 the
    quotient x / 3 is not a bfloat16 value, and a bfloat16 division rounds it a second time."""
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    exact = x.double() / 3
    before = (x / 3).to(torch.bfloat16).double()  # float32 quotient, then one rounding
    after = (x.to(torch.bfloat16) / 3).double()   # rounded, divided, rounded again
    bound = 2.0 ** -8 * exact.abs()  # one rounding to bfloat16 (8 significant bits) errs by at most this
    err_before, err_after = (before - exact).abs(), (after - exact).abs()
    assert (err_before <= bound * (1 + 1e-6)).all()
    assert (err_after > bound).float().mean() > 0.05  # beyond what one rounding can do: one in twenty and more
    assert err_after.mean() > 1.2 * err_before.mean()


# ---------------------------------------------------------------------------
# The benchmark's table, from a made-up record
# ---------------------------------------------------------------------------

def made_up_bf16_record(bf16_accuracies: tuple[float, ...]) -> dict:
    accuracy = []
    for seed in range(len(bf16_accuracies)):
        for variant, acc in (("float32", 0.95), ("bfloat16, float32 reduction", bf16_accuracies[seed]),
                             ("bfloat16, bfloat16 reduction", 0.94)):
            accuracy.append({"variant": variant, "seed": seed, "test_accuracy": acc, "final_loss": 0.1,
                             "samples_per_s": 1000.0, "comm_s_per_epoch": 0.1})
    allreduce = []
    for dtype, size, time_us in (("float32", 4, 2000.0), ("bfloat16", 2, 1100.0)):
        allreduce.append({"numel": 1 << 20, "dtype": dtype, "bytes": size << 20, "time_us": time_us,
                          "spread_us": 10.0, "algbw_gbs": 1.0, "busbw_gbs": 1.0, "algorithm": "one_shot",
                          "add_us": 800.0 + time_us / 100,
                          **({"time_over_float32": 0.55, "ci": [0.5, 0.6], "verdict": "faster"}
                             if dtype == "bfloat16" else {})})
    step = [{"variant": v, "step_us": 1000.0, "spread_us": 5.0, "ratio_to_float32": 1.0, "ratio_ci": [0.9, 1.1],
             "verdict": "no significant difference", "allreduce_in_step_us": 300.0} for v in
            ("float32", "bfloat16, float32 reduction", "bfloat16, bfloat16 reduction")]
    return {"benchmark": "bf16", "device": "cpu", "torch": "2.13.0+cpu", "backend": "gloo", "world_size": 2,
            "threads_per_rank": 1, "date": "2026-01-01T00:00:00+00:00", "command": "python distributed.py --bench bf16",
            "ci_level": 0.95, "mode": "py", "hidden": [16], "data": "synthetic", "epochs": 2, "global_batch": 60,
            "lr": 2e-3, "bucket_kb": 25600, "parameters": 698, "goal_points": 1.0,
            "allreduce": allreduce, "step": step, "accuracy": accuracy}


def test_the_bf16_table_judges_the_goal_on_the_mean_difference_over_seeds():
    from parallel.collectives.precision import bf16_table

    met = bf16_table(made_up_bf16_record((0.95, 0.93, 0.96)))  # -2, +1 points: mean -0.33
    assert "met (-0.33 points)" in met
    assert "| bfloat16, float32 reduction | 95.0% / 93.0% / 96.0% | 94.67% | -0.33 |" in met
    assert "| bfloat16, bfloat16 reduction | 94.0% / 94.0% / 94.0% | 94.00% | -1.00 |" in met
    assert ("| 1,048,576 (4 MiB / 2 MiB) | one-shot, 2000 (10), 1.00 | one-shot, 1100 (10), 1.00 "
            "| 0.55 (0.50–0.60) | 820 / 811 |") in met
    missed = bf16_table(made_up_bf16_record((0.93, 0.94, 0.93)))  # -2, -1, -2: mean -1.67
    assert "missed (-1.67 points)" in missed


# ---------------------------------------------------------------------------
# On two ranks: what the reductions send, and in what dtype
# ---------------------------------------------------------------------------

def one_backward(model: nn.Module, rank: int, n: int, dtype: str) -> None:
    """A backward of this rank's shard of a fixed batch, the forward in ``dtype``."""
    ds = data_mod.synthetic(0)
    idx = data_mod.shard(torch.arange(64), rank, n)
    with training.autocast(Config(dtype=dtype)):
        loss = F.cross_entropy(model(ds.train.x[idx]), ds.train.y[idx], reduction="sum")
    (loss / 64).backward()


def reductions_in_bfloat16() -> dict:
    """Inside a rank: the same gradients reduced by every path, in float32 and in bfloat16; the
    bytes each sent (p2p.SENT_BYTES), the dtypes it kept, and what it computed."""
    from torch.nn.parallel import DistributedDataParallel

    from parallel.collectives.algorithms import all_reduce
    from parallel.collectives.zero import ZeroAdam
    from parallel.common.p2p import SENT_BYTES
    from parallel.dp.ddp import ddp_with_our_ring
    from parallel.dp.reducer import GradReducer

    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}

    def model() -> nn.Module:
        torch.manual_seed(0)
        return build_model(32, (48, 48), 10, "py")

    local = model()  # this rank's own gradients, before any reduction: the error bound needs them
    one_backward(local, rank, n, "bfloat16")
    out["local"] = {k: p.grad.clone() for k, p in local.named_parameters()}

    # The buckets (GradReducer), with our ring and with auto and the segmented ring behind them.
    for name, reduce in (("ring", None), ("auto", all_reduce),
                         ("segmented", lambda t, **kw: all_reduce(t, algorithm="segmented_ring", **kw))):
        for grad_dtype in (torch.float32, torch.bfloat16):
            m = model()
            kwargs = {"all_reduce": reduce} if reduce else {}
            reducer = GradReducer(list(m.parameters()), bucket_bytes=4096, grad_dtype=grad_dtype, **kwargs)
            before = SENT_BYTES["data"]
            one_backward(m, rank, n, "bfloat16")  # the buckets are sent during backward
            reducer.finish()
            key = f"{name} {str(grad_dtype).removeprefix('torch.')}"
            out[key] = {"bytes": SENT_BYTES["data"] - before, "buffers": {b.dtype for b in reducer.buffers},
                        "buckets": len(reducer.buffers),
                        "grads": {k: p.grad.clone() for k, p in m.named_parameters()}}
            reducer.close()

    # ZeRO: the reduce-scatter in bfloat16, the master shard, its moments and the gather in float32.
    for grad_dtype in (torch.float32, torch.bfloat16):
        m = model()
        opt = ZeroAdam(m.parameters(), lr=1e-3, grad_dtype=grad_dtype)
        one_backward(m, rank, n, "bfloat16")
        before = SENT_BYTES["data"]
        opt.step()
        key = f"zero {str(grad_dtype).removeprefix('torch.')}"
        out[key] = {"bytes": SENT_BYTES["data"] - before, "flat_grad": opt.flat_grad.dtype,
                    "shard": (opt.shard.dtype, opt.shard.grad.dtype), "params": {p.dtype for p in m.parameters()},
                    "moments": {v.dtype for v in opt.opt.state[opt.shard].values() if v.is_floating_point()},
                    "state_dict": float_dtypes(opt.state_dict()["state"]), "numel": opt.numel,
                    "weights": {k: v.detach().clone() for k, v in m.state_dict().items()}}

    # DDP, its buckets through our ring's hook in bfloat16, and through torch's recipe on gloo's
    # own all_reduce (bf16_compress_hook's: cast, divide in bfloat16, sum; the hook itself refuses
    # anything but NCCL and XCCL).
    def ddp_run(wrap) -> tuple[dict, int]:
        m = model()
        ddp = wrap(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        before = SENT_BYTES["data"]
        for _ in range(3):
            one_backward(ddp, rank, n, "float32")
            opt.step()
            opt.zero_grad()
        return {k: v.detach().clone() for k, v in m.state_dict().items()}, SENT_BYTES["data"] - before

    out["ddp float32"] = ddp_run(lambda m: ddp_with_our_ring(m, bucket_cap_mb=0.004))
    out["ddp bfloat16"] = ddp_run(lambda m: ddp_with_our_ring(m, grad_dtype=torch.bfloat16, bucket_cap_mb=0.004))

    # No annotations: under `from __future__ import annotations` they would be strings, which
    # register_comm_hook rejects.
    def torch_recipe(group, bucket):
        wire = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))
        dist.all_reduce(wire, group=group)
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(bucket.buffer().copy_(wire))
        return future

    def torch_hook(m: nn.Module) -> nn.Module:
        ddp = DistributedDataParallel(m, bucket_cap_mb=0.004)
        ddp.register_comm_hook(None, torch_recipe)
        return ddp
    out["ddp torch bf16"] = ddp_run(torch_hook)
    return out


@pytest.mark.slow
def test_gradients_reduced_in_bfloat16_send_half_the_bytes_and_come_back_float32():
    ranks = launch(reductions_in_bfloat16, 2, deadline_s=240)
    r0 = ranks[0]
    for name in ("ring", "auto", "segmented"):
        f32, b16 = r0[f"{name} float32"], r0[f"{name} bfloat16"]
        assert f32["buffers"] == {torch.float32} and b16["buffers"] == {torch.bfloat16}
        assert f32["buckets"] == b16["buckets"] > 1  # the same buckets: only the bytes change
        assert f32["bytes"] > 0 and b16["bytes"] * 2 == f32["bytes"], name
        for k, g in b16["grads"].items():
            assert g.dtype == torch.float32, k
            assert torch.equal(g, g.to(torch.bfloat16).float()), k  # what came back is a bfloat16 value
            # Each rank's gradient rounded once (by 2^-8 of it at most), then the sum rounded (by
            # 2^-8 of it): within 2^-7 of the summed magnitudes, however much the terms cancel.
            magnitude = sum(r["local"][k].abs() for r in ranks)
            error = (g - f32["grads"][k]).abs()
            assert (error <= 2 ** -7 * magnitude + 1e-9).all(), (name, k, (error / magnitude).max())
            assert not torch.equal(g, f32["grads"][k]), (name, k)  # and it was rounded
        for other in ranks[1:]:  # bit-identical on every rank
            for k, g in b16["grads"].items():
                assert torch.equal(other[f"{name} bfloat16"]["grads"][k], g), (name, k)

    z32, z16 = r0["zero float32"], r0["zero bfloat16"]
    assert z16["flat_grad"] == torch.bfloat16 and z32["flat_grad"] == torch.float32
    for z in (z32, z16):
        assert z["shard"] == (torch.float32, torch.float32) and z["params"] == {torch.float32}
        assert z["moments"] == {torch.float32} and z["state_dict"] == {torch.float32}
    # the reduce-scatter in half the bytes, the all-gather of the float32 parameters unchanged
    half = (z32["numel"] + 1) // 2 * 4  # a shard of float32 (padded), sent once each way at 2 ranks
    assert z32["bytes"] == 2 * half and z16["bytes"] == half // 2 + half
    for k, w in z16["weights"].items():
        torch.testing.assert_close(w, z32["weights"][k], rtol=1e-3, atol=1e-4, msg=k)
        assert all(torch.equal(other["zero bfloat16"]["weights"][k], w) for other in ranks[1:]), k

    (w32, bytes32), (w16, bytes16), (wt, _) = r0["ddp float32"], r0["ddp bfloat16"], r0["ddp torch bf16"]
    assert bytes16 * 2 == bytes32 > 0
    for k, w in w16.items():
        assert w.dtype == torch.float32
        torch.testing.assert_close(w, w32[k], rtol=1e-2, atol=1e-3, msg=k)
        # at 2 ranks dividing by n is exact in either dtype, and a sum of two operands rounds alike
        # in any order: torch's recipe gives the same bits
        assert torch.equal(w, wt[k]), k


# ---------------------------------------------------------------------------
# Training on two ranks
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_bfloat16_training_on_two_ranks_learns_with_either_reduction_and_with_zero():
    runs = {}
    for grad_dtype in ("float32", "bfloat16"):
        for zero in (False, True):
            config = Config(dtype="bfloat16", grad_dtype=grad_dtype, zero=zero, **QUICK)
            ranks = launch(train, 2, (config,), deadline_s=240)
            for other in ranks[1:]:
                for k, v in ranks[0]["state"].items():
                    assert torch.equal(other["state"][k], v), (grad_dtype, zero, k)
            runs[grad_dtype, zero] = ranks[0]
    for key, run in runs.items():
        losses = [e["loss"] for e in run["epochs"]]
        assert losses[1] < losses[0] and run["final_accuracy"] > 0.3, key
        assert float_dtypes(run["state"]) == {torch.float32}, key
    # ZeRO sums each element as the buckets do (one addition of two operands at 2 ranks): the
    # same training, up to how Adam's step rounds on a shard rather than on whole tensors
    for grad_dtype in ("float32", "bfloat16"):
        for k, v in runs[grad_dtype, True]["state"].items():
            torch.testing.assert_close(v, runs[grad_dtype, False]["state"][k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_a_zero_run_reduced_in_bfloat16_resumes_from_float32_state(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    config = {**QUICK, "dtype": "bfloat16", "grad_dtype": "bfloat16", "zero": True, "epochs": 2}
    straight = launch(train, 2, (Config(**config),), deadline_s=240)[0]
    launch(train, 2, (Config(**{**config, "epochs": 1}, checkpoint=ckpt),), deadline_s=240)
    saved = torch.load(ckpt, weights_only=True)
    assert float_dtypes(saved["model"]) == {torch.float32}
    assert float_dtypes(saved["optimizer"]["state"]) == {torch.float32}  # the gathered moments
    resumed = launch(train, 2, (Config(**config, checkpoint=ckpt, resume=True),), deadline_s=240)[0]
    for k, v in resumed["state"].items():
        assert v.dtype == torch.float32 and torch.equal(v, straight["state"][k]), k


# ---------------------------------------------------------------------------
# The benchmark, end to end on a small case
# ---------------------------------------------------------------------------

def small_bf16_bench(path: str, data_dir: str) -> dict:
    from pathlib import Path

    from parallel.collectives import precision

    precision.PRECISION_NUMELS, precision.PRECISION_ROUNDS, precision.PRECISION_SEEDS = [1 << 12], 6, 2
    config = Config(**{k: v for k, v in QUICK.items() if k not in ("return_state", "train_limit")}, world_size=2,
                    data="mnist", data_dir=data_dir)
    return precision.bf16(config, Path(path))


@pytest.mark.slow
def test_the_bf16_benchmark_measures_every_precision_and_writes_its_record(tmp_path):
    """On MNIST's file format (made up: the digits themselves are not needed to test the path)."""
    import json

    from mnist_files import make_mnist

    make_mnist(tmp_path, n_train=600, n_test=100)
    path = tmp_path / "bf16.json"
    launch(small_bf16_bench, 2, (str(path), str(tmp_path)), deadline_s=300)
    record = json.loads(path.read_text())
    assert record["data"] == "mnist" and record["parameters"] == 30 * 16 + 16 + 16 * 10 + 10  # 6×5 pixels
    assert {(r["dtype"], r["bytes"]) for r in record["allreduce"]} == {("float32", 4 << 12), ("bfloat16", 2 << 12)}
    assert all(r["time_us"] > 0 and r["add_us"] > 0 for r in record["allreduce"])
    assert [r["variant"] for r in record["step"]] == ["float32", "bfloat16, float32 reduction",
                                                      "bfloat16, bfloat16 reduction"]
    assert all(r["step_us"] > 0 and r["allreduce_in_step_us"] > 0 for r in record["step"])
    assert sorted((r["variant"], r["seed"]) for r in record["accuracy"]) == sorted(
        (v, s) for v in ("float32", "bfloat16, float32 reduction", "bfloat16, bfloat16 reduction") for s in (0, 1))
    assert all(0 <= r["test_accuracy"] <= 1 and r["final_loss"] > 0 for r in record["accuracy"])
    from parallel.collectives.precision import bf16_table

    assert "Goal, bfloat16 autocast with float32 reduction within 1 point" in bf16_table(record)
