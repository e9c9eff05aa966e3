"""Training the Dense layer on several processes: chapters 7, 7 continued and 8.

    parallel/dp/            chapter 7: data parallelism (README.md, then simple.py, ring.py,
                            reducer.py, trainer.py, ddp.py)
    parallel/collectives/   chapter 7, continued: other all-reduce algorithms, their cost model,
                            ZeRO (README.md, then algorithms.py, costmodel.py, zero.py)
    parallel/tp/            chapter 8: tensor parallelism (README.md, then layers.py, training.py)
    parallel/common/        what the three share: the training loop and the Strategy it runs
                            (training.py), the point-to-point messages every collective is made
                            of (p2p.py), the process launcher, the data, checkpoints, the
                            benchmarks' harness

A chapter imports only from common/ and from the chapters before it (dp, then collectives,
then tp); common/ imports no chapter. distributed.py, outside the package, puts them together.

The names a reader uses most are importable from here too:

    from parallel import ring_all_reduce, ColumnParallelDense, RowParallelDense

They are looked up on first use, so that ``python -m parallel.collectives.costmodel --help``
does not wait for torch to import.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "ring_all_reduce": "parallel.dp.ring", "ring_reduce_scatter": "parallel.dp.ring",
    "ring_all_gather": "parallel.dp.ring", "RingError": "parallel.common.p2p",
    "GradReducer": "parallel.dp.reducer", "all_reduce": "parallel.collectives.algorithms",
    "ZeroAdam": "parallel.collectives.zero",
    "ColumnParallelDense": "parallel.tp.layers", "RowParallelDense": "parallel.tp.layers",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'parallel' has no attribute {name!r}")


def renderers() -> dict:
    """Marker kind -> Markdown renderer, for docs/render.py: every table the three chapters show."""
    from parallel.collectives import bench as collectives_bench
    from parallel.collectives import costmodel
    from parallel.common import runs
    from parallel.dp import bench as dp_bench
    from parallel.tp import bench as tp_bench
    from parallel.tp import report as tp_report

    return {"run": runs.table, **dp_bench.RENDERERS, **collectives_bench.RENDERERS, **tp_bench.RENDERERS,
            "tpbytes": tp_report.bytes_table, **costmodel.RENDERERS}
