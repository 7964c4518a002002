"""The allocation ILP as HiGHS sees it: the columns kept, the rows, and the runs.

- `dominance`: templates that others dominate (`dominated_templates`): the most capacity a
  collection of templates fits in each node multiset, one vectorised step per multiset size.
- `formulation`: the allocation ILP's formulation: its variables (`add_variables`, see
  `solve/ilp.py` for what they stand for), one function per constraint family (`add_*_rows`), the
  arrays HiGHS is given (`LpArrays`), and the same problem seen as per-model covers tied by
  availability (`decomposition_of`, for `decomposition/lagrange.py` and
  `decomposition/branch_price.py`).
- `highs_runs`: hiGHS runs on the allocation ILP: one MILP run (`run_highs`), its LP relaxation with
  node prices and reduced costs (`lp_relaxation`), runs on a neighbourhood of columns
  (`run_on_support`), and the column bounds reduced costs allow (`fix_by_reduced_cost`), with the
  bound such a restricted run proves for the whole problem (`bound_with_limit`); and the HiGHS runs
  that follow branch and price on the cost problem (`highs_after_decomposition`).
- `root_bound`: HiGHS's bound on a whole ILP from a child process killed at a deadline
  (`RootBound`), where a run in this process would overrun the caller's time limit.
- `relax_fix`: relax-and-fix by model, a plan near an LP optimum where the ILP is too large
  for HiGHS's own search in the time limit (one model's columns integer at a time).
- `presolve`: presolve of the allocation ILP: the problem as arrays (`Index`), templates that others
  dominate (`dominated_templates`, remembered per template set), and the (template, region)
  columns the ILP keeps (`presolve_columns`) with the bounds that lose nothing.
"""
