"""What the parallel chapters share, so that none imports another for it: the training loop
and the Strategy interface it runs (training.py, walked through in chapter 7), the
point-to-point messages every collective is made of (p2p.py), the process launcher
(launch.py), the threads a rank runs (threads.py), the data sets and their sharding (data.py),
checkpoints (checkpoint.py), the record of a training run (runs.py) and the benchmarks'
harness (harness.py). Nothing here imports a chapter."""
