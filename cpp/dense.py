"""Stage 2: the Dense layer as C++ ops (cpp/dense.cpp), made differentiable from Python.

Check it:  python grad_check.py cpp
"""

from __future__ import annotations

from pathlib import Path

import modes

HERE = Path(__file__).resolve().parent
BUILD = modes.load_extension("dense_cpp_ext", [HERE / "dense.cpp"])
dense = modes.register_dense_op("dense_cpp")
