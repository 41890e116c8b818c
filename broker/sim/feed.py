"""What a job sees of the spot market over time, replayed from a trace.

A ``SpotFeed`` is built once per (trace, gang size) and answers, for any step,
how many spot instances there are, whether the gang fits, when that next
changes, and what an observer would have learned so far (uptime share and
reclaim rate over a look-back window, time since spot was last there).

The observed numbers are taken as of the last change of availability, so
they stay fixed between two changes: the simulator only has to ask a policy
again when something it can see has changed (see ``Placement.recheck_s``).

Replayed traces and the future. A trace shorter than a job's window is
replayed cyclically, so a step of the trace the job has "seen" may come back
later in its window: history would then be the job's own future. Every
question therefore takes a ``floor``: no step before it counts as history
(uptime, reclaims, run lengths, the age of the current run). The engine sets
it to the end of the job's window minus the trace's length, so no step of
the history is ever replayed inside the window; for a job that does not wrap
the floor is 0 and nothing changes.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from broker.sim.trace import Trace
from policies.base import MarketView

DEFAULT_LOOKBACK_S = 7 * 24 * 3600
"""How far back the observed rates look (the daemon uses the same week)."""


@dataclass(frozen=True)
class MarketStats:
    uptime: float | None
    reclaim_rate_per_hour: float
    lookback_s: int
    windows_s: tuple[int, ...] = ()
    """Completed spot windows inside the look-back (seconds, oldest first)."""
    outages_s: tuple[int, ...] = ()
    """Completed outages inside the look-back (seconds, oldest first)."""


class SpotFeed:
    """Spot availability of one trace for a gang of ``nodes`` instances.

    The trace is unrolled cyclically to ``length`` steps so that a window may
    start anywhere and run past the end of a short trace.
    """

    def __init__(self, trace: Trace, nodes: int, length: int, lookback_s: int = DEFAULT_LOOKBACK_S):
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        self.trace = trace
        self.nodes = nodes
        self.gap_s = trace.gap_s
        n = trace.steps
        length = max(length, n)
        counts = [trace.counts[i % n] for i in range(length)]
        self.counts = counts
        avail = [c >= nodes for c in counts]
        self.avail = avail
        self.lookback_steps = max(1, lookback_s // trace.gap_s)
        # Prefix sums: steps with the gang available, and reclaims (available -> not).
        self._up = [0, *accumulate(int(a) for a in avail)]
        rec = [0] + [int(avail[i - 1] and not avail[i]) for i in range(1, length)]
        self._rec = [0, *accumulate(rec)]
        # Where the count changes (next) and where availability last changed.
        nxt = [length] * length
        for i in range(length - 2, -1, -1):
            nxt[i] = i + 1 if counts[i + 1] != counts[i] else nxt[i + 1]
        self.next_change = nxt
        last = [0] * length
        for i in range(1, length):
            last[i] = i if avail[i] != avail[i - 1] else last[i - 1]
        self.last_avail_change = last
        # Runs of equal availability: start steps (the first run is cut by the
        # start of the trace, so it is never counted as a whole window).
        self._run_starts = [i for i in range(1, length) if avail[i] != avail[i - 1]]
        self._stats_cache: dict[tuple[int, int], MarketStats] = {}

    def __len__(self) -> int:
        return len(self.counts)

    def stats(self, i: int, floor: int = 0) -> MarketStats:
        """What an observer knows at step i: the look-back window up to the last
        change, never reaching before step ``floor``."""
        at = max(self.last_avail_change[i], floor)
        lo = max(0, floor, at - self.lookback_steps)
        hit = self._stats_cache.get((at, lo))
        if hit is not None:
            return hit
        span = at - lo
        if span <= 0:
            st = MarketStats(None, 0.0, 0)
        else:
            up = self._up[at] - self._up[lo]
            rec = self._rec[at] - self._rec[lo + 1] if at > lo + 1 else 0
            rate = rec / (up * self.gap_s / 3600) if up else (float(rec > 0) * 1e9)
            windows, outages = self._runs(lo, at)
            st = MarketStats(up / span, rate, span * self.gap_s, windows, outages)
        self._stats_cache[(at, lo)] = st
        return st

    def _runs(self, lo: int, at: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Lengths of the runs that started at or after ``lo`` and ended by ``at``."""
        starts = self._run_starts
        k = bisect_left(starts, lo)
        windows: list[int] = []
        outages: list[int] = []
        while k + 1 < len(starts) and starts[k + 1] <= at:
            a, b = starts[k], starts[k + 1]
            (windows if self.avail[a] else outages).append((b - a) * self.gap_s)
            k += 1
        return tuple(windows), tuple(outages)

    def history_floor(self, offset: int, window_steps: int) -> int:
        """The first step a job submitted at ``offset`` with a window of
        ``window_steps`` may count as history: no earlier step of the trace is
        replayed inside its window (0 for a job whose window does not wrap)."""
        return max(0, offset + window_steps - self.trace.steps)

    def market(self, i: int, spot_micros: int, ondemand_micros: int, floor: int = 0) -> MarketView:
        st = self.stats(i, floor)
        age = (i - max(self.last_avail_change[i], floor)) * self.gap_s if i >= floor else 0
        down = 0 if self.avail[i] else age
        up = age if self.avail[i] else 0
        return MarketView(
            spot_available=self.counts[i],
            spot_price_micros=spot_micros,
            ondemand_price_micros=ondemand_micros,
            spot_reclaim_rate_per_hour=st.reclaim_rate_per_hour,
            step_s=self.gap_s,
            spot_uptime_fraction=st.uptime,
            lookback_s=st.lookback_s,
            spot_down_s=down,
            spot_up_s=up,
            spot_windows_s=st.windows_s,
            spot_outages_s=st.outages_s,
        )
