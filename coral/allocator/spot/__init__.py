"""Spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances and keep each
model's demand covered with a stated probability.

- `ilp`: the spot planner's arrays and its chance-constrained ILP, solved by scenario generation.
- `market`: the spot planner's inputs: its options, the market of the pools a problem can use, the
  problem with spot copies of its columns (`spot_columns`), and that problem as the arrays the ILP
  and the repair read (`spot_arrays`).
- `planner`: spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances of any
  template and keep every model's demand covered with a stated probability.
- `repair`: plans that meet the spot risk target, found without the ILP: the naive spot plan
  repaired greedily (`repair`), and the failure sets a plan leaves a model short in (`uncovered`),
  which `spot_ilp.scenario_generation` adds to its relaxation.
- `risk`: the risk model of spot capacity: how likely each pool is down over a window, the failure
  scenarios a plan is judged on, and the exact shortfall probability of a given plan.
"""
