"""The record of a training run: the JSON rank 0 writes, its Markdown table (docs/render.py's
"run" kind) and its plot.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys

import torch


def report(config, result: dict, backend: str) -> dict:
    """The JSON record of a run (written by rank 0)."""
    gpu = {}
    if config.device == "cuda":
        import record_info  # the one description of a GPU (name, SMs, clocks, driver)

        gpu = {"gpu": record_info.describe_gpu()}
    return {
        "device": config.device, **gpu, "torch": torch.__version__, "backend": backend,
        "world_size": config.world_size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python distributed.py " + " ".join(sys.argv[1:]),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()
                   if k not in ("return_state", "progress", "train_limit")},
        "epochs": result["epochs"], "final_accuracy": result["final_accuracy"],
    }


def table(record: dict) -> str:
    """A Markdown table of a run's JSON record (docs/render.py puts it into the READMEs)."""
    rows = ["| epoch | training loss | validation accuracy | samples/s | communication s |",
            "|---:|---:|---:|---:|---:|"]
    for e in record["epochs"]:
        rows.append(f"| {e['epoch']} | {e['loss']:.4f} | {100 * e['accuracy']:.1f}% | {e['samples_per_s']:.0f} "
                    f"| {e['comm_s']:.2f} |")
    c = record["config"]
    ranks = f"{record['world_size']} ranks" + (f" (tp {c['tp']})" if c.get("tp", 1) > 1 else "")
    on = f" sharing one {record['gpu']['device']}" if "gpu" in record and record["world_size"] > 1 else (
        f" on an {record['gpu']['device']}" if "gpu" in record else "")
    mode = c["mode"] + ("" if c.get("dtype", "float32") == "float32" else f", {c['dtype']} autocast")
    if c.get("grad_dtype", "float32") != "float32":
        mode += f", gradients summed in {c['grad_dtype']}"
    rows.append(f"\nTest accuracy {100 * record['final_accuracy']:.1f}%. {c['data']} data, mode {mode}, "
                f"hidden {c['hidden']}, global batch {c['batch_size']}, {ranks}{on} on {record['backend']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def plot(record: dict, path: str) -> None:
    from record_info import pyplot

    plt = pyplot()
    epochs = [e["epoch"] for e in record["epochs"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    a.plot(epochs, [e["loss"] for e in record["epochs"]], marker="o")
    a.set_xlabel("epoch")
    a.set_ylabel("training loss")
    b.plot(epochs, [100 * e["accuracy"] for e in record["epochs"]], marker="o", color="tab:green")
    b.set_xlabel("epoch")
    b.set_ylabel("validation accuracy (%)")
    c = record["config"]
    fig.suptitle(f"{c['data']}, mode {c['mode']}, {record['world_size']} ranks on {record['backend']}; "
                 f"test accuracy {100 * record['final_accuracy']:.1f}%", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
