"""Chapter 8's benchmark, run on every rank by ``distributed.py --bench tp``: one step of a
sequence-parallel MLP pair (D -> H -> D), its collectives overlapped with the GEMMs or not,
against torch's own tensor parallelism (parallelize_module) on the same weights.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from parallel.common.harness import every_rank, header, slowest_rank, write_record
from parallel.common.launch import world
from parallel.common.training import Config
from timing import Stats, measure

TP_VARIANTS = ("unoverlapped", "overlapped", "dtensor")
TP_SPLIT_STEPS = 10  # steps recorded (outside the timed ones) to split a step into comm and compute
_KINDS = ("compute", "comm")


def _tp_models(d: int, h: int, mode: str, seed: int) -> dict:
    """The same weights three ways: our sequence-parallel pair without and with overlap, and
    nn.Linear + sigmoid parallelised by torch (ColwiseParallel takes the batch-sharded input
    and all-gathers it, RowwiseParallel reduce-scatters its output along the batch)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from modes import Dense
    from parallel.tp.layers import ColumnParallelDense, RowParallelDense

    # region twins
    models = {}
    for name in ("unoverlapped", "overlapped"):
        torch.manual_seed(seed)
        pair = nn.Sequential(
            ColumnParallelDense(d, h, mode=mode, sequence_parallel=True, overlap=name == "overlapped"),
            RowParallelDense(h, d, mode=mode, sequence_parallel=True, overlap=name == "overlapped"))
        for layer in pair:
            layer.check = False  # shapes agreed by construction (and checked once below)
        models[name] = pair
    torch.manual_seed(seed)
    full = [Dense(d, h, mode=mode), Dense(h, d, mode=mode)]
    linears = [nn.Linear(d, h), nn.Linear(h, d)]
    with torch.no_grad():
        for lin, dense in zip(linears, full):
            lin.weight.copy_(dense.weight)
            lin.bias.copy_(dense.bias)
    torch_pair = nn.Sequential(linears[0], nn.Sigmoid(), linears[1], nn.Sigmoid())
    mesh = init_device_mesh("cpu", (world()[1],))
    models["dtensor"] = parallelize_module(torch_pair, mesh, {"0": ColwiseParallel(input_layouts=Shard(0)),
                                                              "2": RowwiseParallel(output_layouts=Shard(0))})
    return models
    # endregion


def _events_table(events: list[tuple[str, float, float]]) -> list[list[float]]:
    """A rank's timeline as rows (rank, kind, start s, end s), gathered from every rank."""
    n = world()[1]
    m = int(every_rank(torch.tensor(float(len(events)), dtype=torch.float64)).max().item())
    mine = torch.zeros(m, 3, dtype=torch.float64)
    for i, (kind, t0, t1) in enumerate(events):
        mine[i] = torch.tensor([_KINDS.index(kind) + 1, t0, t1], dtype=torch.float64)
    rows = every_rank(mine)
    return [[r, _KINDS[int(k) - 1], t0, t1] for r in range(n) for k, t0, t1 in rows[r].tolist() if k]


