"""Spot traces: load, validate, and cut into the windows a job sees.

A trace file is JSON ``{"metadata": {"gap_seconds": N}, "data": [...],
"prices": [...]?}``: ``data[i]`` is how many spot instances could be had
during step i (0 = none), ``prices[i]`` (optional) the spot price in USD per
instance-hour. Any file of that shape is accepted, not only ours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from collections.abc import Iterable, Sequence

from broker.errors import SpecError


@dataclass(frozen=True)
class Trace:
    name: str
    """Path of the file relative to the folder it was found in (or its file name)."""
    gap_s: int
    counts: tuple[int, ...]
    prices_usd: tuple[Decimal, ...] | None = None

    @property
    def steps(self) -> int:
        return len(self.counts)

    @property
    def hours(self) -> float:
        return self.steps * self.gap_s / 3600

    @property
    def capacity(self) -> int:
        """The most instances the trace ever offers: the largest gang it can host."""
        return max(self.counts)

    def window(self, offset: int, steps: int, nodes: int) -> tuple[bool, ...]:
        """Availability for a gang of ``nodes`` over ``steps`` steps from ``offset``.

        A trace shorter than the window is replayed from its start again
        (cyclically); ``wraps`` tells whether that happens.
        """
        n = self.steps
        return tuple(self.counts[(offset + i) % n] >= nodes for i in range(steps))

    def counts_window(self, offset: int, steps: int) -> tuple[int, ...]:
        n = self.steps
        return tuple(self.counts[(offset + i) % n] for i in range(steps))

    def wraps(self, steps: int) -> bool:
        return steps > self.steps

    def mean_price_usd(self, offset: int, steps: int) -> Decimal | None:
        """Mean spot price over a window, or None when the trace has no prices."""
        if self.prices_usd is None:
            return None
        n = self.steps
        total = sum((self.prices_usd[(offset + i) % n] for i in range(steps)), Decimal(0))
        return total / steps


def parse_trace(raw: object, name: str) -> Trace:
    """Validate one decoded trace; errors say what is wrong and where."""
    if not isinstance(raw, dict):
        raise SpecError(f"{name}: a trace is a JSON object with metadata and data")
    meta = raw.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise SpecError(f'{name}: missing "metadata": {{"gap_seconds": N}}')
    gap = meta["gap_seconds"]
    if isinstance(gap, float) and gap.is_integer():
        gap = int(gap)
    if not isinstance(gap, int) or isinstance(gap, bool) or gap <= 0:
        raise SpecError(f"{name}: gap_seconds must be a whole number of seconds > 0, got {gap!r}")
    data = raw.get("data")
    if not isinstance(data, list) or not data:
        raise SpecError(f'{name}: "data" must be a non-empty list of spot instance counts')
    counts: list[int] = []
    for i, v in enumerate(data):
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or v < 0:
            raise SpecError(f"{name}: data[{i}] = {v!r} is not a count of instances (0, 1, 2, ...)")
        counts.append(v)
    prices: tuple[Decimal, ...] | None = None
    if raw.get("prices") is not None:
        plist = raw["prices"]
        if not isinstance(plist, list) or len(plist) != len(counts):
            raise SpecError(f'{name}: "prices" must be a list as long as "data"')
        try:
            prices = tuple(Decimal(str(p)) for p in plist)
        except ArithmeticError as exc:
            raise SpecError(f"{name}: prices must be numbers (USD per instance-hour)") from exc
        if any(not p.is_finite() or p < 0 for p in prices):
            raise SpecError(f"{name}: prices must be finite and not negative")
    return Trace(name=name, gap_s=gap, counts=tuple(counts), prices_usd=prices)


def load_trace(path: Path, name: str | None = None) -> Trace:
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read trace {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    return parse_trace(raw, name or path.name)


def load_traces(paths: Iterable[str | Path]) -> list[Trace]:
    """Files, or folders searched for ``*.json`` files (recursively), in a stable order."""
    out: list[Trace] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*.json") if f.is_file())
            if not files:
                raise SpecError(f"{path}: no *.json trace files in this folder")
            base = path.parent
            out.extend(load_trace(f, str(f.relative_to(base))) for f in files)
        elif path.exists():
            out.append(load_trace(path, path.name))
        else:
            raise SpecError(f"trace not found: {path}")
    return out


def group_of(trace: Trace) -> str:
    """The folder a trace came from (its name without the file), for tables."""
    parts = trace.name.split("/")
    return "/".join(parts[:-1]) if len(parts) > 1 else "."


def offsets(steps_total: int, steps_needed: int, starts: int, seed: int) -> list[int]:
    """``starts`` start offsets spread over the trace: one in each of ``starts``
    equal strata, at a seeded random place inside it (reproducible, and less
    clumped than plain random draws). A trace shorter than the job's window
    is replayed cyclically, so every offset is allowed then."""
    import random

    rng = random.Random(seed)
    span = steps_total - steps_needed + 1 if steps_total >= steps_needed else steps_total
    out = []
    for k in range(starts):
        lo = k * span / starts
        hi = (k + 1) * span / starts
        out.append(min(span - 1, int(lo + rng.random() * (hi - lo))))
    return out


def as_counts(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)
