"""The best pipeline over every node of a combination under the step model, and the bound that cuts
a library before searching.

- `bound`: A true upper bound on the step-model rate of any pipeline over every node of a
  combination (`placement_step`), for a library's cut before searching.
- `cover`: feasibility at thresholds for the step-model search (`placement_step`): do all the nodes
  of a combination form `S` stages covering the model's `L` layers with every node's time within
  `(A, C)` (and its mean step time within `H`)?
- `rows`: the rows of the step-model search (`placement_step`), shared by a library's combinations.
- `search`: the best pipeline over every node of a combination, under the step model it runs by.
- `stage_groups`: how a node type's nodes split into the stages of one pipeline (`placement_step`).
"""
