"""The space a library is built over: node combinations, modes, topologies, batches, serving
engines, and what one node can do at each point.

- `engines`: serving engines as restrictions of the template space (docs/design.md, "Two stages":
  serving engines).
- `enumerate`: node combinations a model's templates are solved on: multisets of node types.
- `grid`: the grid a template library is built over, and the checks of what a caller asks for: the
  serving modes, the placement topologies, the decode batch sizes a node may run at and the prefill
  chunk sizes of a workload.
- `operating_points`: operating points: what one node of a combination can do, as plain numbers for
  the solver.
- `stage_bytes`: bytes a pipeline stage holds or hands on beyond its layers: the LM head on the last
  stage, the input embedding on the stage with layer 0, the activations crossing a stage boundary.
"""
