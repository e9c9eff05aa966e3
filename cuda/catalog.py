"""What cuda/dense_kernels.h declares, read as text: the GEMM versions (id, element types, idea) and
the autotuning candidates. No torch, no compiler: every script, the GPU plan's --list in any Python
included, reads the versions from here, and the header stays their one source.

    >>> import catalog                       # (cuda/ on sys.path, or load it by file)
    >>> [v.id for v in catalog.versions()][:3]
    [0, 1, 2]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = HERE / "dense_kernels.h"
DTYPES = ("f32", "f64", "bf16", "f16")  # dense_kernels::kDTypeNames, in DType order
TUNE_FIELDS = ("bm", "bn", "bk", "wm", "wn", "tm", "tn", "min_blocks")
TUNE_BASE_NAME = "kTuneBase"

_STRING = r'"((?:[^"\\]|\\.)*)"'
_VERSION = re.compile(r"\{\s*(\d+)\s*,\s*" + _STRING + r"\s*,\s*" + _STRING + r"\s*\}")
_CANDIDATE = re.compile(r"^\s*X\((\d+)((?:,\s*\d+){8})\)\s*/\*\s*(.*?)\s*\*/", re.M)


@dataclass(frozen=True)
class Version:
    id: int
    dtypes: tuple[str, ...]  # "f32", "f64", "bf16", "f16": the element types it is built for
    idea: str


@dataclass(frozen=True)
class Candidate:
    index: int
    shape: tuple[int, ...]  # BM, BN, BK, WM, WN, TM, TN, MINB (TUNE_FIELDS)
    why: str
    version: int            # the "version" launch_gemm runs it as: kTuneBase + index

    @property
    def threads(self) -> int:
        bm, bn, _, wm, wn = self.shape[:5]
        return (bm // wm) * (bn // wn) * 32


def _text(header: Path | None) -> str:
    return (header or HEADER).read_text()


def _block(text: str, start: str, end: str) -> str:
    if start not in text:
        raise ValueError(f"{HEADER.name} has no {start!r}")
    return text.split(start, 1)[1].split(end, 1)[0]


def versions(header: Path | None = None) -> list[Version]:
    """Every GEMM version of kVersionInfo, 0 (automatic) first, in the header's order."""
    block = _block(_text(header), "constexpr VersionInfo kVersionInfo[] = {", "};")
    found = [Version(int(i), tuple(d.split()), idea) for i, d, idea in _VERSION.findall(block)]
    for v in found:
        unknown = set(v.dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(f"version {v.id} lists unknown element types {sorted(unknown)}")
    if not found or found[0].id != 0:
        raise ValueError(f"{HEADER.name}'s kVersionInfo must start with version 0")
    return found


def version_ids(header: Path | None = None, dtype: str | None = None) -> list[int]:
    """The ids of the versions (0 excluded), those built for `dtype` if given."""
    return [v.id for v in versions(header) if v.id != 0 and (dtype is None or dtype in v.dtypes)]


def cuda_core_versions(header: Path | None = None) -> list[int]:
    """Chapter 3's progression, 1 to kVersions."""
    count = int(re.search(r"constexpr int kVersions = (\d+);", _text(header)).group(1))
    return list(range(1, count + 1))


def idea(version: int, header: Path | None = None) -> str:
    for v in versions(header):
        if v.id == version:
            return v.idea
    raise KeyError(f"no GEMM version {version} in {HEADER.name}")


def candidates(header: Path | None = None) -> list[Candidate]:
    """The autotuning candidates, from the one list DENSE_TUNE_CANDIDATES."""
    text = _text(header)
    base = int(re.search(rf"constexpr int {TUNE_BASE_NAME} = (\d+);", text).group(1))
    block = _block(text, "#define DENSE_TUNE_CANDIDATES(X)", "\n#define")
    found = [Candidate(int(i), tuple(int(x) for x in rest.split(",")[1:]), why, base + int(i))
             for i, rest, why in _CANDIDATE.findall(block)]
    if [c.index for c in found] != list(range(len(found))):
        raise ValueError(f"{HEADER.name}'s DENSE_TUNE_CANDIDATES must number its candidates 0, 1, 2...")
    return found
