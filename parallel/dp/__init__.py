"""Chapter 7, data parallelism (README.md). Read the code in this order: simple.py (a ring
all-reduce and a training loop, whole on one screen), ring.py (the ring as the rest of the
project uses it, its messages sent through ../common/p2p.py), reducer.py (gradient buckets
reduced during backward), ../common/training.py (the training loop every chapter shares) with
trainer.py (plain data parallelism, the strategy that loop runs), ddp.py (the same ring driven
by torch's DistributedDataParallel), trace.py (when each bucket was ready and reduced, as a
figure); bench.py times a step against DDP; figures.py draws simple.py's ring, step by step."""
