"""The allocator's compiled loops (numba), compiled once per install by `jit`.

- `arrays`: array helpers of the allocator's compiled kernels (numba, `jit.py`): searches in sorted
  arrays, a stable sort, growing buffers and a heap's sift, written as loops so that the kernels
  that call them compile without numpy's sorting and slicing machinery (which costs seconds of
  compilation; see "Cold start of the allocator" in `benchmarks/results/allocator.md`).
- `jit`: compiling the allocator's hot loops with numba, once per install, never inside a solve.
- `knapsack_kernel`: compiled loops of the per-model knapsack (`decomposition/knapsack.py`): the
  items by ratio, the LP optimum, the quick solutions and reduced-cost fixing.
- `knapsack_programme`: the per-model knapsack's Pareto-state programme, compiled (numba, `jit.py`):
  after `knapsack_kernel.fix` leaves few free units, steps over the groups of free items of equal
  capacity, keeping after each the states no other beats on both counts (capacity, cost) and whose
  LP bound can still beat the best cover found (`decomposition/knapsack.py` states the method).
- `pd_cover_kernel`: compiled loops of the PD cover (`decomposition/pd_cover.py`): one group's
  frontier, two frontiers' sums, and the least cost of completing a state.
"""
