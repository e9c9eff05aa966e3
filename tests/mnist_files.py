"""MNIST's files (the IDX format, plain or gzipped) made up for the tests: ``write_idx`` writes
one array, ``make_mnist`` a whole small data set whose label is written into each image, so
that the task is learnable. Shared by the tests that read, refuse or train on such files."""

from __future__ import annotations

import gzip
from pathlib import Path

import torch


def write_idx(path: Path, array: torch.Tensor, magic_type: int = 0x08, compress: bool = False) -> None:
    """`array` as an IDX file (its header: magic, element type, dimensions), gzipped if `compress`."""
    header = bytes([0, 0, magic_type, array.dim()]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    raw = header + array.to(torch.uint8).numpy().tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def make_mnist(folder: Path, n_train: int = 120, n_test: int = 40, shape=(6, 5), compress: bool = False) -> None:
    """train- and t10k- images and labels in `folder`, as MNIST names them, random but seeded."""
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = torch.randint(0, 10, (n,), generator=g)
        # the label is written into the image, so the task is learnable
        images = torch.randint(0, 50, (n, *shape), generator=g)
        images[:, 0, :] = (labels * 25).unsqueeze(1)
        suffix = ".gz" if compress else ""
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images, compress=compress)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", labels, compress=compress)
