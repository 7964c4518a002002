"""The allocation ILP's solve (`solve_allocation`), the plans it starts from, and the exhaustive
oracle it is tested against.

- `bruteforce`: exhaustive allocation oracle for tiny problems: the reference the ILP is tested
  against.
- `ilp`: the online allocation ILP, solved with HiGHS.
- `rounded_start`: the first plan of a cost solve whose PD models are past exact per-model covers
  (`ilp.PD_MAX_REGIONS`, `ilp.PD_MAX_UNITS`: `advanced`-size PD problems): the LP optimum rounded
  down and repaired, then HiGHS on growing neighbourhoods of that plan and the LP's support, the
  whole ILP last where it is small enough.
- `starts`: plans given to `solve_allocation` as starts: the best of them as a plan of the problem
  (`best_start`), as counts of the ILP's columns (`seed_of`, which the search starts from), and kept
  in place of the search's plan when that ends worse (`adopt_start`, with the gaps the search's
  bounds prove for it).
"""
