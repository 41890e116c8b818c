"""The offline optimum for one job over several spot pools and on-demand.

The model of ``broker.sim.pools``: a job may run on spot in any pool whose
trace offers the whole gang, or on on-demand; every start on a new instance
pays the changeover d, a move between pools included; each pool has its own
spot price (not dearer than on-demand).

Exact dynamic programming like ``broker.sim.optimum``, over the *slack
spent* sigma = elapsed - done on a grid of u = gcd(step, d) seconds, kept at
every boundary of the union of the pools' availability changes, with one
cost array per mode: no instance (NP), on-demand (OD) and running on spot in
pool p (S[p], the changeover booked when the run starts). Between two
boundaries every pool's availability is fixed. Exchange arguments (prices
constant):
- a move from on-demand to spot, or between pools, happens at a boundary:
  moving earlier to the cheaper instance is never worse, and a move to the
  dearer one is only worth making when the current one ends (a boundary);
- a run started from no instance (on-demand, or spot in a pool up for the
  whole segment) may start at any step of a segment: solved for all start
  steps at once as a sliding-window minimum, as for on-demand in the single
  pool optimum (with one spot price, spot runs start at window starts; with
  several prices a dearer pool may be worth starting late);
- stopping voluntarily is allowed at boundaries (never better than not
  starting, so never needed elsewhere).
A run booked with its whole changeover and cut before the changeover ends
is misjudged on the expensive side only (it is never optimal: paying for no
progress), so the minimum stays exact. ``tests/sim`` checks it against a
step-by-step search over every state on small cases and against the single
pool optimum with one pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from broker.sim.optimum import INF, _shift, _window_min


def _add(a: np.ndarray, x: np.ndarray | int) -> np.ndarray:
    """a + x where a is finite, INF elsewhere (no overflow)."""
    return np.where(a < INF, a + x, INF)


def union_segments(avails: Sequence[Sequence[bool]], steps: int, gap_s: int) -> list[tuple[int, int, tuple[bool, ...]]]:
    """Maximal runs of equal availability vectors as (start_s, end_s, availability per pool)."""
    out = []
    start = 0
    for i in range(1, steps + 1):
        if i == steps or any(a[i] != a[start] for a in avails):
            out.append((start * gap_s, i * gap_s, tuple(bool(a[start]) for a in avails)))
            start = i
    return out


def solve_pools(
    avails: Sequence[Sequence[bool]],
    gap_s: int,
    work_s: int,
    deadline_s: int,
    changeover_s: int,
    spot_rates: Sequence[int],
    ondemand_rate: int,
) -> tuple[bool, int]:
    """(feasible, least cost) to finish ``work_s`` by ``deadline_s``.

    ``avails[p][i]``: pool p offers the gang during step i. Rates per hour for
    the whole gang; cost in rate x seconds, like ``broker.sim.optimum``.
    """
    g, d, W, D = gap_s, changeover_s, work_s, deadline_s
    od = int(ondemand_rate)
    sps = [int(x) for x in spot_rates]
    if any(s > od for s in sps):
        raise ValueError("the optimum assumes spot is not dearer than on-demand")
    if W <= 0:
        return True, 0
    S0 = D - W
    if S0 < d:
        return False, od * (W + d)
    steps = -(-D // g)
    if any(len(a) < steps for a in avails):
        raise ValueError(f"need availability for {steps} steps")
    segs = union_segments(avails, steps, g)
    P = len(sps)
    u = math.gcd(g, d)
    N = S0 // u + 1
    dd = d // u
    stride = g // u
    sig = np.arange(N, dtype=np.int64) * u
    ramps = {r: np.arange(N, dtype=np.int64) * (r * u) for r in {od, *sps}}

    NP = np.full(N, INF, dtype=np.int64)
    NP[0] = 0
    OD = np.full(N, INF, dtype=np.int64)
    S = [np.full(N, INF, dtype=np.int64) for _ in range(P)]
    best = int(INF)

    def take(cost: np.ndarray, mask: np.ndarray) -> None:
        nonlocal best
        c = np.where(mask, cost, INF)
        if len(c):
            best = min(best, int(c.min()))

    def late_start(src: np.ndarray, rate: int, L: int) -> np.ndarray:
        """Runs started from ``src`` at any step of a segment of length L and
        still running at its end: out[j] over the booked sigma."""
        K = L // g
        F = np.where(src < INF, src + ramps[rate], INF)
        G = _shift(_window_min(F, stride, K), dd)
        return np.where(G < INF, G + rate * L - ramps[rate] + rate * u * dd, INF)

    for t0, t1, A in segs:
        dead = sig < t0 - W
        for arr in (NP, OD, *S):
            arr[dead] = INF
        rem = W - t0 + sig
        # Boundary: runs whose pool is gone end; any run may stop.
        for p in range(P):
            np.minimum(NP, S[p], out=NP)
            if not A[p]:
                S[p] = np.full(N, INF, dtype=np.int64)
        np.minimum(NP, OD, out=NP)
        src = NP  # OD and every spot run are already folded in: a move = stop + start
        fits_d = sig + d <= S0
        # Finish from here.
        take(_add(OD, od * rem), (OD < INF) & (rem >= 0))
        take(_add(NP, od * (rem + d)), (NP < INF) & fits_d)
        L = t1 - t0
        for p in range(P):
            if not A[p]:
                continue
            take(_add(S[p], sps[p] * rem), (S[p] < INF) & (rem <= L) & (rem >= 0))
            take(_add(src, sps[p] * (rem + d)), (src < INF) & fits_d & (rem + d <= L))
        # Carry to t1.
        NP1 = _shift(NP, L // u)
        OD1 = _add(OD, od * L)
        np.minimum(OD1, late_start(NP, od, L), out=OD1)
        S1 = []
        for p in range(P):
            if not A[p]:
                S1.append(np.full(N, INF, dtype=np.int64))
                continue
            cont = _add(S[p], sps[p] * L)
            np.minimum(cont, _shift(_add(src, sps[p] * L), dd), out=cont)
            np.minimum(cont, late_start(NP, sps[p], L), out=cont)
            S1.append(cont)
        NP, OD, S = NP1, OD1, S1
    if best >= int(INF):
        raise AssertionError("no plan found for a feasible job (bug in the optimum)")
    return True, best
