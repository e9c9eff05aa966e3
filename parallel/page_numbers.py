"""The numbers in the sentences of chapters 7 and 8 (the READMEs under parallel/), by the names its number markers
give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed
from the record or the source that backs it."""

from __future__ import annotations

from collections.abc import Callable

NUMBERS: dict[str, Callable[[], str]] = {}
