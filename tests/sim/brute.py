"""A plain step-by-step search over every state of the engine's model.

Slow and obviously right: the reference the exact optimum is checked against
on small traces.
"""

from __future__ import annotations

from collections.abc import Sequence

NONE, SPOT, OD = 0, 1, 2


def brute_optimum(
    avail: Sequence[bool], g: int, W: int, D: int, d: int, sp: int, od: int
) -> int | None:
    """Least cost (rate x seconds) to finish W by D, or None if impossible."""
    # state: (capacity, overhead left, work done) -> least cost so far
    states: dict[tuple[int, int, int], int] = {(NONE, 0, 0): 0}
    best: int | None = None
    steps = -(-D // g)
    for i in range(steps):
        t = i * g
        nxt: dict[tuple[int, int, int], int] = {}
        for (cur, oh, done), cost in states.items():
            choices = [NONE, OD] + ([SPOT] if avail[i] else [])
            for c in choices:
                if c == NONE:
                    key = (NONE, 0, done)
                    if nxt.get(key, 1 << 62) > cost:
                        nxt[key] = cost
                    continue
                if cur == SPOT and not avail[i]:
                    cur_eff = NONE
                else:
                    cur_eff = cur
                o = oh if c == cur_eff else d
                rate = sp if c == SPOT else od
                productive = g - o
                need = W - done
                if productive >= need:
                    finish = t + o + need
                    if finish <= D:
                        total = cost + rate * (o + need)
                        if best is None or total < best:
                            best = total
                    continue
                key = (c, max(0, o - g), done + max(0, productive))
                total = cost + rate * g
                if nxt.get(key, 1 << 62) > total:
                    nxt[key] = total
        states = nxt
    return best
