"""Run one job under one policy on a replayed spot market.

The model is the one of "Can't Be Late" (Wu et al., NSDI 2024):

- time moves in steps of the trace (``gap_s``); at the start of every step the
  job is on spot, on on-demand, or waiting (waiting costs nothing);
- spot can be used in a step only if the trace offers the whole gang; a job on
  spot whose gang is gone at the start of a step was reclaimed in between;
- each time the job starts on a new instance (first start, after a reclaim,
  when moving spot <-> on-demand) it pays a changeover of ``changeover_s``
  before it progresses again; the changeover includes the work lost since the
  last checkpoint. A job that cannot checkpoint also loses all its progress
  whenever an attempt ends before the job does;
- on-demand is always there; money is paid per second used, the last step
  only up to the moment the work is done.

The policy is asked at the first step, after every reclaim (``on_preempt``),
whenever the spot count changes, after it changed the job's capacity, and
when the ``recheck_s`` of its last answer runs out. Between those moments
its answer cannot change (the policies' hints are checked against asking every
step in the tests), so the simulator jumps ahead instead of stepping.

Money: ``cost_us`` is exact, in micro-units x seconds per hour (price per
GPU-hour x GPUs x seconds); divide by 3600 once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.sim.feed import SpotFeed
from policies.base import (
    Action,
    AttemptView,
    Capacity,
    JobView,
    Placement,
    Policy,
)


class ContractViolation(RuntimeError):
    """A policy broke the placement contract (e.g. spot for a non-interruptible job)."""


@dataclass(frozen=True)
class SimJob:
    work_s: int
    deadline_s: int | None
    changeover_s: int
    nodes: int = 1
    gpus_per_node: int = 1
    kind: str = "other"
    interruptible: bool = True
    checkpointable: bool = True
    budget_left_micros: int | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Prices:
    """Per GPU-hour, micro-units (the policy interface's unit)."""

    spot_micros: int
    ondemand_micros: int


@dataclass
class Outcome:
    finished_s: int | None
    """Seconds from submission to the end of the work (None: not within the horizon)."""
    deadline_met: bool
    cost_us: int
    """Exact cost in micro-units x seconds / hour; ``cost_micros`` rounds it."""
    spot_s: int = 0
    ondemand_s: int = 0
    reclaims: int = 0
    lost_s: int = 0
    """Seconds paid without progress because of reclaims (the restart after a
    reclaim, and work a job without checkpoints had to redo)."""
    calls: int = 0
    runs: list[tuple[int, int, Capacity]] = field(default_factory=list)

    @property
    def cost_micros(self) -> int:
        q, r = divmod(self.cost_us, 3600)
        return q + (1 if 2 * r >= 3600 else 0)


def run_job(
    policy: Policy,
    job: SimJob,
    feed: SpotFeed,
    offset: int,
    prices: Prices,
    horizon_steps: int,
    *,
    use_hints: bool = True,
    record_runs: bool = False,
    history_floor: int | None = None,
) -> Outcome:
    """Simulate ``job`` submitted at step ``offset`` of ``feed`` for at most ``horizon_steps`` steps.

    A job still unfinished at the horizon is finished on on-demand on paper
    (one changeover plus the work left, charged at the on-demand price) and
    counts as having missed its deadline.

    ``history_floor``: the first step the policy may see as history (see
    ``SpotFeed.history_floor``); by default the end of the job's window
    (its deadline, or the horizon without one) minus the trace's length, so
    a replayed trace never shows the job its own future.
    """
    g = feed.gap_s
    d = job.changeover_s
    W = job.work_s
    gpus = job.gpus
    sp_rate = prices.spot_micros * gpus
    od_rate = prices.ondemand_micros * gpus
    counts = feed.counts
    nxt_change = feed.next_change
    end_step = offset + horizon_steps
    if end_step > len(feed):
        raise ValueError("feed too short for this horizon; build it longer")
    if history_floor is None:
        window = horizon_steps if job.deadline_s is None else -(-job.deadline_s // g)
        history_floor = feed.history_floor(offset, window)
    floor = history_floor

    done = 0
    safe = 0
    cur = Capacity.NONE
    overhead = 0
    after_reclaim = False
    reclaims = 0
    history: list[AttemptView] = []
    att_start = 0
    att_lost = 0
    cost = spot_s = od_s = lost = calls = 0
    answer = Capacity.NONE
    next_call = offset
    last_count = -1
    finished: int | None = None
    runs: list[tuple[int, int, Capacity]] = []

    def view(t: int) -> JobView:
        return JobView(
            kind=job.kind,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            interruptible=job.interruptible,
            checkpointable=job.checkpointable,
            work_s=W,
            done_s=done,
            elapsed_s=t,
            deadline_s=job.deadline_s,
            changeover_s=d,
            current=cur,
            reclaims=reclaims,
            budget_left_micros=job.budget_left_micros,
            safe_done_s=None if job.checkpointable else safe,
        )

    i = offset
    while i < end_step:
        t = (i - offset) * g
        count = counts[i]
        avail = count >= job.nodes
        changed_capacity = False
        if cur is Capacity.SPOT and not avail:
            # Reclaimed during the last step.
            history.append(AttemptView(Capacity.SPOT, t - att_start, "reclaimed", att_lost))
            if record_runs:
                runs.append((att_start, t, Capacity.SPOT))
            if not job.checkpointable:
                lost += done - safe
                done = safe
            cur = Capacity.NONE
            reclaims += 1
            after_reclaim = True
            calls += 1
            dec = policy.on_preempt(view(t), tuple(history), feed.market(i, prices.spot_micros, prices.ondemand_micros, floor))
            answer = _capacity_of(dec.action)
            hint: int | None = None
            next_call = i + 1
        elif i >= next_call or count != last_count:
            calls += 1
            pl: Placement = policy.place(view(t), feed.market(i, prices.spot_micros, prices.ondemand_micros, floor))
            answer = pl.capacity
            hint = pl.recheck_s
            next_call = i + 1 if not use_hints or hint is None else i + max(1, hint // g)
        last_count = count

        want = answer
        if want is Capacity.SPOT:
            if not job.interruptible:
                raise ContractViolation(f"{policy.name} placed a non-interruptible job on spot")
            if not avail:
                want = Capacity.NONE
        if want is not cur:
            changed_capacity = True
            if cur is not Capacity.NONE:
                history.append(AttemptView(cur, t - att_start, "stopped", att_lost))
                if record_runs:
                    runs.append((att_start, t, cur))
                if not job.checkpointable:
                    lost += done - safe
                    done = safe
                after_reclaim = False
            if want is not Capacity.NONE:
                overhead = d
                att_start = t
                att_lost = 0
            else:
                after_reclaim = after_reclaim  # still waiting after a reclaim
            cur = want
        if changed_capacity:
            next_call = i + 1  # the job's own state changed: ask again next step

        stop = min(next_call, nxt_change[i], end_step)
        span = (stop - i) * g
        if cur is not Capacity.NONE:
            need = W - done
            productive = span - overhead
            rate = sp_rate if cur is Capacity.SPOT else od_rate
            if productive >= need:
                used = overhead + need
                _charge = rate * used
                cost += _charge
                if cur is Capacity.SPOT:
                    spot_s += used
                else:
                    od_s += used
                if after_reclaim:
                    lost += overhead
                    att_lost += overhead
                finished = t + used
                if record_runs:
                    runs.append((att_start, finished, cur))
                break
            consumed = min(span, overhead)
            if after_reclaim:
                lost += consumed
                att_lost += consumed
                if consumed == overhead:
                    after_reclaim = False
            done += max(0, productive)
            overhead -= consumed
            cost += rate * span
            if cur is Capacity.SPOT:
                spot_s += span
            else:
                od_s += span
        i = stop

    if finished is None:
        # Not done within the horizon: finish on on-demand on paper, late.
        left = W - safe if not job.checkpointable else W - done
        extra = (left + d) if cur is not Capacity.ONDEMAND else (left + overhead)
        cost += od_rate * extra
        od_s += extra
        met = False
    else:
        met = job.deadline_s is None or finished <= job.deadline_s
    return Outcome(
        finished_s=finished,
        deadline_met=met,
        cost_us=cost,
        spot_s=spot_s,
        ondemand_s=od_s,
        reclaims=reclaims,
        lost_s=lost,
        calls=calls,
        runs=runs,
    )


def _capacity_of(action: Action) -> Capacity:
    if action is Action.MOVE_ONDEMAND:
        return Capacity.ONDEMAND
    if action is Action.RESUME_SPOT:
        return Capacity.SPOT
    return Capacity.NONE
