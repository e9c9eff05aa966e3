"""The numbers in the sentences of chapter 1 (py/README.md), by the names their number
markers give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each
computed from the record or the source that backs it."""

from __future__ import annotations

from collections.abc import Callable

NUMBERS: dict[str, Callable[[], str]] = {}
