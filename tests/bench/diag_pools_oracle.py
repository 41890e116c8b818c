"""Diagnostic: what knowing the length of the spot windows is worth over several pools.

A policy that reads the trace's future (not a fair policy: an oracle): after
a reclaim it takes the pool whose current window will last longest if that
is at least ``--x`` changeovers, else waits while the slack is above 12 % of
the work, else on-demand; from on-demand it leaves only for a window that
will last ``--xo`` changeovers. Everything else is gbroker's. Printed
against gbroker (or ``--base``) and the target (the smaller of 10 % and half
of best-pool Uniform Progress's gap on the same samples) on the tuning half
(A), the held-out half (B) or all of ``bench_pools.py``, d = 0.2 h, seed 1.

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py [--half A|B|all] [--x 2] [--xo 3] [--base NAME]

``--windows`` prints instead what the past says about a window's length, per
pool set (all its pools' windows, whole traces): the share of the windows
that, having reached an age of 0, 1 or 2 changeovers (12 min), lasted 3
changeovers more, overall and split by the length of the pool's previous
window and of the outage just before (longer or not than their median):

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py --windows

``--fit`` fits the window predictor measured in gbroker and not kept
(``WINDOW_MODEL``: a logistic regression, by Newton's method with a small
ridge, of "this window lasts 3 more changeovers" on ``window_features``, the
features a policy sees online) on half A's traces only, with d = 0.2 h, at
every 2 minutes of trace time where a pool has spot younger than 3 d and 2 or
more observed windows, and prints its coefficients and its AUC (the chance
that a window that lasted is ranked above one that did not) on half A and
on the held-out half B, per pool set, next to each feature's own AUC:

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py --fit

``--decompose`` prints where a policy's gap goes, against the optimum, per
setting (d = 0.2 h): the optimum's hours on on-demand and on spot and its
changeover overhead (hours paid for no progress), each read off the exact
optimum by raising one price by a micro-unit per hour (the cost rises by the
seconds paid at that price; where several plans tie, the one with the
fewest), next to the policy's: its on-demand hours while some pool had spot
(waiting for a window old enough to leave for, the safety net, other) and
while every pool was out, its hours waiting, and its moves:

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py --decompose [--half all] [--base NAME]

``--noise S1,S2,...`` asks how good a window predictor must be: the same
oracle, but it sees each window's whole length through a fixed error, the
length times exp(s x Z) with Z standard normal, drawn once per window (so
asking again does not average it out). For each s it prints the gap per
setting, the settings meeting the target, and the AUC of that noisy
length as a predictor of "lasts 3 changeovers more" at the points ``--fit``
samples (every 2 minutes where a pool has spot younger than 3 d), the
figure the online predictors were measured by:

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py --noise 0,0.5,1,2 --half all --starts 20

``--lags`` prints whether the market has a daily or weekly cycle worth
reading: the AUC, per pool set and look-back, of the share of the same 3
changeovers a lag earlier in which the pool had spot as a predictor of a
window lasting 3 changeovers more (sampled as ``--fit``):

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py --lags
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pools import half_of, pool_setting, pool_sets  # noqa: E402

from broker.sim.engine import SimJob  # noqa: E402
from broker.sim.pools import BEST_POOL_UP, OPTIMUM, PoolWorker, align, run_pools  # noqa: E402
from broker.sim.pools_optimum import solve_pools  # noqa: E402
from broker.sim.single import policy_of  # noqa: E402
from broker.sim.feed import SpotFeed  # noqa: E402
from policies.base import Capacity, MarketView, PoolPlacement  # noqa: E402
from policies.rules import safety_form, share, slack_share_form  # noqa: E402

def rank_auc(x, y) -> float:  # type: ignore[no-untyped-def]
    """The chance that a case with ``y`` true is scored above one with ``y`` false (ties count half):
    the rank-sum AUC of scores ``x`` for labels ``y``."""
    import numpy as np

    x, y = np.asarray(x), np.asarray(y, dtype=bool)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    r = (np.cumsum(counts) - (counts - 1) / 2)[inv]  # ranks, ties averaged
    n1 = y.sum()
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * (len(y) - n1)))


def window_predictors(d: int = 720) -> None:
    """The share of windows of age a that last 3 d more, by the previous window and outage."""
    print("| pool set | N | half | age | windows | last 3 d more | prev. window long / short | prev. outage long / short |")
    print("|---|---|---|---|---|---|---|---|")
    for label, nodes, traces in pool_sets():
        rows: list[tuple[int, int, int]] = []  # (outage before, window before, window)
        for t in align(traces):
            runs: list[tuple[bool, int]] = []
            for c in t.counts:
                a = c >= nodes
                if runs and runs[-1][0] == a:
                    runs[-1] = (a, runs[-1][1] + t.gap_s)
                else:
                    runs.append((a, t.gap_s))
            rows += [(runs[i - 1][1], runs[i - 2][1], runs[i][1])
                     for i in range(2, len(runs) - 1) if runs[i][0]]  # the last run may be cut
        for age in (0, d, 2 * d):
            rs = [r for r in rows if r[2] > age]

            def p(xs: list[tuple[int, int, int]], age: int = age) -> str:
                return f"{sum(r[2] >= age + 3 * d for r in xs) / len(xs):.2f}" if xs else "-"

            mo = sorted(r[0] for r in rs)[len(rs) // 2]
            mw = sorted(r[1] for r in rs)[len(rs) // 2]
            print(f"| {label} | {nodes} | {half_of(label)} | {age // d} d | {len(rs)} | {p(rs)} | "
                  f"{p([r for r in rs if r[1] > mw])} / {p([r for r in rs if r[1] <= mw])} (median {mw // 60} min) | "
                  f"{p([r for r in rs if r[0] > mo])} / {p([r for r in rs if r[0] <= mo])} (median {mo // 60} min) |")


WINDOW_FEATURES = (
    "log1p(age / d)",
    "log1p(previous window / d)",
    "log1p(mean of the last 3 windows / d)",
    "log1p(previous outage / d)",
    "share of all pools' windows longer than the age that lasted 3 d beyond it",
    "other pools up",
    "log1p(oldest other window / d)",
    "uptime share",
)
"""What the window predictor sees of a pool with spot (``window_features``):
only what a policy sees online, in changeovers."""

WINDOW_MODEL = (-1.3905, 0.4760, 0.3086, -0.0109, 0.0151, 0.1259, 0.0907, 0.0576, 0.8257)
"""The fit on half A (``--fit``): intercept, then one coefficient per
feature. Measured in gbroker as ``pool_predict`` (commits de1c197, 87b608e)
and not kept (docs/SIMULATOR.md, "A learned window predictor")."""


def window_features(market: MarketView, others: list[MarketView], d: int) -> list[float]:
    """The predictor's inputs for one pool with spot (``WINDOW_FEATURES``)."""
    age = (market.spot_up_s or 0) / d
    ws = market.spot_windows_s
    outs = market.spot_outages_s
    prev = ws[-1] / d if ws else 3.0
    last3 = ws[-3:]
    prev3 = sum(last3) / len(last3) / d if last3 else 3.0
    pout = outs[-1] / d if outs else 1.0
    every = [x for m in (*others, market) for x in m.spot_windows_s]
    longer = [x for x in every if x > age * d]
    surv = (sum(x - age * d >= 3 * d for x in longer) + 1) / (len(longer) + 2)
    nup = sum(1 for m in others if (m.spot_up_s or 0) > 0)
    oage = max([(m.spot_up_s or 0) / d for m in others] + [0.0])
    up = market.spot_uptime_fraction if market.spot_uptime_fraction is not None else 0.5
    return [math.log1p(age), math.log1p(prev), math.log1p(prev3), math.log1p(pout), surv, float(nup),
            math.log1p(oage), up]


