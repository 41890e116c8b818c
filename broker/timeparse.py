"""Times people write (semester days, price dates, report windows): one reader.

Accepted forms:

* ``now``;
* a time relative to now: ``+`` or ``-`` and a duration in the grammar of
  ``broker.durations`` (``+10m``, ``-7d``, ``+1h30m``; a bare number is
  minutes, as in Slurm: ``+90``);
* a date, ``2026-09-01``: midnight at its start in ``tz`` (UTC unless the
  caller passes the lab's zone), or with ``end_of_day`` the first second of
  the next day (as for a semester's last day);
* an ISO-8601 date-time, ``2026-09-01T08:00:00Z`` or with an offset; without
  one it is in ``tz``.

The answer is timezone-aware and exact; callers round or convert it as their
field needs. Standard library only.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, tzinfo

from broker.durations import parse_duration

FORMS_HINT = "write 2026-09-01, 2026-09-01T08:00:00Z, now, +10m or -7d"


def parse_when(text: str, now: datetime, *, end_of_day: bool = False, tz: tzinfo = UTC) -> datetime:
    """``text`` as a point in time; ``now`` anchors ``now`` and relative times.

    Raises ValueError with a short reason when ``text`` is none of the forms
    (or lies outside the dates Python can hold).
    """
    t = text.strip()
    if t == "now":
        return now
    try:
        if t[:1] in ("+", "-"):
            offset = timedelta(seconds=parse_duration(t[1:]))
            return now + offset if t[0] == "+" else now - offset
        if len(t) == 10:
            try:
                d = date.fromisoformat(t)
            except ValueError:
                pass  # not a date; perhaps a compact date-time
            else:
                if end_of_day:
                    d += timedelta(days=1)  # the next day's midnight, in the zone (a day may be 23 or 25 h)
                return datetime(d.year, d.month, d.day, tzinfo=tz)
        when = from_iso(t)
    except OverflowError:
        raise ValueError(f"{text!r} is out of range") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=tz)


def from_iso(text: str) -> datetime:
    """An ISO-8601 date-time, as ``datetime.fromisoformat`` reads it, except that the date and the
    time must be joined by 'T' or a space: Python takes any character there, so 2026-12-31+02:00
    would be 02:00 on that day. Raises ValueError."""
    t = text.strip()
    sep = 10 if t[4:5] == "-" else 8  # 2026-09-01T08:00 or the compact 20260901T0800
    if len(t) > sep and t[sep] not in "Tt ":
        raise ValueError(f"{text!r}: a date and a time are joined by 'T' or a space")
    return datetime.fromisoformat(t)


def why(exc: Exception) -> str:
    """`` (reason)`` for a refusal of ``parse_when`` or its readers (``from_iso``, ``parse_duration``)
    that says more than "not a time", else ``""``:
    what the reader itself found (a unit missing, a bad separator), never Python's own wording."""
    text = str(exc)
    if text in ("", "not a duration") or text.startswith(("Invalid isoformat", "invalid literal")):
        return ""
    if text.startswith("'") and ": " in text:  # "'2026-12-31+02:00': a date and a time are joined ..."
        text = text.split(": ", 1)[1]
    return f" ({text})"
