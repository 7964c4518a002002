"""Online allocation: how many instances of each serving template to run in each region.
Sub-packages, lowest first (`tests/test_layers.py` holds the order): `problem` -> `kernels`, `plan`,
`scenario` -> `decomposition` -> `core` -> `scarcity` -> `solve` -> `spot`, `robust`. Planning a
scenario end to end (template libraries, the allocation in each mode, the baselines beside it,
re-plans over a timeline) is `coral.planning`, the layer above.

- `core/`: the allocation ILP as HiGHS sees it: the columns kept, the rows, and the runs.
- `decomposition/`: the allocation problem decomposed by model: exact per-model covers, the
  Lagrangian bound that prices nodes out, and branch and price over it.
- `kernels/`: the allocator's compiled loops (numba), compiled once per install by `jit`.
- `plan/`: the plan file: its format, its decoded instances and its check.
- `robust/`: plans robust to performance-model error (`coral plan --robust R`).
- `scarcity/`: when the demand cannot be met in full: the goodput phases, the fair objective and the
  paper's uniform-scale rule.
- `scenario/`: scenario files: their schema, their checks against the catalog, and the problems they
  give.
- `solve/`: the allocation ILP's solve (`solve_allocation`), the plans it starts from, and the
  exhaustive oracle it is tested against.
- `spot/`: spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances and keep
  each model's demand covered with a stated probability.

- `problem`: the online allocation problem and its answer, as plain numbers.
"""
