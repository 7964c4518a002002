"""The exact placement solvers of each topology, their shared preparation, and the independent
checks of their answers.

- `chain`: exact placement for the `chain` topology, and the exact best split into replicas for
  `flow`.
- `exact`: front door of the placement solvers: the exact method of each topology.
- `exhaustive`: brute-force placement oracle for tiny problems (a check on the MILP and the chain
  DP).
- `ilp`: placement MILP (Helix's max-flow placement with exact path-latency SLOs), built for HiGHS.
- `milp`: the placement MILP's machinery: the column/row builder handed to HiGHS at once, the solve
  and readout shared by both builds (`MilpBase`), and the naive build — the formulation written down
  directly, the benchmark baseline of the tightened one (`placement_ilp.TightMilp`).
- `node_memo`: per-node preprocessing, memoised across the combinations of a library.
- `path_lp`: an upper bound on a combination's throughput for the flow and DAG topologies: the path
  LP.
- `prep`: what the placement solvers share: each node's usable operating points, and candidate
  answers as placements.
- `verify`: independent re-check of a solved `Placement` against its `PlacementProblem`.
"""
