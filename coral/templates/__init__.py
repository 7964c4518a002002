"""Serving templates: the best SLO-feasible placement of a model on each node combination.
Sub-packages, lowest first (`tests/test_layers.py` holds the order): `types`, `slo` -> `space` ->
`template`, `placement`, `step` -> `builder`.

- `builder/`: template libraries: one combination's solve, a whole library's build, its store on
  disk, and the pools that run the solves.
- `placement/`: the exact placement solvers of each topology, their shared preparation, and the
  independent checks of their answers.
- `space/`: the space a library is built over: node combinations, modes, topologies, batches,
  serving engines, and what one node can do at each point.
- `step/`: the best pipeline over every node of a combination under the step model, and the bound
  that cuts a library before searching.

- `slo`: latency SLO and workload mix of one model: what a serving template must meet.
- `template`: A serving template: one model on one node multiset, and what it delivers.
- `types`: data passed between the template stages: problem, operating points, solved template.
"""
