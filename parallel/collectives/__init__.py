"""Chapter 7, continued: collectives, a cost model, ZeRO (README.md). Read the code in this
order: algorithms.py (all-reduce by recursive doubling, halving-doubling, one-shot, two-shot, a
segmented ring, and ``auto``, which picks by size), costmodel.py (the α-β-γ model that picks,
fitted on this machine: alphabeta_gloo.json), cpp_loop.py with segmented_ring.cpp (the same
loop without the interpreter), zero.py (Adam's state sharded over the ranks,
ZeroRedundancyOptimizer beside it, and ZeRO, the training loop's strategy); bench.py holds the
benchmarks, ionice.py and repeat.py the gloo-thread experiments, figures.py draws the chapter's figures."""
