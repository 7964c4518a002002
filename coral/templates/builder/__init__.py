"""Template libraries: one combination's solve, a whole library's build, its store on disk, and the
pools that run the solves.

- `build`: build a template library (`build_library`); one combination is `solve.build_template`.
- `build_options`: how template libraries are built: one frozen options object, passed whole.
- `homogeneous`: homogeneous combinations (`k` nodes of one type) that a library drops but a plan
  can use.
- `parallel`: run placement solves in parallel: in-process, on local processes, or on a Ray cluster.
- `solve`: solve one combination: `build_template`, and a library's unit of work (`solve_task`).
- `store`: A template library on disk: `manifest.json` + `templates.jsonl` in one directory.
"""
