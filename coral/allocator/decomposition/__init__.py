"""The allocation problem decomposed by model: exact per-model covers, the Lagrangian bound that
prices nodes out, and branch and price over it.

- `branch_price`: exact search over the decomposition: branch and price, with a pattern-mixing
  heuristic.
- `knapsack`: one model on its own: the bounded covering knapsack, solved exactly.
- `lagrange`: A strong lower bound for the coupled allocation problems, by pricing out nodes.
- `pd_cover`: one model on its own when it may be served by prefill/decode (PD) pairs: the cheapest
  cover.
- `plan_search`: plans for the decomposition of `lagrange.py` without a search tree: the primal side
  of branch and price (`branch_price.py`), also run on their own by the allocator's solve
  (`solve/ilp.py`) and its scarcity phases (`scarcity/phases.py`).
"""
