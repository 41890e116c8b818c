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


def brute_pools(
    avails: Sequence[Sequence[bool]], g: int, W: int, D: int, d: int, sps: Sequence[int], od: int
) -> int | None:
    """The same search over several spot pools: choices are to wait, on-demand,
    or spot in any pool that is up; a move between pools is a new instance."""
    # state: (choice, overhead left, work done); choice 0 = none, 1 = on-demand, 2 + p = spot in pool p
    states: dict[tuple[int, int, int], int] = {(0, 0, 0): 0}
    best: int | None = None
    steps = -(-D // g)
    for i in range(steps):
        t = i * g
        nxt: dict[tuple[int, int, int], int] = {}
        for (cur, oh, done), cost in states.items():
            choices = [0, 1] + [2 + p for p in range(len(avails)) if avails[p][i]]
            cur_eff = 0 if cur >= 2 and not avails[cur - 2][i] else cur
            for c in choices:
                if c == 0:
                    key = (0, 0, done)
                    if nxt.get(key, 1 << 62) > cost:
                        nxt[key] = cost
                    continue
                o = oh if c == cur_eff else d
                rate = od if c == 1 else sps[c - 2]
                productive = g - o
                need = W - done
                if productive >= need:
                    if t + o + need <= D:
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
