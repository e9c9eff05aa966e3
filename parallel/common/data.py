"""Data for the training examples: a synthetic task, MNIST's IDX files, and sharding.

Everything is a pair of tensors (features float32 (N, D), labels int64 (N,)) held in memory:
the data sets here are small, and it keeps the data order easy to reason about.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor


@dataclass
class Split:
    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Dataset:
    train: Split
    val: Split    # held out from the training files: the per-epoch accuracy
    test: Split   # the test files: the final accuracy
    classes: int

    @property
    def features(self) -> int:
        return self.train.x.shape[1]


def snap(x: Tensor) -> Tensor:
    """float64 -> float32 through a 2^-16 grid, so that the data is the same bit for bit in
    every process. A GEMM or a reduction may round its last bit differently from one call to
    the next (MKL picks code paths by memory alignment); float64 keeps those differences far
    below the grid, so no value lands on the other side of a grid point. Ranks that build the
    data themselves, and a run resumed from a checkpoint, then see identical inputs.
    """
    return (torch.round(x * 65536.0) / 65536.0).float()


# ---------------------------------------------------------------------------
# Synthetic: learnable by a small MLP, but not by a linear model
# ---------------------------------------------------------------------------

def synthetic(seed: int = 0, n_train: int = 16000, n_test: int = 2000, features: int = 32,
              classes: int = 10, clusters_per_class: int = 5, latent: int = 8) -> Dataset:
    """Gaussian clusters in a small latent space, several per class, pushed through a fixed
    random nonlinear map into ``features`` dimensions. Classes interleave (no linear
    boundary separates them) and overlap a little (no model reaches 100%). Deterministic
    from ``seed``; no files.
    """
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes * clusters_per_class, latent, generator=g) * 2.0
    lift = torch.randn(latent, features, generator=g) / math.sqrt(latent)
    mix = torch.randn(features, features, generator=g) / math.sqrt(features)

    def sample(n: int) -> Split:
        cluster = torch.randint(len(centres), (n,), generator=g)
        z = (centres[cluster] + 0.5 * torch.randn(n, latent, generator=g)).double()
        h = z @ lift.double()
        x = torch.tanh(h) + 0.3 * torch.sin(h @ mix.double())
        return Split(snap((x - x.mean(0)) / x.std(0)), (cluster % classes).long())

    train, test = sample(n_train), sample(n_test)
    n_val = n_train // 10
    return Dataset(Split(train.x[n_val:], train.y[n_val:]), Split(train.x[:n_val], train.y[:n_val]), test, classes)


# ---------------------------------------------------------------------------
# MNIST: the IDX format, read and checked
# ---------------------------------------------------------------------------

IDX_TYPES = {0x08: torch.uint8}  # MNIST's files are all unsigned bytes
CLASSES = 10                     # the digits: a label file holds 0-9 and nothing else
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


class DataError(ValueError):
    """A data file is missing, truncated or not what it claims to be."""


def read_idx(path: Path) -> Tensor:
    """Read one IDX file (raw or .gz): magic 0x0000TTNN (type TT, NN dimensions), NN
    big-endian uint32 sizes, then the values. Any size the header declares is accepted.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read it ({e})") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: bad magic number {raw[:4].hex() or '(empty file)'}; not an IDX file")
    if raw[2] not in IDX_TYPES:
        raise DataError(f"{path}: IDX value type 0x{raw[2]:02x} is not supported (only unsigned bytes, 0x08)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"{path}: header declares {ndim} dimensions but the file ends at byte {len(raw)}")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + math.prod(dims)
    if len(raw) != expected:
        raise DataError(f"{path}: header declares shape {tuple(dims)} ({expected} bytes in all) "
                        f"but the file has {len(raw)} bytes")
    if math.prod(dims) == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(dims, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    raise DataError(f"{folder / stem}[.gz] not found: --data-dir must hold MNIST's four IDX files "
                    f"({', '.join(n for pair in FILES.values() for n in pair)}); nothing is downloaded")


def _load_split(folder: Path, which: str) -> Split:
    img_path, lbl_path = (_find(folder, stem) for stem in FILES[which])
    images, labels = read_idx(img_path), read_idx(lbl_path)
    if images.dim() < 2:
        raise DataError(f"{img_path}: images need at least 2 dimensions (count, pixels...), got {images.dim()}")
    if labels.dim() != 1:
        raise DataError(f"{lbl_path}: labels need 1 dimension, got shape {tuple(labels.shape)}")
    if len(images) == 0:
        raise DataError(f"{img_path} holds zero images")
    if len(images) != len(labels):
        raise DataError(f"{img_path} holds {len(images)} images but {lbl_path} holds {len(labels)} labels")
    bad = labels >= CLASSES
    if bad.any():
        first = int(bad.nonzero()[0, 0])
        raise DataError(f"{lbl_path}: label {int(labels[first])} at index {first} is not a digit 0-{CLASSES - 1} "
                        f"({int(bad.sum())} such labels); MNIST has {CLASSES} classes")
    x = images.reshape(len(images), -1).double() / 255.0
    return Split(x, labels.long())


def mnist(folder: str | Path, seed: int = 0, val_fraction: float = 1 / 12) -> Dataset:
    """MNIST from its IDX files in ``folder``; the validation split is held out of train."""
    folder = Path(folder)
    train, test = _load_split(folder, "train"), _load_split(folder, "test")
    if train.x.shape[1] != test.x.shape[1]:
        raise DataError(f"train images have {train.x.shape[1]} pixels but test images {test.x.shape[1]}")
    mean, std = train.x.mean(), train.x.std().clamp_min(1e-6)
    train.x, test.x = snap((train.x - mean) / std), snap((test.x - mean) / std)
    classes = CLASSES
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(len(train) * val_fraction)) if len(train) > 1 else 0
    val, rest = order[:n_val], order[n_val:]
    return Dataset(Split(train.x[rest], train.y[rest]), Split(train.x[val], train.y[val]), test, classes)


# ---------------------------------------------------------------------------
# The data order: one permutation per epoch, every global batch split across ranks
# ---------------------------------------------------------------------------

def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[Tensor]:
    """The global batches of one epoch: a permutation from (seed, epoch), cut in order.

    Every rank computes the same list, so nothing about the order has to be sent; a
    resumed run recomputes it from the epoch number. The last batch may be smaller.
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return list(order.split(batch_size))


def shard(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """This rank's disjoint, contiguous part of a global batch (sizes differ by at most 1)."""
    return torch.tensor_split(batch, world_size)[rank]
