"""Best decisions for a job under a two-state model of the spot market.

The market is modelled as a Markov chain: spot for the gang is up or down;
it goes down at the observed reclaim rate (per hour of uptime) and comes back
at the rate that makes its long-run uptime the observed uptime share. Time
moves in steps of ``delta_s``; a changeover takes ``c`` steps.

For every (work left, time left) on that grid, every mode (waiting, on spot
or on-demand, changing over or not) and both spot states, backward induction
gives the expected cost of finishing and the best action: wait, spot, or
on-demand. Missing the deadline costs ``MISS`` times the on-demand price of a
step, so the table itself keeps clear of the deadline; the caller's exact
safety net has the last word anyway.

Pure and deterministic: a table depends only on its key, and tables are
cached because the market statistics move slowly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

WAIT, SPOT, ONDEMAND = 0, 1, 2
MISS = 1e6


@dataclass(frozen=True)
class TableKey:
    delta_s: int
    c: int
    """Changeover in steps (>= 1)."""
    r_max: int
    """Largest work left, in steps."""
    l_max: int
    """Largest time left, in steps."""
    p_down: float
    """P(spot goes down during a step | up)."""
    p_up: float
    """P(spot comes back during a step | down)."""
    spot_ratio: float
    """Spot price / on-demand price."""


@dataclass(frozen=True)
class Table:
    key: TableKey
    # actions[mode][L, R]: best action at time left L steps, work left R steps
    idle_up: np.ndarray
    idle_down: np.ndarray
    spot_up: np.ndarray
    od_up: np.ndarray
    od_down: np.ndarray

    def action(self, mode: str, up: bool, lv: int, r: int) -> int:
        if r <= 0:
            return WAIT
        lv = max(0, min(lv, self.key.l_max))
        r = min(r, self.key.r_max)
        if mode == "spot":
            arr = self.spot_up if up else self.idle_down
        elif mode == "ondemand":
            arr = self.od_up if up else self.od_down
        else:
            arr = self.idle_up if up else self.idle_down
        return int(arr[lv, r])


def step_probabilities(reclaims_per_hour: float, uptime: float, delta_s: int) -> tuple[float, float]:
    """Per-step chances of losing spot and of getting it back, from observed rates."""
    h = delta_s / 3600
    lam = max(reclaims_per_hour, 1e-4)
    uptime = min(max(uptime, 0.02), 0.995)
    mu = lam * uptime / (1 - uptime)
    return 1 - math.exp(-lam * h), 1 - math.exp(-mu * h)


@lru_cache(maxsize=64)
def build(key: TableKey) -> Table:
    c, R, Lm = key.c, key.r_max, key.l_max
    p, q, sp = key.p_down, key.p_up, key.spot_ratio
    big = MISS
    n = R + 1
    ridx = np.arange(n)

    def fresh(level: int) -> np.ndarray:
        a = np.zeros(n)
        a[ridx > level] = big
        return a

    # Value arrays at the previous level, per mode: I (idle), S[k], O[k]; for spot up / down.
    zero = fresh(0)
    I_up, I_dn = zero.copy(), zero.copy()
    S_up = [zero.copy() for _ in range(c + 1)]
    O_up = [zero.copy() for _ in range(c + 1)]
    O_dn = [zero.copy() for _ in range(c + 1)]
    acts = {m: np.zeros((Lm + 1, n), dtype=np.int8) for m in ("iu", "id", "su", "ou", "od")}
    for m in acts.values():
        m[0, 1:] = ONDEMAND

    def prog(a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        out[0] = 0.0
        out[1:] = a[:-1]
        return out

    for L in range(1, Lm + 1):
        over = ridx > L
        e_up = lambda up, dn: (1 - p) * up + p * dn  # noqa: E731
        e_dn = lambda up, dn: q * up + (1 - q) * dn  # noqa: E731
        idle_u = e_up(I_up, I_dn)
        idle_d = e_dn(I_up, I_dn)
        # On-demand with k steps of changeover left (k = 0: progressing).
        od_u = []
        od_d = []
        for k in range(c + 1):
            nu, nd = (O_up[k - 1], O_dn[k - 1]) if k else (prog(O_up[0]), prog(O_dn[0]))
            od_u.append(1.0 + e_up(nu, nd))
            od_d.append(1.0 + e_dn(nu, nd))
        sp_u = []
        for k in range(c + 1):
            nu, nd = (S_up[k - 1], I_dn) if k else (prog(S_up[0]), prog(I_dn))
            sp_u.append(sp + (1 - p) * nu + p * nd)

        start_od_u, start_od_d, start_sp = od_u[c], od_d[c], sp_u[c]
        # Waiting, up: wait / start spot / start on-demand.
        st = np.stack([idle_u, start_sp, start_od_u])
        a_iu = st.argmin(0)
        v_iu = st.min(0)
        st = np.stack([idle_d, np.full(n, np.inf), start_od_d])
        a_id = st.argmin(0)
        v_id = st.min(0)
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
            st = np.stack([idle_d, np.full(n, np.inf), od_d[k]])
            new_Od.append(st.min(0))
            if k == 0:
                a_od = st.argmin(0)
        for arr in (v_iu, v_id, *new_S, *new_Ou, *new_Od):
            arr[over] = big
            arr[0] = 0.0
            np.minimum(arr, big, out=arr)
        I_up, I_dn, S_up, O_up, O_dn = v_iu, v_id, new_S, new_Ou, new_Od
        acts["iu"][L] = a_iu
        acts["id"][L] = a_id
        acts["su"][L] = a_su
        acts["ou"][L] = a_ou
        acts["od"][L] = a_od
    return Table(key, acts["iu"], acts["id"], acts["su"], acts["ou"], acts["od"])
