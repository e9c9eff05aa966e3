"""Train an MLP of Dense layers data-parallel, gradients averaged by our own ring all-reduce.

With no launcher around it, this starts --world-size local ranks itself (gloo on CPU).
Under torchrun (RANK and WORLD_SIZE set) it joins the world torchrun made, across machines too.

Examples:
  python distributed.py -m py                                   # 2 local ranks, synthetic data
  python distributed.py -m cpp --world-size 4 --epochs 3 --json run.json --plot run.png
  python distributed.py -m py --data mnist --data-dir ~/data/mnist --epochs 3
  python distributed.py -m py --epochs 4 --checkpoint ckpt.pt            # then, after a crash:
  python distributed.py -m py --epochs 4 --checkpoint ckpt.pt --resume
  python distributed.py -m cpp --world-size 4 --tp 2        # 2 data-parallel × 2 tensor-parallel ranks
  torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr HOST --master-port 29500 \\
      distributed.py -m py
  python distributed.py --bench allreduce --world-size 2 --json docs/results/allreduce_gloo_w2.json
  python distributed.py --bench step --json docs/results/step_gloo_w2.json
  python distributed.py --bench tp --world-size 2 --hidden 256,64 --batch-size 512
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

import modes
from parallel.data import DataError
from parallel.launch import LaunchError, launch, run_in_process_group
from parallel.trainer import CheckpointError, Config, plot, report, train


def parse_hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--hidden takes widths separated by commas, e.g. 128,128; got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"every hidden width must be at least 1, got {text!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Examples:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--mode", choices=modes.MODES, default="py", help="which Dense implementation")
    p.add_argument("--world-size", type=int, default=2, help="local ranks to start (ignored under torchrun)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when every rank has a GPU of its own, else gloo")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda for the cuda and ptx modes, else cpu")
    p.add_argument("--epochs", type=int, default=5, help="total epochs (--resume continues up to this)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size, split across ranks")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    p.add_argument("--hidden", type=parse_hidden, default=(128, 128), help="hidden widths, e.g. 256,128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=["synthetic", "mnist"], default="synthetic")
    p.add_argument("--data-dir", help="folder with MNIST's IDX files (raw or .gz); nothing is downloaded")
    p.add_argument("--checkpoint", metavar="PATH", help="written by rank 0 at the end of every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a rank waits for a silent peer")
    p.add_argument("--no-overlap", action="store_true", help="reduce gradients after backward, not during it")
    p.add_argument("--bucket-kb", type=int, default=25600, help="gradient bucket cap in KiB (DDP's default: 25 MiB)")
    p.add_argument("--json", metavar="PATH", help="write the run (or the benchmark) as JSON")
    p.add_argument("--plot", metavar="PATH", help="draw the loss and accuracy curves (needs matplotlib)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel size: the hidden layers are split across --tp ranks (world = dp × tp)")
    p.add_argument("--bench", choices=["allreduce", "step", "tp"],
                   help="instead of training: time our ring against dist.all_reduce, a training step against DDP, "
                        "or a tensor-parallel MLP step (hidden D,H: D -> H -> D) overlapped or not, against "
                        "torch's tensor parallelism")
    return p


def resolve(args: argparse.Namespace, world_size: int) -> tuple[Config, str]:
    """Pick device and backend, saying so when the obvious choice is not possible."""
    device = args.device if args.device != "auto" else ("cuda" if args.mode in ("cuda", "ptx") else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda (or mode {args.mode}) needs a GPU; this torch is {torch.__version__}")
    backend = args.backend
    if backend == "auto":
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = "nccl" if device == "cuda" and gpus >= local else "gloo"
        if device == "cuda" and backend == "gloo":
            print(f"{local} ranks share {gpus} GPU(s): NCCL needs one GPU per rank, so using gloo with the "
                  "gradients staged through host memory", file=sys.stderr)
    if backend == "nccl" and device != "cuda":
        raise SystemExit("--backend nccl needs CUDA tensors: use --device cuda (or mode cuda/ptx)")
    if args.resume and not args.checkpoint:
        raise SystemExit("--resume needs --checkpoint PATH")
    config = Config(mode=args.mode, world_size=world_size, backend=backend, device=device, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, hidden=args.hidden, seed=args.seed, data=args.data,
                    data_dir=args.data_dir, checkpoint=args.checkpoint, resume=args.resume, timeout=args.timeout,
                    overlap=not args.no_overlap, bucket_kb=args.bucket_kb, progress=sys.stdout.isatty())
    return config, backend


def check_tp(args: argparse.Namespace, world_size: int, config: Config) -> None:
    """Every --tp mistake, before any rank starts."""
    from parallel.tp import TPError, shard_sizes

    if args.bench == "tp":
        if config.device != "cpu":
            raise SystemExit("--bench tp runs on the CPU (gloo) only: its comm/compute split reads host clocks, "
                             "which see kernel launches, not kernels; use -m py or -m cpp")
        d_h = args.hidden
        if len(d_h) != 2 or d_h[1] % world_size or args.batch_size % world_size:
            raise SystemExit(f"--bench tp takes --hidden D,H (the pair D -> H -> D) with H and --batch-size "
                             f"divisible by the world size {world_size} (torch's tensor parallelism shards "
                             f"evenly); got --hidden {','.join(map(str, d_h))} --batch-size {args.batch_size}")
        return
    if args.tp < 1 or world_size % args.tp:
        raise SystemExit(f"--tp {args.tp} must divide the world size {world_size} (world = dp × tp)")
    try:
        for i, width in enumerate(args.hidden):
            shard_sizes(width, args.tp, f"hidden layer {i + 1}'s width")
    except TPError as e:
        raise SystemExit(f"--tp: {e}") from None
    if args.tp > 1 and config.device == "cuda" and config.backend == "gloo":
        raise SystemExit("--tp > 1 on CUDA needs the nccl backend (one GPU per rank): the sharded layers "
                         "send CUDA tensors, which gloo cannot")
    config.tp = args.tp


def run_and_report(config: Config, json_path: str | None, plot_path: str | None) -> dict:
    """One rank's whole job: train, then rank 0 writes the JSON and the plot."""
    result = train(config)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        record = report(config, result, config.backend)
        print(f"test accuracy {100 * result['final_accuracy']:.1f}%", flush=True)
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
        if plot_path:
            plot(record, plot_path)
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world_size = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.world_size
    if world_size < 1 or args.epochs < 1 or args.batch_size < 1:
        raise SystemExit("--world-size, --epochs and --batch-size must be at least 1")
    reason = modes.available()[args.mode]
    if reason is not None:
        raise SystemExit(f"mode {args.mode!r} is not available here: {reason}")
    config, backend = resolve(args, world_size)
    check_tp(args, world_size, config)

    if args.bench:
        from parallel import bench

        job, job_args = bench.JOBS[args.bench], (config, args.json)
    else:
        job, job_args = run_and_report, (config, args.json, args.plot)
    try:
        if under_torchrun:
            run_in_process_group(job, job_args, backend, args.timeout)
        else:
            launch(job, world_size, job_args, backend=backend, timeout_s=args.timeout)
    except (LaunchError, CheckpointError, DataError) as e:
        print(f"distributed.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
