"""Checkpoints of a training run: written so that a crash never leaves half a file, read so
that a resumed run continues exactly the run that wrote it (the same model, the same data
order), or stops with one line saying why not.

A checkpoint holds the unsharded state (the model's state_dict and torch.optim.Adam's), whatever
the run sharded: ZeRO and tensor-parallel runs gather it first (each strategy's ``full_state``,
parallel/common/training.py), so a checkpoint resumes under any layout. ``config`` is the
training loop's Config (its seed, batch_size and data fix the data order).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed by this run."""


def save_checkpoint(path: str, model_state: dict, optimizer_state: dict, epoch: int, history: list,
                    signature: dict, config) -> None:
    """Rank 0 only. Written to a temporary file and renamed, so a crash never leaves half a file,
    and a failed write leaves no temporary file behind. ``model_state`` is the unsharded model's
    state_dict, ``optimizer_state`` torch.optim.Adam's."""
    state = {"format": 1, "signature": signature, "epoch": epoch, "history": history,
             "model": model_state, "optimizer": optimizer_state,
             "data_order": {"seed": config.seed, "batch_size": config.batch_size, "data": config.data,
                            "next_epoch": epoch},
             "rng": torch.get_rng_state()}
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write the checkpoint {path}: {e.strerror or e}") from None
        raise


# What a resumed run must share with the checkpoint, or it would train on other data.
DATA_ORDER_FLAGS = {"seed": "--seed", "batch_size": "--batch-size", "data": "--data"}


def _cause(e: Exception) -> str:
    """One line for why torch.load failed. Its weights-only loader wraps the cause (such as
    "Unsupported operand 103" for a file that is not a checkpoint) in a paragraph of advice."""
    text = str(e)
    found = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {line.strip()[:200]}"


def load_checkpoint(path: str, signature: dict, config=None) -> dict:
    """Read a checkpoint for --resume; raise CheckpointError unless this run (its model and,
    given ``config``, its data order) continues exactly what the checkpoint was written by."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"--resume: no checkpoint at {path}") from None
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint ({_cause(e)})") from e
    if not isinstance(state, dict) or state.get("format") != 1:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer")
    if state["signature"] != signature:
        raise CheckpointError(f"{path} was written for a different model: {state['signature']}; "
                              f"this run builds {signature}")
    if config is not None:
        saved = state.get("data_order", {})
        for key, flag in DATA_ORDER_FLAGS.items():
            if key in saved and saved[key] != getattr(config, key):
                raise CheckpointError(f"{path} was written with {flag} {saved[key]} but this run has {flag} "
                                      f"{getattr(config, key)}: resuming would train on a different data order; "
                                      f"use {flag} {saved[key]} or start without --resume")
    return state
