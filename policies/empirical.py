"""What the observed spot windows and outages say about the current one.

Spot markets are not memoryless: many windows are shorter than a changeover
while a few last for days, and an outage that has already lasted long tends
to last longer still. A fixed rate (``policies.markov``) cannot see that. The
lengths of the windows and outages observed in the look-back give, without
any assumed shape, the expected time left of the current one given its age
(the mean residual life): the mean of ``x - age`` over the observed lengths
``x`` longer than ``age``.

Pure functions; the summaries of a list of lengths are cached by the list.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate

MIN_SAMPLES = 4
"""Fewer observed lengths beyond the current age than this: no estimate."""


@lru_cache(maxsize=256)
def _summary(lengths: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    xs = tuple(sorted(lengths))
    return xs, (0, *accumulate(xs))


def residual_s(lengths: tuple[int, ...], age_s: int, min_samples: int = MIN_SAMPLES) -> float | None:
    """Expected seconds left of a run that has lasted ``age_s``, from observed run lengths.

    None when fewer than ``min_samples`` observed runs lasted longer than
    ``age_s`` (too little evidence; the caller falls back on its rate model).
    """
    if not lengths:
        return None
    xs, prefix = _summary(lengths)
    k = bisect_right(xs, age_s)
    n = len(xs) - k
    if n < min_samples:
        return None
    return (prefix[-1] - prefix[k]) / n - age_s


def mean_s(lengths: tuple[int, ...], min_samples: int = MIN_SAMPLES) -> float | None:
    """Mean observed run length (every run lasts at least a second); None with fewer than ``min_samples`` runs."""
    return residual_s(lengths, 0, min_samples) if lengths else None


def residual_stable_s(lengths: tuple[int, ...], age_s: int, factor: float) -> int | None:
    """Seconds for which ``residual_s`` quantised to powers of ``factor`` stays the same.

    Between two observed lengths the residual falls one second per second of
    age; it jumps when the age passes an observed length. None = it never
    changes (no estimate now and none to come).
    """
    if not lengths:
        return None
    xs, _ = _summary(lengths)
    k = bisect_right(xs, age_s)
    if k >= len(xs):
        return None
    until_jump = xs[k] - age_s
    r = residual_s(lengths, age_s)
    if r is None:
        return max(1, until_jump)
    r = max(r, 1.0)
    bucket = round(math.log(r) / math.log(factor))
    floor = factor ** (bucket - 0.5)
    return max(1, min(until_jump, math.floor(r - floor)))
