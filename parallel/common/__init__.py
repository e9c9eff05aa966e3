"""Plumbing the parallel chapters share, none of which is a lesson of its own: the process
launcher (launch.py), the threads a rank runs (threads.py), the data sets and their sharding
(data.py), checkpoints (checkpoint.py), the record of a training run (runs.py) and the
benchmarks' harness (harness.py)."""
