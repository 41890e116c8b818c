"""The offline optimum for one job on one known trace (the simulator's lower bound).

Exact dynamic programming over the discretised trace, in the model of
``broker.sim.engine`` (decisions at step starts, changeover d per new
instance, per-second billing, one spot price and one on-demand price).

State. Instead of the work done, the program tracks the *slack spent*
sigma = elapsed - done: it grows while the job waits or changes over and
stands still while it progresses. The deadline holds exactly when the final
sigma <= D - W, so sigma lives in [0, D - W] and only takes values that are
sums of whole steps and changeovers: a grid of u = gcd(step, d) seconds.
Cost arrays over that grid are kept at every change of spot availability
(the only moments where the best plan does something new), for two modes:
``NP`` (no instance) and ``OD`` (on an on-demand instance).

Why so few moments suffice (exchange arguments, with spot cheaper than
on-demand and both prices constant):
- a spot run starts at the start of an availability window and lasts until
  the window ends or the work is done: starting later, or stopping early,
  buys less work at the cheapest price;
- leaving on-demand for spot happens at a window start, for the same reason;
- an on-demand run ends when the work is done or at a window start where the
  job moves to spot (stopping and waiting is no better than starting later);
- an on-demand run may start at any step: that is the one continuous choice,
  solved for all start steps at once as a sliding-window minimum.
An on-demand run that starts less than d before a boundary is booked with
its whole changeover at once; the only plan this misjudges (leaving it for
spot before its changeover is over) is never optimal, and it is misjudged on
the expensive side, so the minimum stays exact. ``tests/sim`` checks the
result against a plain step-by-step search over every state on small traces,
and every plan is replayed through the engine to the same cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from policies.base import Capacity

INF = np.int64(1 << 62)

Run = tuple[int, int, Capacity]


@dataclass(frozen=True)
class Optimum:
    feasible: bool
    """False when even on-demand from the first second misses the deadline."""
    cost_us: int
    """Exact cost, micro-units x seconds per hour (rates are per hour for the whole gang)."""
    plan: tuple[Run, ...]
    finish_s: int


def _shift(a: np.ndarray, m: int) -> np.ndarray:
    """out[i] = a[i - m] (INF where i < m)."""
    if m <= 0:
        return a.copy()
    out = np.full_like(a, INF)
    if m < len(a):
        out[m:] = a[:-m]
    return out


def _window_min(f: np.ndarray, stride: int, width: int) -> np.ndarray:
    """out[i] = min over k < width of f[i - k * stride] (INF outside)."""
    result = np.full_like(f, INF)
    cur = f
    span = 1
    pos = 0
    remaining = width
    while remaining:
        if remaining & 1:
            np.minimum(result, _shift(cur, pos * stride), out=result)
            pos += span
        remaining >>= 1
        if remaining:
            cur = np.minimum(cur, _shift(cur, span * stride))
            span *= 2
    return result


def segments_of(avail: Sequence[bool], gap_s: int) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal availability as (start_s, end_s, available)."""
    out: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(avail) + 1):
        if i == len(avail) or avail[i] != avail[start]:
            out.append((start * gap_s, i * gap_s, bool(avail[start])))
            start = i
    return out


