"""Best decisions for a job when spot windows and outages have memory.

``policies.markov`` models the spot market as memoryless: a window that has
lasted five minutes and one that has lasted five days end with the same
chance. Real spot markets are not like that (``docs/SIMULATOR.md``): most
windows are short, a few last for days, so the longer a window has lasted the
longer it will probably last; outages likewise. This module keeps the age of
the current window or outage in the state of the dynamic program (a
semi-Markov model of the market), with the chance that a run ends at each
age estimated from the observed lengths (``hazards``).

State, on a grid of ``delta_s`` seconds: time left L, work left R, the job's
mode (waiting; on spot or on on-demand with k changeover steps left), the
market (up or down) and the age bucket of the current run. Ages are bucketed
(exact for the first steps, then wider); inside a bucket a run moves to the
next bucket with chance 1/width per step, which keeps the table small.

Pure and deterministic: a table depends only on its key; tables are cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from policies.markov import MISS, ONDEMAND, SPOT, WAIT

EDGES: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 29, 38, 50, 66, 87, 115, 150, 200)
"""Age bucket edges in grid steps; the last bucket is open-ended."""

PRIOR_WEIGHT = 6.0
"""Pseudo-exposure (steps) of the rate prior in every bucket."""


def bucket_of(age_steps: int) -> int:
    b = 0
    for i, e in enumerate(EDGES):
        if age_steps >= e:
            b = i
    return b


@lru_cache(maxsize=256)
def hazards(lengths_s: tuple[int, ...], delta_s: int, prior: float, quantum: float = 0.05) -> tuple[float, ...]:
    """Per-step chance that a run ends in each age bucket, from observed run lengths.

    A run of n steps is exposed at ages 0..n-1 and ends at age n-1. In each
    bucket: (ends + prior * w) / (exposure + w), with ``w = PRIOR_WEIGHT``,
    so buckets with little evidence lean on the memoryless ``prior``.
    Rounded to ``quantum`` on a log scale so that similar histories share a table.
    """
    nb = len(EDGES)
    ends = np.zeros(nb)
    expo = np.zeros(nb)
    lo = np.array(EDGES, dtype=float)
    hi = np.array([*EDGES[1:], 1e18], dtype=float)
    for x in lengths_s:
        n = max(1, round(x / delta_s))
        expo += np.clip(np.minimum(hi, n) - lo, 0, None)
        ends[bucket_of(n - 1)] += 1
    h = (ends + prior * PRIOR_WEIGHT) / (expo + PRIOR_WEIGHT)
    h = np.clip(h, 1e-4, 0.999)
    q = np.exp(np.round(np.log(h) / quantum) * quantum)
    return tuple(float(round(v, 6)) for v in np.clip(q, 1e-4, 0.999))


@dataclass(frozen=True)
class SemiKey:
    delta_s: int
    c: int
    r_max: int
    l_max: int
    h_up: tuple[float, ...]
    """Per-step chance that a spot window ends, per age bucket."""
    h_down: tuple[float, ...]
    """Per-step chance that an outage ends, per age bucket."""
    spot_ratio: float


@dataclass(frozen=True)
class SemiTable:
    key: SemiKey
    # acts[mode][L, bucket, R]
    idle_up: np.ndarray
    idle_down: np.ndarray
    spot_up: np.ndarray
    od_up: np.ndarray
    od_down: np.ndarray

    def array(self, mode: str, up: bool) -> np.ndarray:
        if mode == "spot":
            return self.spot_up if up else self.idle_down
        if mode == "ondemand":
            return self.od_up if up else self.od_down
        return self.idle_up if up else self.idle_down

    def action(self, mode: str, up: bool, age_steps: int, lv: int, r: int) -> int:
        if r <= 0:
            return WAIT
        lv = max(0, min(lv, self.key.l_max))
        r = min(r, self.key.r_max)
        return int(self.array(mode, up)[lv, bucket_of(age_steps), r])


@lru_cache(maxsize=6)
def build(key: SemiKey) -> SemiTable:
    c, n, Lm = key.c, key.r_max + 1, key.l_max
    nb = len(EDGES)
    sp = key.spot_ratio
    hu = np.array(key.h_up)[:, None]
    hd = np.array(key.h_down)[:, None]
    width = np.array([*(b - a for a, b in zip(EDGES, EDGES[1:], strict=False)), 0], dtype=float)
    g = np.where(width > 0, 1.0 / np.maximum(width, 1), 0.0)[:, None]  # chance to move up a bucket
    big = MISS
    ridx = np.arange(n)

    def aged(v: np.ndarray) -> np.ndarray:
        """E[v at the next step's age | the run goes on]."""
        nxt = np.empty_like(v)
        nxt[:-1] = v[1:]
        nxt[-1] = v[-1]
        return (1 - g) * v + g * nxt

    def e_up(vu: np.ndarray, vd: np.ndarray) -> np.ndarray:
        return (1 - hu) * aged(vu) + hu * vd[0]

    def e_dn(vu: np.ndarray, vd: np.ndarray) -> np.ndarray:
        return (1 - hd) * aged(vd) + hd * vu[0]

    def prog(a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        out[:, 0] = 0.0
        out[:, 1:] = a[:, :-1]
        return out

    zero = np.zeros((nb, n))
    zero[:, 1:] = big
    I_up, I_dn = zero.copy(), zero.copy()
    S_up = [zero.copy() for _ in range(c + 1)]
    O_up = [zero.copy() for _ in range(c + 1)]
    O_dn = [zero.copy() for _ in range(c + 1)]
    shape = (Lm + 1, nb, n)
    acts = {m: np.zeros(shape, dtype=np.int8) for m in ("iu", "id", "su", "ou", "od")}
    for m in acts.values():
        m[0, :, 1:] = ONDEMAND
    inf = np.full((nb, n), np.inf)

    for L in range(1, Lm + 1):
        over = ridx > L
        idle_u = e_up(I_up, I_dn)
        idle_d = e_dn(I_up, I_dn)
        od_u, od_d = [], []
        for k in range(c + 1):
            nu, nd = (O_up[k - 1], O_dn[k - 1]) if k else (prog(O_up[0]), prog(O_dn[0]))
            od_u.append(1.0 + e_up(nu, nd))
            od_d.append(1.0 + e_dn(nu, nd))
        sp_u = []
        for k in range(c + 1):
            nu, nd = (S_up[k - 1], I_dn) if k else (prog(S_up[0]), prog(I_dn))
            sp_u.append(sp + e_up(nu, nd))
        start_od_u, start_od_d, start_sp = od_u[c], od_d[c], sp_u[c]

        st = np.stack([idle_u, start_sp, start_od_u])
        a_iu, v_iu = st.argmin(0), st.min(0)
        st = np.stack([idle_d, inf, start_od_d])
        a_id, v_id = st.argmin(0), st.min(0)
        new_S = []
        for k in range(c + 1):
            st = np.stack([idle_u, sp_u[k], start_od_u])
            new_S.append(st.min(0))
            if k == 0:
                a_su = st.argmin(0)
        new_Ou, new_Od = [], []
        for k in range(c + 1):
            st = np.stack([idle_u, start_sp, od_u[k]])
            new_Ou.append(st.min(0))
            if k == 0:
                a_ou = st.argmin(0)
            st = np.stack([idle_d, inf, od_d[k]])
            new_Od.append(st.min(0))
            if k == 0:
                a_od = st.argmin(0)
        for arr in (v_iu, v_id, *new_S, *new_Ou, *new_Od):
            arr[:, over] = big
            arr[:, 0] = 0.0
            np.minimum(arr, big, out=arr)
        I_up, I_dn, S_up, O_up, O_dn = v_iu, v_id, new_S, new_Ou, new_Od
        acts["iu"][L] = a_iu
        acts["id"][L] = a_id
        acts["su"][L] = a_su
        acts["ou"][L] = a_ou
        acts["od"][L] = a_od
    return SemiTable(key, acts["iu"], acts["id"], acts["su"], acts["ou"], acts["od"])


__all__ = ["EDGES", "SemiKey", "SemiTable", "build", "bucket_of", "hazards", "SPOT", "WAIT", "ONDEMAND"]
