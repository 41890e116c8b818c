"""Issue 15, tenth round: a rollout of gbroker's own rule over resampled futures.

Every earlier round changed the rule's form by hand (proofs, expected
values, predictors, budgets). This one asks the rule itself: where gbroker
would keep a job on on-demand to prove a young spot window, the job's
future is resampled from what the pools showed so far (each pool an
alternating run of windows and outages drawn from its own observed ones,
the current window's rest drawn from the observed windows longer than its
age), and the two choices, leave now or keep proving, are played out to
the end of the job under gbroker's rule on the same futures. The job
leaves when leaving is cheaper on average. This is one step of policy
improvement (a rollout) with the empirical past as the model: it prices
the deadline, the slack and the changeovers together, where the expected
value rule of the third round priced windows alone.

    PYTHONPATH=. python tests/bench/rollout_pools.py --sets A --starts 30 --seed 1 \
        --variants 'scenarios=16' 'scenarios=16;margin=0.02'

Prints, per setting with d = 0.2 h, the gap of gbroker and of each variant
and whether they meet the target, then the mean per half.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pools import RATIOS, half_of, meets_target, pool_sets, pool_setting  # noqa: E402

from broker.sim.pools import BEST_POOL_UP, align, simulate_pools, summarize_pools  # noqa: E402
from policies.base import Capacity, JobView, MarketView, PoolPlacement, register  # noqa: E402
from policies.gbroker import GBrokerPolicy  # noqa: E402
from policies.rules import spot_usable  # noqa: E402

PROVING = "no pool's spot window old enough to leave on-demand for"
"""The reason gbroker gives when it keeps a job on on-demand to prove a window."""


def _draws(rng: random.Random, pool: Sequence[int], age: float, mean: float) -> float:
    """The rest of a phase that has lasted ``age``: an observed length longer than
    the age, less the age; with none longer, memoryless at the mean."""
    longer = [x for x in pool if x > age]
    if longer:
        return rng.choice(longer) - age
    return rng.expovariate(1 / max(mean, 60.0))


def future(rng: random.Random, m: MarketView, nodes: int, windows: Sequence[int], outages: Sequence[int],
           horizon: float) -> tuple[bool, float, list[float]]:
    """One resampled future of a pool: (up now, the current phase's start, times of changes)."""
    up = m.spot_available >= nodes
    age = float((m.spot_up_s if up else m.spot_down_s) or 0)
    w_mean = sum(windows) / len(windows) if windows else 3600.0
    o_mean = sum(outages) / len(outages) if outages else 3600.0
    t = _draws(rng, windows if up else outages, age, w_mean if up else o_mean)
    changes = [t]
    renew(rng, changes, t, not up, windows, outages, horizon, lambda state: rng.expovariate(
        1 / (w_mean if state else o_mean)))
    return up, -age, changes


def renew(rng: random.Random, changes: list[float], t: float, state: bool, windows: Sequence[int],
          outages: Sequence[int], horizon: float, empty: Callable[[bool], float]) -> None:
    """Append to ``changes`` the ends of phases drawn from the observed ones, alternating from
    ``state`` at time ``t`` until past ``horizon`` (``empty`` gives a length when none was
    observed), then a sentinel no job reaches."""
    while t < horizon:
        src = windows if state else outages
        t += rng.choice(src) if src else empty(state)
        changes.append(t)
        state = not state
    changes.append(1e18)


def timeline(m: MarketView, nodes: int) -> tuple[bool, list[float]]:
    """A pool's past as far as its market view tells it: (up now, the times of
    its changes, oldest first, in seconds before now as negative numbers; the
    last is the start of the current phase)."""
    up = m.spot_available >= nodes
    t = -float((m.spot_up_s if up else m.spot_down_s) or 0)
    toggles = [t]
    ws, os_ = list(m.spot_windows_s), list(m.spot_outages_s)
    prev_up = not up
    while (ws if prev_up else os_):
        t -= (ws if prev_up else os_).pop()
        toggles.append(t)
        prev_up = not prev_up
    return up, toggles[::-1]


def _state_at(up_now: bool, toggles: Sequence[float], tau: float) -> tuple[bool, float]:
    """(up, phase start) at past time ``tau`` (``toggles[0] <= tau < 0``)."""
    j = bisect.bisect_right(toggles, tau) - 1
    flips = len(toggles) - 1 - j
    return (up_now if flips % 2 == 0 else not up_now), toggles[j]


def analog_futures(markets: Sequence[MarketView], nodes: int, best: int, d: float, step: float) -> list[float]:
    """Past times that look like now: every pool in the state it is in now, and
    the pool ``best`` up with a window between its age now and a changeover
    older. Their sequels are futures with the pools' correlation kept."""
    lines = [timeline(m, nodes) for m in markets]
    t0 = max(tl[1][0] for tl in lines)
    age = float(markets[best].spot_up_s or 0)
    out = []
    tau = t0
    while tau < -d:
        ok = True
        for k, (u, tg) in enumerate(lines):
            st, start = _state_at(u, tg, tau)
            if st != u or (k == best and not age <= tau - start <= age + d):
                ok = False
                break
        if ok:
            out.append(tau)
        tau += step
    return out


class Rollout:
    """gbroker's pool rule, simplified, played out over one resampled future.

    Capacity: 0 waiting, 1 on-demand, 2 spot. The rule: spot stays while its
    pool is up; after a reclaim or while waiting, spot in the pool with the
    oldest window, else on-demand once the slack is under ``ratio`` of the
    work left, else wait; on-demand leaves for a window once it has lasted
    ``prove`` s; the safety net moves to on-demand for good when the time
    left would not cover the work, a changeover and one step more.
    """

    def __init__(self, d: float, od: float, sp: Sequence[float], prove: float, ratio: float, step: float):
        self.d, self.od, self.sp, self.prove, self.ratio, self.step = d, od, sp, prove, ratio, step

    def run(self, fut: Sequence[tuple[bool, float, list[float]]], work: float, left: float,
            cap: int, pool: int, ov: float) -> float:
        d, od, sp, prove, ratio, step = self.d, self.od, self.sp, self.prove, self.ratio, self.step
        P = len(fut)
        up = [f[0] for f in fut]
        start = [f[1] for f in fut]
        idx = [0] * P
        t = 0.0
        money = 0.0
        w = work
        stuck = False
        while True:
            # decide
            if not stuck and cap != 1 and left - t < w + (ov + d if cap == 2 else 2 * d) + step:
                stuck = True
                if cap != 1:
                    cap, ov = 1, d
            if not stuck:
                if cap == 2 and not up[pool]:
                    cap = 0
                if cap != 2:
                    ups = [k for k in range(P) if up[k]]
                    best = min(ups, key=lambda k: start[k]) if ups else -1
                    if cap == 0:
                        if best >= 0:
                            cap, pool, ov = 2, best, d
                        elif left - t - w - d < ratio * w:
                            cap, ov = 1, d
                    elif cap == 1 and best >= 0 and t - start[best] >= prove and left - t - w >= 3 * d + step:
                        cap, pool, ov = 2, best, d
            # next event: a change in some pool, or a time the rule acts at
            nxt = min(fut[k][2][idx[k]] for k in range(P))
            if not stuck and cap == 1:
                ups = [k for k in range(P) if up[k]]
                if ups:
                    ready = min(start[k] for k in ups) + prove
                    if ready > t:
                        nxt = min(nxt, ready)
            elif not stuck and cap == 0:
                for due in (left - w - d - ratio * w, left - w - 2 * d - step):
                    if due > t:
                        nxt = min(nxt, due)
            if cap:
                rate = od if cap == 1 else sp[pool]
                if t + ov + w <= nxt:
                    money += rate * (ov + w)
                    t += ov + w
                    return money if t <= left + 1e-6 else money + 1e12
                dt = nxt - t
                money += rate * dt
                w -= max(0.0, dt - ov)
                ov = max(0.0, ov - dt)
            elif t > left + 1e-6:
                return money + 1e12
            t = max(nxt, t + 1e-3)
            for k in range(P):
                ch = fut[k][2]
                while ch[idx[k]] <= t:
                    up[k] = not up[k]
                    start[k] = ch[idx[k]]
                    idx[k] += 1


DIAG: list[tuple[float, float, int]] = []
"""With ``diagnose``: (predicted, true) cost of leaving less that of staying, analog candidates."""

_NOW: tuple = ()
"""(feeds, offset) of the job being simulated, for the oracle check only."""


def _patch() -> None:
    import broker.sim.pools as sp

    real = sp.run_pools

    def run(policy, job, feeds, offset, *a, **k):  # type: ignore[no-untyped-def]
        global _NOW
        _NOW = (feeds, offset)
        return real(policy, job, feeds, offset, *a, **k)

    sp.run_pools = run  # type: ignore[assignment]


_patch()


@register
class GBrokerRolloutPolicy(GBrokerPolicy):
    name = "gbroker-rollout"
    description = "gbroker, leaving on-demand for a young window when a rollout over resampled futures says so"

    def __init__(self, scenarios: int = 16, margin: float = 0.0, checks: float = 1.0, seed: int = 0,
                 oracle: bool = False, analog: bool = False, analog_min: int = 3, diagnose: bool = False,
                 **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.oracle = oracle
        self.analog = analog
        self.analog_min = analog_min
        self.diagnose = diagnose
        self.scenarios = scenarios
        self.margin = margin
        self.checks = checks
        """Decide again every ``checks`` changeovers of a window's age."""
        self.seed = seed
        self._memo: dict[tuple[int, ...], bool] = {}
        self._job: tuple[int, ...] = ()
        self._last_t = -1

    def place_pools(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement:
        base = super().place_pools(job, markets)
        if job.current is not Capacity.ONDEMAND or base.capacity is not Capacity.ONDEMAND or base.reason != PROVING:
            return base
        key = (job.work_s, job.deadline_s or 0, job.changeover_s)
        if key != self._job or job.elapsed_s < self._last_t:
            self._memo.clear()
            self._job = key
        self._last_t = job.elapsed_s
        up = [j for j, m in enumerate(markets) if spot_usable(job, m)]
        best = max(up, key=lambda j: (markets[j].spot_up_s or 0, -markets[j].spot_reclaim_rate_per_hour, -j))
        d = job.changeover_s
        age = markets[best].spot_up_s or 0
        born = job.elapsed_s - age
        step = max(1, int(self.checks * d))
        memo = (best, born, age // step)
        if memo not in self._memo:
            self._memo[memo] = self._leave_pays(job, markets, best)
        if self._memo[memo]:
            return PoolPlacement(Capacity.SPOT, best, "a rollout over resampled futures: leave on-demand now")
        return PoolPlacement(base.capacity, None, base.reason, max(1, step - age % step))

    def _leave_pays(self, job: JobView, markets: Sequence[MarketView], best: int) -> bool:
        if self.oracle and _NOW:
            stay, leave = self._oracle_costs(job, markets, best)
            return leave < stay
        left = float(job.time_left_s or 0)
        work = float(job.work_left_s)
        d = float(job.changeover_s)
        sim = self._rollout(job, markets)
        all_w = [x for m in markets for x in m.spot_windows_s]
        all_o = [x for m in markets for x in m.spot_outages_s]
        rng = random.Random(hash((self.seed, job.elapsed_s, best, job.work_s)))
        stay = leave = 0.0
        taus = analog_futures(markets, job.nodes, best, d, float(markets[0].step_s)) if self.analog else []
        lines = [timeline(m, job.nodes) for m in markets] if taus else []
        for _ in range(self.scenarios):
            fut = []
            tau = rng.choice(taus) if len(taus) >= self.analog_min else None
            for k, m in enumerate(markets):
                ws = m.spot_windows_s if len(m.spot_windows_s) >= 4 else all_w
                os_ = m.spot_outages_s if len(m.spot_outages_s) >= 4 else all_o
                if tau is None:
                    fut.append(future(rng, m, job.nodes, ws, os_, left + 1))
                    continue
                u, tg = lines[k]
                st, _ = _state_at(u, tg, tau)
                ch = [x - tau for x in tg if x > tau]
                if ch and ch[-1] >= -tau - 1e-9:
                    ch.pop()  # the start of the current phase: the replay ends there
                renew(rng, ch, -tau, st if len(ch) % 2 == 0 else not st, ws, os_, left + 1, lambda _: 3600.0)
                fut.append((u, -float((m.spot_up_s if u else m.spot_down_s) or 0), ch))
            stay += sim.run(fut, work, left, 1, 0, 0.0)
            leave += sim.run(fut, work, left, 2, best, d)
        if self.diagnose and _NOW:
            true = self._oracle_costs(job, markets, best)
            DIAG.append(((leave - stay) / self.scenarios, true[1] - true[0], len(taus)))
        return leave < stay * (1 - self.margin)

    def _oracle_costs(self, job: JobView, markets: Sequence[MarketView], best: int) -> tuple[float, float]:
        """The same rollout on the true future (a check of the rollout, not a policy)."""
        feeds, offset = _NOW
        g = feeds[0].gap_s
        i0 = offset + job.elapsed_s // g
        left = float(job.time_left_s or 0)
        fut = []
        for m, f in zip(markets, feeds, strict=True):
            up = f.counts[i0] >= job.nodes
            age = float((m.spot_up_s if up else m.spot_down_s) or 0)
            ch = []
            i = i0
            end = min(len(f.counts) - 1, i0 + int(left // g) + 2)
            while i < end:
                i = f.next_change[i]
                if i >= end:
                    break
                if (f.counts[i] >= job.nodes) != (f.counts[i - 1] >= job.nodes):
                    ch.append(float((i - i0) * g))
            ch.append(1e18)
            fut.append((up, -age, ch))
        sim = self._rollout(job, markets)
        stay = sim.run(fut, float(job.work_left_s), left, 1, 0, 0.0)
        leave = sim.run(fut, float(job.work_left_s), left, 2, best, float(job.changeover_s))
        return stay, leave

    def _rollout(self, job: JobView, markets: Sequence[MarketView]) -> Rollout:
        """gbroker's rule for this job and these prices, in money per second."""
        d = float(job.changeover_s)
        od = markets[0].ondemand_price_micros * job.gpus / 3600
        sp = [m.spot_price_micros * job.gpus / 3600 for m in markets]
        return Rollout(d, od, sp, self.pool_prove_changeovers * d, float(self.od_ratio), float(markets[0].step_s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sets", choices=("A", "B", "all"), default="A")
    ap.add_argument("--changeover", type=int, default=720)
    ap.add_argument("--variants", nargs="*", default=["scenarios=16"],
                    help="options of gbroker-rollout, each as key=value;key=value (JSON values); "
                         "diagnose=true prints its figures with --workers 1 only")
    args = ap.parse_args()
    names = ["gbroker"]
    for v in args.variants:
        opts = {k: json.loads(x) for k, x in (kv.split("=", 1) for kv in v.split(";") if kv)}
        names.append("gbroker-rollout@" + ";".join(f"{k}={json.dumps(x)}" for k, x in opts.items()))
    started = time.monotonic()
    sets = [x for x in pool_sets() if args.sets == "all" or half_of(x[0]) == args.sets]
    print("| pool set | N | W/D | half | UP-best gap | " + " | ".join(f"{n} gap" for n in names) + " |")
    print("|" + "---|" * (5 + len(names)))
    tally: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for label, nodes, traces in sets:
        traces = align(traces)
        for ratio in RATIOS:
            s = pool_setting(ratio, args.changeover, len(traces), nodes)
            samples = simulate_pools(traces, [BEST_POOL_UP, *names], s, starts=args.starts, seed=args.seed,
                                     workers=args.workers)
            rows = {r["policy"]: r for r in summarize_pools(samples, [BEST_POOL_UP, *names], [t.name for t in traces])}
            cells = []
            for n in names:
                ok = meets_target(rows[n], rows[BEST_POOL_UP])
                tally.setdefault((half_of(label), n), []).append((rows[n]["gap_to_optimal_mean"], ok))
                cells.append(f"{100 * rows[n]['gap_to_optimal_mean']:.1f}%{'' if ok else ' (no)'}"
                             + ("" if rows[n]["deadline_met"] == 1.0 else f" met {100 * rows[n]['deadline_met']:.0f}%"))
            print(f"| {label} | {nodes} | {ratio} | {half_of(label)} | "
                  f"{100 * rows[BEST_POOL_UP]['gap_to_optimal_mean']:.1f}% | " + " | ".join(cells) + " |", flush=True)
    print("\n| half | policy | mean gap | settings meeting the target |\n|---|---|---|---|")
    for (half, n), xs in sorted(tally.items()):
        print(f"| {half} | {n} | {100 * sum(g for g, _ in xs) / len(xs):.2f}% | {sum(ok for _, ok in xs)} of {len(xs)} |")
    if DIAG:
        n = len(DIAG)
        pred = sum(p for p, _, _ in DIAG) / n
        true = sum(t for _, t, _ in DIAG) / n
        agree = sum((p < 0) == (t < 0) for p, t, _ in DIAG) / n
        print(f"\ndecisions {n}: mean predicted leave - stay {pred / 1e6:+.3f} $, true {true / 1e6:+.3f} $; "
              f"sign agrees {agree:.2f}; leave truly cheaper {sum(t < 0 for _, t, _ in DIAG) / n:.2f}, "
              f"predicted {sum(p < 0 for p, _, _ in DIAG) / n:.2f}; analog candidates mean "
              f"{sum(c for _, _, c in DIAG) / n:.0f}")
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
