"""How a node type's nodes split into the stages of one pipeline (`placement_step`).

A type's `n` nodes form groups (stages of identical nodes): `partitions` lists the group
sizes, `role_choices` the ways to make one group the first stage (layer 0), one the end stage
(the last layer), or one the only stage; flags say which a set of groups holds, and `MERGE`
combines the flags of two disjoint sets (a pipeline has one first and one end stage).
"""

from __future__ import annotations

from functools import lru_cache

# roles of a group: a middle stage, the first stage, the end stage, the only stage
MID, FIRST, END, ONLY = 0, 1, 2, 3
# flags of a set of groups: holds the first stage, holds the end stage, is the only stage,
# has a group whose size divides B
F_FIRST, F_END, F_ONLY, F_TIGHT = 1, 2, 4, 8





@lru_cache(maxsize=None)
def partitions(n: int, largest: int) -> tuple[tuple[int, ...], ...]:
    """Multisets of positive parts summing to `n`, each at most `largest`, non-increasing."""
    if n == 0:
        return ((),)
    return tuple((first,) + rest for first in range(min(n, largest), 0, -1)
                 for rest in partitions(n - first, first))


@lru_cache(maxsize=None)
def role_choices(parts: tuple[int, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Ways to give the groups of `parts` roles, each listed once: (flags, role per group)."""
    g = len(parts)
    seen = set()
    out = []
    for f in [None, *range(g)]:
        for e in [None, *range(g)]:
            roles = [MID] * g
            if f is not None and f == e:
                roles[f], flags = ONLY, F_ONLY
            else:
                flags = 0
                if f is not None:
                    roles[f], flags = FIRST, flags | F_FIRST
                if e is not None:
                    roles[e], flags = END, flags | F_END
            key = (flags, tuple(sorted(zip(parts, roles))))
            if key not in seen:
                seen.add(key)
                out.append((flags, tuple(roles)))
    return tuple(out)


def merge_flags(a: int, b: int) -> int | None:
    """Flags of two disjoint sets of groups (None: two first, two end or an only stage
    beside another)."""
    ra, rb = a & 7, b & 7
    if (ra & rb) or ((ra | rb) & F_ONLY and ra and rb):
        return None
    return a | b


#: `merge_flags` as a table (-1: the two sets cannot be together).
MERGE = [[-1 if (m := merge_flags(a, b)) is None else m for b in range(16)] for a in range(16)]
#: `COMPLETE[a][w]`: the flags `b` with `MERGE[a][b] == w`.
COMPLETE = [[tuple(b for b in range(16) if MERGE[a][b] == w) for w in range(16)]
             for a in range(16)]
