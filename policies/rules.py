"""Deadline arithmetic shared by the policies.

Every policy that promises a deadline uses the same safety net, so the promise
is made in one place: a job may spend the next step off on-demand (idle, or on
spot that could be reclaimed) only while, in the worst case after that step,
starting on-demand would still finish in time.

Also here: ``stable_for``, which turns the linear conditions a policy decided
on into a ``recheck_s`` hint (how long the same answer certainly holds while
only the clock and the job's progress move).
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from policies.base import Action, Capacity, Decision, JobView, MarketView, Placement

Form = tuple[int, int, int]
"""A linear condition: (value now, change per second when idle, change per
second when running). The decision depends on the sign of ``value``
(``value >= 0`` versus ``value < 0``)."""


def work_at_risk_s(job: JobView) -> int:
    """Work left if the job lost everything since its last checkpoint."""
    safe = job.done_s if job.safe_done_s is None else job.safe_done_s
    return max(0, job.work_s - safe)


def slack_s(job: JobView, changeovers: int = 1) -> int | None:
    """Time left minus the work at risk and ``changeovers`` changeovers; None = no deadline."""
    left = job.time_left_s
    if left is None:
        return None
    return left - work_at_risk_s(job) - changeovers * job.changeover_s


def safety_form(job: JobView, market: MarketView, changeovers: int = 1) -> Form | None:
    """The safety net as a linear condition: ``value >= 0`` means the job may
    spend one more step off on-demand."""
    s = slack_s(job, changeovers)
    if s is None:
        return None
    # Idle: time left shrinks, work does not. Running: both shrink (when the
    # checkpoint keeps the work); a job that cannot checkpoint gains no safe work.
    running_rate = 0 if job.safe_done_s is not None else 1
    return (s - market.step_s, -1, -1 + running_rate)


def share(x: float) -> Fraction:
    """A share as an exact fraction (so conditions stay in integers)."""
    return Fraction(x).limit_denominator(1000)


def slack_share_form(job: JobView, ratio: Fraction, changeovers: int = 1) -> Form:
    """``slack - ratio * work at risk >= 0`` as a linear condition (scaled to
    integers), the slack counting ``changeovers`` changeovers.

    Idle: slack drops 1 s per s, the work stays. Running with checkpoints:
    slack stays and the work drops 1 s per s; without, slack drops and the
    work at risk stays.
    """
    s = slack_s(job, changeovers)
    assert s is not None
    p, q = ratio.numerator, ratio.denominator
    value = q * s - p * work_at_risk_s(job)
    running = p if job.safe_done_s is None else -q
    return (value, -q, running)


def needs_ondemand(job: JobView, market: MarketView, changeovers: int = 1) -> bool:
    """True when one more step off on-demand could make the deadline unreachable."""
    form = safety_form(job, market, changeovers)
    return form is not None and form[0] < 0


def stable_for(forms: Iterable[Form | None]) -> int | None:
    """Seconds for which none of the conditions can change sign.

    Progress runs at a rate between 0 (idle or changing over) and 1, so each
    value moves at a rate between its idle and its running rate; the bound is
    the earliest moment any of them could cross zero. None = never.
    """
    best: int | None = None
    for form in forms:
        if form is None:
            continue
        value, idle_rate, run_rate = form
        if value >= 0:
            worst = min(idle_rate, run_rate)
            if worst >= 0:
                continue
            t = value // -worst + 1
        else:
            fastest = max(idle_rate, run_rate)
            if fastest <= 0:
                continue
            t = -(value // fastest)  # ceil(-value / fastest)
        best = t if best is None else min(best, t)
    return best


def placed(capacity: Capacity, reason: str, forms: Iterable[Form | None]) -> Placement:
    """A placement with its recheck hint."""
    stable = stable_for(forms)
    return Placement(capacity, reason, NEVER_CHANGES_S if stable is None else stable)


def spot_usable(job: JobView, market: MarketView) -> bool:
    """Spot capacity for the whole gang is there now (a gang is reclaimed when any node is)."""
    return job.interruptible and market.spot_available >= job.nodes


NEVER_CHANGES_S = 10**9
"""A ``recheck_s`` for answers that depend on nothing that moves with the clock."""


def decision_of(p: Placement) -> Decision:
    """The recovery decision that matches a placement.

    Waiting after a reclaim is "resume on spot": the job goes back to the spot
    queue and starts when capacity returns, which is what waiting means.
    """
    if p.capacity is Capacity.ONDEMAND:
        return Decision(Action.MOVE_ONDEMAND, p.reason)
    if p.capacity is Capacity.SPOT:
        return Decision(Action.RESUME_SPOT, p.reason)
    return Decision(Action.RESUME_SPOT, p.reason + "; resume on spot when it is back")
