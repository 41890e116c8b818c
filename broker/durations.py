"""Durations: the one reader for job time limits, relative times and Slurm's output.

Slurm's grammar, as ``sbatch --time`` reads it: a bare number is *minutes*
("90" = 1h30m); "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" and "D-HH:MM:SS".
Unit forms work too: "90s", "45m", "2h", "1h30m", "2d" (days, hours, minutes,
seconds in that order; any of them may be left out; case is ignored).

Standard library only: ``gbroker submit`` imports this through ``broker.spec``.
"""

from __future__ import annotations

import re

UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_HELP = 'e.g. "90s", "45m", "2h", "1h30m", "2d", "02:00:00", "1-02:00:00" (a bare number is minutes, as in Slurm)'

_UNIT_RE = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_CLOCK_RE = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")
"""ASCII digits only: ``\\d`` and ``str.isdigit`` take other scripts' digits (and "²", which int() refuses)."""


def parse_duration(text: str, *, strict: bool = True) -> int:
    """A duration string -> whole seconds. Raises ValueError with a short reason.

    ``strict`` (people's input): in the clock forms, minutes after an hour and
    seconds must be 0-59. ``strict=False`` reads what Slurm prints and, like
    Slurm, takes larger values as they are ("1:75:00" = 2h15m).
    """
    s = text.strip().lower()
    if not s:
        raise ValueError("empty")
    if s.isascii() and s.isdigit():
        return int(s) * 60
    m = _UNIT_RE.fullmatch(s)
    if m and any(m.groups()):
        return sum(int(v) * UNIT_SECONDS[u] for v, u in zip(m.groups(), "dhms", strict=True) if v)
    m = _CLOCK_RE.fullmatch(s)
    if m:
        days, a, b, c = m.groups()
        if days is None and c is None:
            hours, minutes, seconds = 0, int(a), int(b or 0)  # MM:SS
        else:
            hours, minutes, seconds = int(a), int(b or 0), int(c or 0)  # [D-]HH[:MM[:SS]]
            if strict and minutes > 59:
                raise ValueError("minutes after an hour must be 0-59")
        if strict and seconds > 59:
            raise ValueError("seconds must be 0-59")
        return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    if re.fullmatch(r"[0-9]+h[0-9]+", s):
        raise ValueError(f"the minutes need their unit: write {s}m")
    raise ValueError("not a duration")


def format_duration(seconds: int) -> str:
    """3600 -> '1h', 5400 -> '1h30m', 90061 -> '1d1h1m1s' (``parse_duration`` reads it back)."""
    if seconds <= 0:
        return "0s"
    parts = []
    for unit in "dhms":
        q, seconds = divmod(seconds, UNIT_SECONDS[unit])
        if q:
            parts.append(f"{q}{unit}")
    return "".join(parts)