def solve(
    avail: Sequence[bool],
    gap_s: int,
    work_s: int,
    deadline_s: int,
    changeover_s: int,
    spot_rate: int,
    ondemand_rate: int,
) -> Optimum:
    """The cheapest plan that finishes ``work_s`` by ``deadline_s``.

    ``avail[i]``: the gang can have spot during step i (at least
    ceil(deadline / step) steps are needed). Rates are micro-units per hour
    for the whole gang; spot must not be dearer than on-demand.
    """
    g, d, W, D = gap_s, changeover_s, work_s, deadline_s
    sp, od = int(spot_rate), int(ondemand_rate)
    if sp > od:
        raise ValueError("the optimum assumes spot is not dearer than on-demand")
    if W <= 0:
        return Optimum(True, 0, (), 0)
    S0 = D - W
    if S0 < d:
        # Even on-demand from the start is late: the earliest finish is W + d.
        return Optimum(False, od * (W + d), ((0, W + d, Capacity.ONDEMAND),), W + d)
    steps = -(-D // g)
    if len(avail) < steps:
        raise ValueError(f"need availability for {steps} steps, got {len(avail)}")
    segs = segments_of(avail[:steps], g)

    u = math.gcd(g, d)
    N = S0 // u + 1
    dd = d // u
    sig = np.arange(N, dtype=np.int64) * u
    ramp_od = np.arange(N, dtype=np.int64) * (od * u)

    NP = np.full(N, INF, dtype=np.int64)
    NP[0] = 0
    ODP = np.full(N, INF, dtype=np.int64)
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    best_cost = int(INF)
    best: tuple[str, int, int] = ("", -1, -1)

    def consider(cost: np.ndarray, mask: np.ndarray, kind: str, k: int) -> None:
        nonlocal best_cost, best
        if not mask.any():
            return
        c = np.where(mask, cost, INF)
        j = int(np.argmin(c))
        if int(c[j]) < best_cost:
            best_cost = int(c[j])
            best = (kind, k, j)

    for k, (t0, t1, A) in enumerate(segs):
        # Labels whose work would already be done are not real states.
        dead = sig < t0 - W
        NP[dead] = INF
        ODP[dead] = INF
        kept.append((NP, ODP))
        rem = W - t0 + sig  # work left (for NP labels; OD labels are booked the same way)
        live_np = NP < INF
        live_od = ODP < INF
        # Finish on on-demand from here.
        consider(ODP + od * rem, live_od & (rem >= 0), "od", k)
        consider(NP + od * (rem + d), live_np & (sig + d <= S0), "np_od", k)
        L = t1 - t0
        src = np.minimum(NP, ODP)
        spot_ok = A and L > d
        if spot_ok:
            fin = sig <= t1 - d - W
            consider(src + sp * (rem + d), (src < INF) & fin & (sig + d <= S0), "spot", k)
        # Carry to t1.
        NP1 = _shift(NP, L // u)
        if spot_ok:
            cont = np.where(fin, INF, src + sp * L)
            np.minimum(NP1, _shift(cont, dd), out=NP1)
        ODP1 = np.where(live_od, ODP + od * L, INF)
        K = L // g
        F = np.where(live_np, NP + ramp_od, INF)
        G = _window_min(F, g // u, K)
        # ODP1[j] = od*L - od*u*(j - dd) + G[j - dd]
        Gs = _shift(G, dd)
        start_od = np.where(Gs < INF, Gs + od * L - ramp_od + od * u * dd, INF)
        np.minimum(ODP1, start_od, out=ODP1)
        np.minimum(NP1, INF, out=NP1)
        NP, ODP = NP1, ODP1

    if best_cost >= int(INF):
        raise AssertionError("no plan found for a feasible job (bug in the optimum)")
    plan = _backtrack(best, kept, segs, sig, g, d, u, W, sp, od)
    finish = max(r[1] for r in plan)
    return Optimum(True, best_cost, plan, finish)


def _backtrack(
    best: tuple[str, int, int],
    kept: list[tuple[np.ndarray, np.ndarray]],
    segs: list[tuple[int, int, bool]],
    sig: np.ndarray,
    g: int,
    d: int,
    u: int,
    W: int,
    sp: int,
    od: int,
) -> tuple[Run, ...]:
    kind, k, j = best
    t = segs[k][0]
    s = int(sig[j])
    runs: list[Run] = []
    od_end = 0
    if kind == "od":
        mode = "OD"
        od_end = W + s
    elif kind == "np_od":
        runs.append((t, W + s + d, Capacity.ONDEMAND))
        mode = "NP"
    else:
        runs.append((t, W + s + d, Capacity.SPOT))
        NPk, ODk = kept[k]
        if NPk[j] <= ODk[j]:
            mode = "NP"
        else:
            mode, od_end = "OD", t
    dd = d // u
    while not (k == 0 and mode == "NP"):
        NPk, ODk = kept[k]
        v = int((NPk if mode == "NP" else ODk)[j])
        t0, t1, A = segs[k - 1]
        L = t1 - t0
        NPp, ODp = kept[k - 1]
        if mode == "NP":
            jp = j - L // u
            if jp >= 0 and int(NPp[jp]) == v:
                k, j = k - 1, jp
                continue
            jp = j - dd
            if A and L > d and jp >= 0 and int(sig[jp]) > t1 - d - W:
                if int(NPp[jp]) + sp * L == v:
                    runs.append((t0, t1, Capacity.SPOT))
                    k, j = k - 1, jp
                    continue
                if int(ODp[jp]) + sp * L == v:
                    runs.append((t0, t1, Capacity.SPOT))
                    k, j, mode, od_end = k - 1, jp, "OD", t0
                    continue
            raise AssertionError("optimum backtrack lost its way (NP)")
        if int(ODp[j]) < INF and int(ODp[j]) + od * L == v:
            k -= 1
            continue
        stride = g // u
        found = False
        for kk in range(L // g):
            jp = j - dd - kk * stride
            if jp < 0:
                break
            if int(NPp[jp]) < INF and int(NPp[jp]) + od * (L - kk * g) == v:
                runs.append((t0 + kk * g, od_end, Capacity.ONDEMAND))
                k, j, mode = k - 1, jp, "NP"
                found = True
                break
        if not found:
            raise AssertionError("optimum backtrack lost its way (OD)")
    if j != 0:
        raise AssertionError("optimum backtrack did not reach the start")
    return tuple(sorted(runs))
