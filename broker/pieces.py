"""Array pieces: reading ``pieces = "1-400:2%16"``, chunking, and compressed ranges.

Pure and standard-library only, so the CLI, the daemon and the tests share it.

The grammar is Slurm's ``--array``: comma-separated items, each an index
``7``, a range ``1-400`` or a stepped range ``1-400:5``, and an optional
``%N`` at the end: at most N pieces run at once. Indices are whole numbers
from 0 to ``MAX_INDEX``; an array has at most ``MAX_PIECES`` pieces.

With a chunk size C, the indices are cut into runs of C in order; each chunk
is one Slurm array task, named by its first index (``GBROKER_PIECE``), and
runs the indices from ``first`` to ``last`` (``GBROKER_PIECE_FIRST``,
``GBROKER_PIECE_LAST``, with ``GBROKER_PIECE_STEP`` between them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_INDEX = 4_000_000
"""Slurm's default MaxArraySize is 1001; sites raise it. This is a sanity bound, Slurm's own is checked by sbatch."""
MAX_PIECES = 100_000
MAX_CHUNK = 100_000

_ITEM = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")  # ASCII digits: \\d takes any script's


class PiecesError(ValueError):
    """A pieces expression that does not parse; the message says what to write."""


@dataclass(frozen=True)
class Pieces:
    """The indices asked for (sorted, distinct), the concurrency cap and the chunk size."""

    indices: tuple[int, ...]
    limit: int | None = None
    chunk: int = 1

    def _gaps(self) -> set[int]:
        return {b - a for a, b in zip(self.indices, self.indices[1:], strict=False)}

    @property
    def step(self) -> int:
        """The step between the indices of a chunk (1 unless every gap is the same)."""
        gaps = self._gaps()
        return gaps.pop() if len(gaps) == 1 else 1

    @property
    def evenly_spaced(self) -> bool:
        """Every gap the same: a chunk's task, which runs first..last by one step, then runs its own indices
        only (across a gap of another size it would run indices nobody asked for)."""
        return len(self._gaps()) <= 1

    def chunks(self) -> list[tuple[int, int]]:
        """(first, last) of every chunk, in order. A chunk is one Slurm array task."""
        out = []
        for i in range(0, len(self.indices), self.chunk):
            part = self.indices[i : i + self.chunk]
            out.append((part[0], part[-1]))
        return out

    def members(self, first: int) -> tuple[int, ...]:
        """The indices of the chunk that starts at ``first``."""
        i = self.indices.index(first)
        return self.indices[i : i + self.chunk]


def parse_pieces(text: str, chunk: int = 1) -> Pieces:
    """``"1-400"``, ``"1-400:2"``, ``"1,5,9-12"``, ``"1-400%16"`` -> Pieces. Raises PiecesError."""
    if not isinstance(text, str):
        raise PiecesError(f"must be a string like \"1-400\", got {type(text).__name__}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise PiecesError(f"chunk must be a whole number from 1 to {MAX_CHUNK}, got {chunk!r}")
    body, pct, cap = text.strip().partition("%")
    limit = None
    if pct:
        if not re.fullmatch(r"[0-9]{1,7}", cap) or int(cap) < 1:
            raise PiecesError(f"{text!r}: after % comes how many pieces may run at once, e.g. \"1-400%16\"")
        limit = int(cap)
    if not body:
        raise PiecesError("is empty; write e.g. \"1-400\"")
    found: set[int] = set()
    for item in body.split(","):
        m = _ITEM.fullmatch(item.strip())
        if m is None:
            raise PiecesError(f"{item.strip()!r} is not an index, a range (1-400) or a stepped range (1-400:5)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise PiecesError(f"{item.strip()!r}: the range ends before it starts")
        if step < 1:
            raise PiecesError(f"{item.strip()!r}: the step must be at least 1")
        if hi > MAX_INDEX:
            raise PiecesError(f"{item.strip()!r}: indices go up to {MAX_INDEX}")
        if (hi - lo) // step + 1 + len(found) > MAX_PIECES:
            raise PiecesError(f"more than {MAX_PIECES} pieces; split the work into several arrays")
        found.update(range(lo, hi + 1, step))
    return Pieces(tuple(sorted(found)), limit, chunk)


def compress(indices: Iterable[int]) -> str:
    """Sorted distinct indices as ranges: [1, 2, 3, 5, 7, 8] -> "1-3,5,7-8" ("" for none)."""
    out: list[str] = []
    start = prev = None
    for i in sorted(set(indices)):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


def slurm_array(firsts: Iterable[int], limit: int | None = None) -> str:
    """The ``--array`` value for these task indices (compressed ranges, ``%N`` when capped)."""
    text = compress(firsts)
    if not text:
        raise PiecesError("an array needs at least one piece")
    return capped(text, limit)


def capped(indices: str, limit: int | None) -> str:
    """An ``--array`` index list with its ``%N`` cap on tasks at once (none: as it is)."""
    return f"{indices}%{limit}" if limit else indices


def progress_line(counts: dict[str, int], total: int) -> str:
    """'312/400 done, 16 running, 2 failed' (states with no piece left out, done always shown)."""
    parts = [f"{counts.get('done', 0)}/{total} done"]
    for state in ("running", "pending", "waiting", "failed", "cancelled"):
        n = counts.get(state, 0)
        if n:
            parts.append(f"{n} {state}")
    return ", ".join(parts)


def bar(done: int, total: int, width: int = 30) -> str:
    """A text progress bar: '[#########.....................]  30%'."""
    filled = 0 if total <= 0 else min(width, done * width // total)
    pct = 0 if total <= 0 else done * 100 // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {pct:3d}%"