def tp(config: Config, json_path: str | None) -> None:
    """Time the same sequence-parallel MLP pair step three ways (see TP_VARIANTS)."""
    from parallel.tp.layers import Timeline

    if len(config.hidden) != 2:
        raise ValueError(f"--bench tp takes --hidden D,H (the pair D -> H -> D), got {list(config.hidden)}")
    rank, n = world()
    d, h = config.hidden
    if h % n or config.batch_size % n or config.batch_size < n:
        raise ValueError(f"--bench tp needs H ({h}) and --batch-size ({config.batch_size}) divisible by the "
                         f"world size {n}, as torch's tensor parallelism shards them evenly")
    g = torch.Generator().manual_seed(config.seed + rank)
    rows = config.batch_size // n
    x = torch.randn(rows, d, generator=g).requires_grad_()  # an inner layer: its input needs a gradient
    grad = torch.randn(rows, d, generator=g)
    models = _tp_models(d, h, config.mode, config.seed)

    def stepper(model):
        def run() -> None:
            model(x).backward(grad)
            for t in [x, *model.parameters()]:
                _settle(t.grad)  # torch's collectives may still be in flight: a step ends when they are done
                t.grad = None
        return run

    # The three compute the same thing: check once, with the shapes agreed (check=True).
    outs = {}
    for name, model in models.items():
        for layer in model if name != "dtensor" else ():
            layer.check = True
        outs[name] = model(x).detach()
        for layer in model if name != "dtensor" else ():
            layer.check = False
    for name in TP_VARIANTS[1:]:
        if not torch.allclose(outs[name], outs["unoverlapped"], rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"--bench tp: variant {name} computes another result than unoverlapped")

    fns = {name: stepper(models[name]) for name in TP_VARIANTS}
    stats = measure(fns, rounds=20, warmup=2, number=3, order="shuffle")
    slowest = {name: slowest_rank(s.samples) for name, s in stats.items()}

    # Where a step's time goes: our variants record every GEMM/elementwise call and every wait on
    # a collective; the medians over a few steps, the slowest rank's. torch's step is not
    # instrumented: its communication is timed alone (the same four collectives, gloo's), and its
    # computation is the same step's GEMMs on one rank with no communication.
    splits: dict[str, dict[str, float]] = {}
    timelines = {}
    for name in ("unoverlapped", "overlapped"):
        per_step: dict[str, list[float]] = {k: [] for k in (*_KINDS, "wall")}
        for i in range(TP_SPLIT_STEPS):
            dist.barrier()
            Timeline.start()
            start = time.perf_counter()
            fns[name]()
            per_step["wall"].append((time.perf_counter() - start) * 1e6)
            events = Timeline.stop()
            for k in _KINDS:
                per_step[k].append(sum(t1 - t0 for kind, t0, t1 in events if kind == k) * 1e6)
            if i == TP_SPLIT_STEPS - 1:
                timelines[name] = _events_table(events)
        # the slowest rank's medians; the share is per recorded step, of that step's own time
        share = [c / w for c, w in zip(per_step["comm"], per_step["wall"])]
        splits[name] = {"comm_us": max(slowest_rank([statistics.median(per_step["comm"])])),
                        "compute_us": max(slowest_rank([statistics.median(per_step["compute"])])),
                        "recorded_step_us": max(slowest_rank([statistics.median(per_step["wall"])])),
                        "comm_share": max(slowest_rank([statistics.median(share)]))}
    splits["dtensor"] = _torch_split(d, h, rows, n, config.seed)
    results = []
    for name, samples in slowest.items():
        ratios = [m / u for m, u in zip(samples, slowest["unoverlapped"])]
        results.append({"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                        "ratio_to_unoverlapped": statistics.median(ratios), "ratio_spread": Stats(ratios).spread,
                        **splits[name]})
    by = {r["variant"]: r for r in results}
    elem = 4
    record = {**header("tp", config.device), "mode": config.mode, "d": d, "h": h, "global_batch": rows * n,
              "bytes_per_collective": rows * n * d * elem,
              "comm_share_unoverlapped": by["unoverlapped"]["comm_share"],
              "overlapped_over_unoverlapped": by["overlapped"]["ratio_to_unoverlapped"],
              "overlapped_over_dtensor": statistics.median(
                  o / t for o, t in zip(slowest["overlapped"], slowest["dtensor"])),
              "results": results, "timeline": timelines,
              # the goals chapter 8 sets, judged on this run's paired medians
              "goals": {"comm_share_at_least_0.30": by["unoverlapped"]["comm_share"] >= 0.30,
                        "overlapped_at_most_0.85_of_unoverlapped": by["overlapped"]["ratio_to_unoverlapped"] <= 0.85,
                        "overlapped_no_slower_than_dtensor": statistics.median(
                            o / t for o, t in zip(slowest["overlapped"], slowest["dtensor"])) <= 1.0},
              "how": "comm_us/compute_us: ours, time inside collectives or blocked on a transfer, and in GEMMs and "
                     f"elementwise kernels, per step, medians of {TP_SPLIT_STEPS} recorded steps (recorded_step_us "
                     "is their own median time; comm_share the median of comm/step); dtensor, gloo's "
                     "all_gather_into_tensor + reduce_scatter_tensor "
                     "of the same tensors timed alone, and the same step's nn.Linear GEMMs on one rank alone"}
    write_record(record, json_path, tp_table(record))


def _settle(t: torch.Tensor | None) -> None:
    """Wait for a tensor that torch's functional collectives may still be computing."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    if isinstance(local, AsyncCollectiveTensor):
        local.wait()


def _torch_split(d: int, h: int, rows: int, n: int, seed: int) -> dict[str, float]:
    """torch's step, taken apart: the four collectives alone (gloo), the local compute alone."""
    import warnings

    from torch import nn

    full_x, part = torch.zeros(rows * n, d), torch.zeros(rows, d)

    def comm() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for _ in range(2):  # forward: gather x, scatter y; backward: gather dy, scatter dx
                dist.all_gather_into_tensor(full_x, part)
                dist.reduce_scatter_tensor(part, full_x)
    torch.manual_seed(seed)
    local = nn.Sequential(nn.Linear(d, h // n), nn.Sigmoid(), nn.Linear(h // n, d), nn.Sigmoid())
    xin = torch.randn(rows * n, d, requires_grad=True)
    gout = torch.randn(rows * n, d)

    def compute() -> None:
        local(xin).backward(gout)
        local.zero_grad(set_to_none=True)
        xin.grad = None
    stats = measure({"comm": comm}, rounds=10, warmup=1, number=3)
    comm_us = statistics.median(slowest_rank(stats["comm"].samples))
    compute_us = statistics.median(measure({"compute": compute}, rounds=10, warmup=1, number=3)["compute"].samples)
    return {"comm_us": comm_us, "compute_us": max(slowest_rank([compute_us]))}


def tp_table(record: dict) -> str:
    rows = ["| variant | step µs (IQR) | step / unoverlapped (paired; IQR) | communication µs | computation µs |",
            "|---|---:|---:|---:|---:|"]
    for r in record["results"]:
        spread = f" ({r['ratio_spread']:.3f})" if "ratio_spread" in r else ""  # a record may lack it
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | "
                    f"{r['ratio_to_unoverlapped']:.3f}{spread} | {r['comm_us']:.0f} | {r['compute_us']:.0f} |")
    rows.append(f"\nMLP pair {record['d']} → {record['h']} → {record['d']} (mode {record['mode']}), global batch "
                f"{record['global_batch']} split along the batch; communication "
                f"{100 * record['comm_share_unoverlapped']:.0f}% of the unoverlapped step; overlapped / dtensor "
                f"(paired) {record['overlapped_over_dtensor']:.3f}. Goals: "
                + "; ".join(f"{k.replace('_', ' ')}: {'met' if v else 'missed'}" for k, v in record["goals"].items())
                + f". {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


JOBS = {"tp": tp}
RENDERERS = {"tp": tp_table}
