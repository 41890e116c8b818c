"""Expand and compress Slurm hostlists (``spot[1-3,5]``) without calling Slurm.

One squeue call per tick must not turn into one ``scontrol show hostnames``
per job, so the common forms are expanded here: comma lists, several
bracket groups per name (``r[1-2]n[01-03]``) and zero padding (``[08-10]``).
"""

from __future__ import annotations

import itertools
import re

# Values Slurm prints when a job has no nodes.
EMPTY_NODELISTS = frozenset({"", "(null)", "None assigned", "None", "n/a", "N/A"})

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


class TooManyNodes(ValueError):
    """A hostlist names more nodes than the caller allows (found before expanding it)."""


def _ranges(body: str, whole: str) -> list[tuple[int, int, int]]:
    """The (low, high, zero-pad width) ranges of one bracket group, checked."""
    out = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist {whole!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"descending range {item!r} in hostlist {whole!r}")
        out.append((lo, hi, len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0))
    return out


def _pieces(pattern: str) -> list[list[str] | list[tuple[int, int, int]]]:
    """One name's literal parts and bracket groups, in order."""
    pieces: list[list[str] | list[tuple[int, int, int]]] = []
    pos = 0
    while pos < len(pattern):
        start = pattern.find("[", pos)
        if start < 0:
            pieces.append([pattern[pos:]])
            break
        end = pattern.find("]", start)
        if end < 0:
            raise ValueError(f"unbalanced '[' in hostlist {pattern!r}")
        pieces.append([pattern[pos:start]])
        pieces.append(_ranges(pattern[start + 1 : end], pattern))
        pos = end + 1
    return pieces


def _count(pieces: list[list[str] | list[tuple[int, int, int]]]) -> int:
    n = 1
    for piece in pieces:
        if piece and isinstance(piece[0], tuple):
            n *= sum(hi - lo + 1 for lo, hi, _ in piece)  # type: ignore[misc]
    return n


def _expand_one(pattern: str) -> list[str]:
    """Expand one name that may hold several bracket groups."""
    lists: list[list[str]] = []
    for piece in _pieces(pattern):
        if piece and isinstance(piece[0], tuple):
            lists.append([str(i).zfill(w) for lo, hi, w in piece for i in range(lo, hi + 1)])  # type: ignore[misc]
        else:
            lists.append(piece)  # type: ignore[arg-type]
    return ["".join(combo) for combo in itertools.product(*lists)]


def count(hostlist: str | None) -> int:
    """How many names a hostlist expands to (duplicates counted), without expanding it."""
    if hostlist is None or hostlist.strip() in EMPTY_NODELISTS:
        return 0
    return sum(_count(_pieces(part)) for part in _split_top_level(hostlist.strip()))


def expand(hostlist: str | None, limit: int | None = None) -> list[str]:
    """``"spot[1-3,5],od1"`` -> ``["spot1", "spot2", "spot3", "spot5", "od1"]``.

    Order is Slurm's order; duplicates are kept out. Empty markers
    (``""``, ``"(null)"``, ``"None assigned"``) give ``[]``. With ``limit``,
    a hostlist naming more nodes raises TooManyNodes before anything is expanded.
    """
    if hostlist is None or hostlist.strip() in EMPTY_NODELISTS:
        return []
    if limit is not None:
        n = count(hostlist)
        if n > limit:
            raise TooManyNodes(f"hostlist {hostlist[:60]!r} names {n} nodes, more than {limit}")
    seen: dict[str, None] = {}
    for part in _split_top_level(hostlist.strip()):
        for name in _expand_one(part):
            seen.setdefault(name, None)
    return list(seen)


def compress(names: list[str]) -> str:
    """A comma-separated list Slurm accepts. No ranges: correctness over brevity."""
    for name in names:
        if not name or any(c in name for c in ",[] \n\t\0="):
            raise ValueError(f"not a node name: {name!r}")
    return ",".join(names)
