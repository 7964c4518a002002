"""Plans robust to performance-model error (`coral plan --robust R`).

- `planner`: plans robust to performance-model error: `coral plan --robust R` (issue 22).
- `problem`: A robust allocation problem (`coral plan --robust R`, `planner.py`): the allocation
  problem and each column's capacity in every scenario (one GPU type slow), and what a plan serves
  in each scenario.
- `rating`: what a template column delivers when one GPU type is slower than modelled (`--robust
  R`).
- `starts`: plans that cover every scenario of a robust problem without proving anything: the starts
  `solve_robust` searches below, and the exhaustive oracle the tests compare it with.
"""