def window_samples(half: str, d: int = 720, stride_s: int = 120) -> list[tuple[str, list[float], bool]]:
    """(pool set, features, lasted 3 d more) at every ``stride_s`` of the half's traces, per pool with spot."""
    out = []
    for label, nodes, traces in pool_sets():
        if half_of(label) != half:
            continue
        tr = align(traces)
        n = min(t.steps for t in tr)
        feeds = [SpotFeed(t, nodes, n) for t in tr]
        g = feeds[0].gap_s
        for i in range(0, n - 1, max(1, stride_s // g)):
            ms = [f.market(i, 918_000, 3_060_000, 0) for f in feeds]
            for k, f in enumerate(feeds):
                if not f.avail[i] or (ms[k].spot_up_s or 0) >= 3 * d or len(ms[k].spot_windows_s) < 2:
                    continue
                j = i
                while j < n and f.avail[j]:
                    j += 1
                if j < n:  # the window's end is in the trace
                    others = [m for o, m in enumerate(ms) if o != k]
                    out.append((f"{label}, N={nodes}", window_features(ms[k], others, d), (j - i) * g >= 3 * d))
    return out


def fit_window_model() -> None:
    import numpy as np

    data = {h: window_samples(h) for h in ("A", "B")}
    X = np.array([x for _, x, _ in data["A"]])
    y = np.array([float(v) for _, _, v in data["A"]])
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Z = np.c_[np.ones(len(X)), (X - mu) / sd]
    w = np.zeros(Z.shape[1])
    ridge = 1e-3 * np.diag([0.0] + [1.0] * X.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-Z @ w))
        grad = Z.T @ (p - y) / len(y) + ridge @ w
        hess = (Z * (p * (1 - p))[:, None]).T @ Z / len(y) + ridge + 1e-9 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    b = w[1:] / sd
    model = [float(w[0] - (w[1:] * mu / sd).sum()), *map(float, b)]
    same = all(abs(a - b) < 5e-5 for a, b in zip(model, WINDOW_MODEL, strict=True))
    print("WINDOW_MODEL = (" + ", ".join(f"{c:.4f}" for c in model) + ")"
          + (" (as stored)" if same else " (differs from the stored WINDOW_MODEL)") + "\n")
    print("| half | pool set | samples | lasted 3 d more | model AUC | " + " | ".join(WINDOW_FEATURES) + " |")
    print("|" + "---|" * (5 + len(WINDOW_FEATURES)))
    for h, rows in data.items():
        for s in [f"{h}: all", *sorted({r[0] for r in rows})]:
            sel = [r for r in rows if s.endswith(": all") or r[0] == s]
            xs = np.array([x for _, x, _ in sel])
            ys = np.array([float(v) for _, _, v in sel])
            ps = np.array([1 / (1 + np.exp(-(model[0] + float(x @ b)))) for x in xs])
            one = " | ".join(f"{rank_auc(xs[:, f], ys):.2f}" for f in range(xs.shape[1]))
            print(f"| {h} | {s} | {len(sel)} | {ys.mean():.2f} | {rank_auc(ps, ys):.3f} | {one} |")


LAGS_H = (6, 12, 17, 24, 48, 168)
"""Look-backs of ``--lags``: the day and its multiples, half a day, a week,
and 6 and 17 hours as controls that no daily or weekly cycle would favour."""


def lag_predictors(d: int = 720, stride_s: int = 120) -> None:
    """AUC of the same time a lag earlier as a predictor of a window lasting 3 d more.

    Sampled as ``window_samples`` (every ``stride_s`` where a pool has spot
    younger than 3 d and the window's end is in the trace); the feature is the
    share of the 3 d that started ``lag`` earlier in which that pool had spot,
    all of it in the past for every lag here. A daily cycle of the market would
    show as an AUC well above 0.5 at 24 and 48 h and not at 17 h."""
    import numpy as np

    print("| pool set | N | half | trace days | " + " | ".join(f"{h} h" for h in LAGS_H) + " |")
    print("|" + "---|" * (4 + len(LAGS_H)))
    for label, nodes, traces in pool_sets():
        tr = align(traces)
        n = min(t.steps for t in tr)
        g = tr[0].gap_s
        cells = []
        for lag_h in LAGS_H:
            lag = lag_h * 3600 // g
            span = 3 * d // g
            xs: list[float] = []
            ys: list[bool] = []
            for t in tr:
                up = np.array([c >= nodes for c in t.counts[:n]])
                done = np.concatenate([[0], np.cumsum(up)])
                run = np.zeros(n, dtype=int)  # steps to the end of the window, from each step with spot
                age = np.zeros(n, dtype=int)
                for i in range(n - 1, -1, -1):
                    run[i] = (run[i + 1] + 1 if i + 1 < n else 1) if up[i] else 0
                for i in range(n):
                    age[i] = (age[i - 1] + 1 if i else 1) if up[i] else 0
                for i in range(lag, n, max(1, stride_s // g)):
                    if not up[i] or (age[i] - 1) * g >= 3 * d or i + run[i] >= n:
                        continue
                    j = i - lag
                    xs.append(float(done[j + span] - done[j]) / span)
                    ys.append(run[i] * g >= 3 * d)
            x, y = np.array(xs), np.array(ys)
            cells.append(f"{rank_auc(x, y):.2f} ({len(x)})" if 0 < y.sum() < len(y) else "-")
        print(f"| {label} | {nodes} | {half_of(label)} | {n * g / 86400:.1f} | " + " | ".join(cells) + " |")


def window_bounds(avail: list[bool], i: int) -> tuple[int, int]:
    """The first step of the spot window that step ``i`` is in, and the first step after it."""
    lo = i
    while lo > 0 and avail[lo - 1]:
        lo -= 1
    hi = i
    while hi < len(avail) and avail[hi]:
        hi += 1
    return lo, hi


def seen_length(sigma: float, seed: int, pool: int, start: int, length_s: int) -> float:
    """A window's whole length as a predictor with a log-normal error of ``sigma`` sees it:
    one draw per window (pool, first step), so asking again gives the same answer."""
    if sigma == 0:
        return float(length_s)
    z = random.Random(f"{seed}:{pool}:{start}").gauss(0.0, 1.0)
    return length_s * math.exp(sigma * z)


class Oracle:
    """Reads the trace's future (see the module docstring): after a reclaim the
    pool whose window will last longest if that is ``x`` changeovers, else
    wait while the slack is above 12 % of the work, else on-demand; from
    on-demand only for a window that will last ``xo`` changeovers; the rest is
    ``base``'s. With ``sigma`` > 0 it sees each window's length through
    ``seen_length`` (``--noise``).

    ``use`` says where the forecast goes: ``"both"`` (the oracle above);
    ``"speed"``, the base policy's rule everywhere, but a job on on-demand
    also leaves at once for a window forecast to last ``xo`` changeovers (the
    forecast can only shorten the proof); ``"veto"``, the base policy's rule
    everywhere, but a job on on-demand does not leave for a window forecast to
    end sooner (the forecast can only stop a move)."""

    name = "oracle"

    def __init__(self, base, feeds, off: int, x: float, xo: float, sigma: float = 0.0, seed: int = 0,  # type: ignore[no-untyped-def]
                 use: str = "both"):
        self.base, self.feeds, self.off = base, feeds, off
        self.x, self.xo, self.sigma, self.seed, self.use = x, xo, sigma, seed, use

    def left(self, k: int, i: int) -> float:
        """Seconds the window of pool ``k`` at step ``i`` has left, as seen."""
        g = self.feeds[k].gap_s
        lo, hi = window_bounds(self.feeds[k].avail, i)
        return seen_length(self.sigma, self.seed, k, lo, (hi - lo) * g) - (i - lo) * g

    def place_pools(self, job, markets):  # type: ignore[no-untyped-def]
        g = self.feeds[0].gap_s
        i = self.off + job.elapsed_s // g
        up = [k for k, m in enumerate(markets) if m.spot_available >= job.nodes]
        if (job.current is Capacity.SPOT and job.pool in up) or not up:
            return self.base.place_pools(job, markets)
        if self.use != "both":
            pl = self.base.place_pools(job, markets)
            if job.current is not Capacity.ONDEMAND:
                return pl
            if self.use == "veto" and pl.capacity is Capacity.SPOT and pl.pool is not None \
                    and self.left(pl.pool, i) < self.xo * job.changeover_s:
                return PoolPlacement(Capacity.ONDEMAND, None, "", 1)
            if self.use == "speed" and pl.capacity is Capacity.ONDEMAND \
                    and safety_form(job, markets[0], 2)[0] >= 0:
                k = max(up, key=lambda j: self.left(j, i))
                if self.left(k, i) >= self.xo * job.changeover_s:
                    return PoolPlacement(Capacity.SPOT, k, "", 1)
            return pl
        if safety_form(job, markets[0], 1)[0] < 0:
            return PoolPlacement(Capacity.ONDEMAND, None, "", 1)
        lefts = {k: self.left(k, i) for k in up}
        best = max(up, key=lambda k: lefts[k])
        left, d = lefts[best], job.changeover_s
        if job.current is Capacity.ONDEMAND:
            ok = left >= self.xo * d
            return PoolPlacement(Capacity.SPOT if ok else Capacity.ONDEMAND, best if ok else None, "", 1)
        if left >= self.x * d:
            return PoolPlacement(Capacity.SPOT, best, "", 1)
        if slack_share_form(job, share(0.12))[0] >= 0:
            return PoolPlacement(Capacity.NONE, None, "", 1)
        return PoolPlacement(Capacity.ONDEMAND, None, "", 1)


def noise_auc(sigma: float, seed: int, d: int = 720, stride_s: int = 120) -> float:
    """AUC of the seen remaining length as a predictor of "lasts 3 d more", sampled as ``window_samples``
    (every ``stride_s`` where a pool has spot younger than 3 d and the window's end is in the trace), all pool sets."""

    xs: list[float] = []
    ys: list[bool] = []
    for _, nodes, traces in pool_sets():
        for k, t in enumerate(align(traces)):
            avail = [c >= nodes for c in t.counts]
            g = t.gap_s
            for i in range(0, len(avail), max(1, stride_s // g)):
                if not avail[i]:
                    continue
                lo, hi = window_bounds(avail, i)
                if lo == 0 or hi >= len(avail) or (i - lo) * g >= 3 * d:
                    continue
                xs.append(seen_length(sigma, seed, k, lo, (hi - lo) * g) - (i - lo) * g)
                ys.append((hi - i) * g >= 3 * d)
    return rank_auc(xs, ys)


def noisy_oracle(sigmas: list[float], half: str, ratios: list[float], starts: int, seed: int, base_name: str,
                 x: float, xo: float, use: str = "both") -> None:
    """``--noise``: the oracle's gap per setting for each error ``sigma``, beside the base policy and the target."""
    base = policy_of(base_name)
    aucs = [noise_auc(s, seed) for s in sigmas]
    print(f"forecast used for: {use}")
    print("| pool set | N | W/D | half | target | policy gap | " + " | ".join(f"oracle, sigma {s:g}" for s in sigmas) + " |")
    print("|" + "---|" * (6 + len(sigmas)))
    meeting = [0] * len(sigmas)
    met_base = rows = 0
    for label, nodes, traces in pool_sets():
        if half != "all" and half_of(label) != half:
            continue
        traces = align(traces)
        for r in ratios:
            s = pool_setting(r, 720, len(traces), nodes)
            w = PoolWorker(traces, [base_name, BEST_POOL_UP, OPTIMUM], s, starts, seed)
            job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
            gaps: list[list[float]] = [[] for _ in sigmas]
            gb, up = [], []
            for off in w.offsets:
                smp = w.run(off)
                for n, sg in enumerate(sigmas):
                    o = run_pools(Oracle(base, w.feeds, off, x, xo, sg, seed, use), job, w.feeds, off,  # type: ignore[arg-type]
                                  s.spot_micros, s.ondemand_micros, w.horizon, use_hints=False)
                    assert o.met
                    gaps[n].append(o.cost_us / smp.optimum_us - 1)
                gb.append(smp.results[base_name].cost_us / smp.optimum_us - 1)
                up.append(smp.results[BEST_POOL_UP].cost_us / smp.optimum_us - 1)
            u, gp = (100 * sum(v) / len(v) for v in (up, gb))
            target = min(10.0, u / 2)
            xs = [100 * sum(v) / len(v) for v in gaps]
            rows += 1
            met_base += gp <= target
            for n, v in enumerate(xs):
                meeting[n] += v <= target
            print(f"| {label} | {nodes} | {r} | {half_of(label)} | {target:.1f}% | {gp:.1f}% | "
                  + " | ".join(f"{v:.1f}%" + ("" if v <= target else " (no)") for v in xs) + " |", flush=True)
    print(f"| settings meeting the target (of {rows}) | | | | | {met_base} | " + " | ".join(map(str, meeting)) + " |")
    print("| AUC of the seen length, lasts 3 d more | | | | | | " + " | ".join(f"{v:.3f}" for v in aucs) + " |")



class _Recorder:
    """Wraps a policy and keeps every answer with the time and how many pools
    had spot (the simulator asks again on every change, so an
    answer holds until the next one)."""

    def __init__(self, policy):  # type: ignore[no-untyped-def]
        self.policy = policy
        self.log: list[tuple[int, int, PoolPlacement]] = []

    def place_pools(self, job, markets):  # type: ignore[no-untyped-def]
        pl = self.policy.place_pools(job, markets)
        self.log.append((job.elapsed_s, sum(m.spot_available >= job.nodes for m in markets), pl))
        return pl


def decompose(half: str, ratios: list[float], starts: int, seed: int, base: str, d: int = 720) -> None:
    """The optimum's and the policy's hours by kind (see the module docstring)."""
    print("| pool set | N | W/D | half | optimum on-demand h | optimum spot h | optimum overhead h | "
          "policy on-demand h | policy spot h | policy overhead h | on-demand with spot: proof / net / other h | "
          "on-demand, every pool out h | waiting h | moves | gap |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, nodes, traces in pool_sets():
        if half != "all" and half_of(label) != half:
            continue
        traces = align(traces)
        g = traces[0].gap_s
        for r in ratios:
            s = pool_setting(r, d, len(traces), nodes)
            w = PoolWorker(traces, [base], s, starts, seed)
            job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
            sp, od = [x * nodes for x in s.spot_micros], s.ondemand_micros * nodes
            acc = [0.0] * 13
            for off in w.offsets:
                av = [f.avail[off: off + w.need] for f in w.feeds]
                _, c0 = solve_pools(av, g, s.work_s, s.deadline_s, d, sp, od)
                _, c_od = solve_pools(av, g, s.work_s, s.deadline_s, d, sp, od + 1)
                _, c_sp = solve_pools(av, g, s.work_s, s.deadline_s, d, [x + 1 for x in sp], od)
                rec = _Recorder(policy_of(base))
                o = run_pools(rec, job, w.feeds, off, s.spot_micros, s.ondemand_micros, w.horizon)  # type: ignore[arg-type]
                spent = [0.0] * 5  # proof, net, other (spot up), every pool out, waiting
                for k, (t, up, pl) in enumerate(rec.log):
                    dt = (rec.log[k + 1][0] if k + 1 < len(rec.log) else t) - t
                    if pl.capacity is Capacity.ONDEMAND and up:
                        why = pl.reason
                        spent[0 if "old enough" in why else 1 if "safety net" in why else 2] += dt
                    elif pl.capacity is Capacity.ONDEMAND:
                        spent[3] += dt
                    elif pl.capacity is Capacity.NONE:
                        spent[4] += dt
                row = [c_od - c0, c_sp - c0, c_od + c_sp - 2 * c0 - s.work_s,
                       o.ondemand_s, sum(o.spot_s), o.ondemand_s + sum(o.spot_s) - s.work_s, *spent]
                for k, x in enumerate(row):
                    acc[k] += x / 3600
                acc[11] += o.moves
                acc[12] += o.cost_us / c0 - 1
            m = [x / len(w.offsets) for x in acc]
            print(f"| {label} | {nodes} | {r} | {half_of(label)} | " + " | ".join(f"{x:.1f}" for x in m[:6])
                  + f" | {m[6]:.1f} / {m[7]:.1f} / {m[8]:.1f} | {m[9]:.1f} | {m[10]:.1f} | {m[11]:.1f} | "
                  f"{100 * m[12]:.1f}% |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=float, default=2)
    ap.add_argument("--xo", type=float, default=3)
    ap.add_argument("--half", choices=("A", "B", "all"), default="A")
    ap.add_argument("--ratios", default="0.6,0.8,0.9")
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base", default="gbroker", help="the policy the oracle falls back on (and is compared with)")
    ap.add_argument("--windows", action="store_true", help="print the window-length predictors and stop")
    ap.add_argument("--fit", action="store_true", help="fit gbroker's window predictor on half A, print it, stop")
    ap.add_argument("--lags", action="store_true",
                    help="print how well the same time a day (or other lag) earlier predicts a window's length, and stop")
    ap.add_argument("--noise", metavar="S1,S2,...",
                    help="run the oracle with each window's length seen through a log-normal error of these sigmas, "
                         "print the gaps and the AUC of such a predictor, and stop")
    ap.add_argument("--noise-use", choices=("both", "speed", "veto"), default="both",
                    help="with --noise: where the forecast goes (both choices, as the oracle; or only to "
                         "shorten, or only to stop, the base policy's moves off on-demand)")
    ap.add_argument("--decompose", action="store_true",
                    help="print where the policy's gap goes against the optimum's hours, per setting, and stop")
    a = ap.parse_args()
    if a.decompose:
        decompose(a.half, [float(x) for x in a.ratios.split(",")], a.starts, a.seed, a.base)
        return
    if a.fit:
        fit_window_model()
        return
    if a.lags:
        lag_predictors()
        return
    if a.windows:
        window_predictors()
        return
    if a.noise is not None:
        noisy_oracle([float(x) for x in a.noise.split(",")], a.half, [float(x) for x in a.ratios.split(",")],
                     a.starts, a.seed, a.base, a.x, a.xo, a.noise_use)
        return
    base = policy_of(a.base)
    print("| pool set | N | W/D | half | UP-best gap | target | policy gap | oracle gap | oracle meets the target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, nodes, traces in pool_sets():
        if a.half != "all" and half_of(label) != a.half:
            continue
        traces = align(traces)
        for r in map(float, a.ratios.split(",")):
            s = pool_setting(r, 720, len(traces), nodes)
            w = PoolWorker(traces, [a.base, BEST_POOL_UP, OPTIMUM], s, a.starts, a.seed)
            gs, gb, up = [], [], []
            for off in w.offsets:
                smp = w.run(off)
                job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
                o = run_pools(Oracle(base, w.feeds, off, a.x, a.xo), job, w.feeds, off,  # type: ignore[arg-type]
                              s.spot_micros, s.ondemand_micros, w.horizon, use_hints=False)
                assert o.met
                gs.append(o.cost_us / smp.optimum_us - 1)
                gb.append(smp.results[a.base].cost_us / smp.optimum_us - 1)
                up.append(smp.results[BEST_POOL_UP].cost_us / smp.optimum_us - 1)
            g, u, x = (100 * sum(v) / len(v) for v in (gb, up, gs))
            target = min(10.0, u / 2)
            print(f"| {label} | {nodes} | {r} | {half_of(label)} | {u:.1f}% | {target:.1f}% | {g:.1f}% | {x:.1f}% | "
                  f"{'yes' if x <= target else '**no**'} |", flush=True)


if __name__ == "__main__":
    main()
