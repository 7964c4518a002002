"""When the demand cannot be met in full: the goodput phases, the fair objective and the paper's
uniform-scale rule.

- `fair`: the fair scarcity objective (`AllocationProblem.scarcity == "fair"`, the default): when
  the demand cannot be met in full, three phases on the allocation ILP's rows, each a lexicographic
  step with its own proven gap.
- `fair_pairs`: neighbourhoods of a fair phase's plan by pairs of models (HiGHS on two models'
  columns, the others held at the plan), for problems too large for one run on every column.
- `fair_search`: plans for the fair scarcity phases (`fair.py`) without a solver: HiGHS on a max-min
  objective gets no guidance from reduced costs (only `t` is priced) and finds good plans slowly, so
  each phase starts from one of these.
- `phases`: the scarcity phases of the allocation ILP, when the demand cannot be met in full: phase
  1 the most priority-weighted goodput, phase 2 the cheapest plan at it (the rows are
  `solve/ilp.py`'s).
- `uniform_scale`: the paper's scarcity rule: a planner that cannot meet demand is judged at the
  largest uniform scale of every model's arrival rate that it can meet.
"""
