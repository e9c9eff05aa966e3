"""The whole idea of chapter 7 on one screen: a ring all-reduce and a training loop that uses it.

The ring: n ranks, each sends to its right neighbour and receives from its left. Cut the tensor
into n chunks. In n − 1 reduce-scatter steps every rank passes a partial sum on and adds the one
it receives, until rank r holds the complete sum of chunk r + 1. In n − 1 all-gather steps the
complete chunks travel round the ring once more, until every rank has all of them. Each rank
sends 2(n − 1)/n of the tensor, whatever n is.

The loop: every rank holds the same model, takes its part of each global batch, and sums the
gradients with the ring before the optimiser's step, so that every rank takes the step one
process would take on the whole batch.

parallel/dp/ring.py is the ring the rest of the project uses; its docstring says what it adds
to this one, and why.

Examples:
  python -m parallel.dp.simple              # 2 ranks (CPU processes, gloo), then one process: the same weights
  python -m parallel.dp.simple --ranks 3    # chunks of uneven sizes
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


def ring_all_reduce(t: Tensor) -> Tensor:
    """Sum ``t`` (a contiguous CPU tensor, the same shape on every rank) over all ranks, in place."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = t.view(-1).tensor_split(n)  # n views of t; their sizes differ by one element at most
    inbox = torch.empty_like(chunks[0])  # chunk 0 is a largest one

    def step(send: Tensor, recv: Tensor) -> None:
        """Send one chunk to the right while receiving one from the left."""
        requests = [dist.isend(send, right), dist.irecv(recv, left)]  # post both, then wait
        for r in requests:
            r.wait()

    # Reduce-scatter: at step s, pass on partial sum (rank − s), add the left's (rank − s − 1).
    for s in range(n - 1):
        mine = chunks[(rank - s - 1) % n]
        received = inbox[: mine.numel()]
        step(chunks[(rank - s) % n], received)
        mine += received
    # Now chunk (rank + 1) holds the sum of every rank's. All-gather: at step s, pass on
    # complete chunk (rank + 1 − s) and receive complete chunk (rank − s) into its place.
    for s in range(n - 1):
        step(chunks[(rank + 1 - s) % n], chunks[(rank - s) % n])
    return t


def train(steps: int = 20, batch_size: int = 64, lr: float = 0.1, seed: int = 0,
          all_reduce: Callable[[Tensor], object] = ring_all_reduce) -> nn.Module:
    """Data-parallel SGD on a small MLP over whatever ranks there are (one, without a process
    group); returns the trained model. ``all_reduce`` sums a tensor over the ranks in place."""
    from parallel.common.data import shard, synthetic

    rank, n = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    data = synthetic(seed).train
    # region loop
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.Sigmoid(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    for i in range(steps):
        batch = order[i * batch_size: (i + 1) * batch_size]  # the same global batch on every rank
        mine = shard(batch, rank, n)                         # this rank's part of it
        loss = F.cross_entropy(model(data.x[mine]), data.y[mine], reduction="sum") / len(batch)
        loss.backward()  # this rank's share of the gradient of the global batch's mean loss
        for p in model.parameters():
            all_reduce(p.grad)  # summed over the ranks: the whole batch's gradient, on every rank
        opt.step()
        opt.zero_grad()
    # endregion
    return model


def _weights(steps: int) -> list[Tensor]:
    return [p.detach() for p in train(steps).parameters()]


def main(argv: list[str] | None = None) -> int:
    import cli
    from parallel.common.launch import launch

    parser = cli.parser(__doc__)
    parser.add_argument("--ranks", type=cli.positive(int), default=2, help="local ranks (default 2)")
    parser.add_argument("--steps", type=cli.positive(int), default=20, help="SGD steps (default 20)")
    args = parser.parse_args(argv)
    ranks, alone = launch(_weights, args.ranks, (args.steps,)), _weights(args.steps)
    worst = max((a - b).abs().max().item() for mine in ranks for a, b in zip(mine, alone))
    same = worst <= 1e-5  # float32 sums in another order: rounding apart, no more
    print(f"{args.ranks} ranks, {args.steps} steps of the global batch: every rank's weights within {worst:.1e} "
          f"of one process's ({'the same training' if same else 'NOT the same training'})")
    return 0 if same else 1


if __name__ == "__main__":
    import cli

    cli.run(main)
