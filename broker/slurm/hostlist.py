"""Expand and compress Slurm hostlists (``spot[1-3,5]``) without calling Slurm.

One squeue call per tick must not turn into one ``scontrol show hostnames``
per job, so the common forms are expanded here: comma lists, several
bracket groups per name (``r[1-2]n[01-03]``) and zero padding (``[08-10]``).
``compress`` writes names the way Slurm does (``spot[1-199]``), so a command
line naming many nodes stays short.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable

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


# --------------------------------------------------------------------------- compress

_NUMBERED = re.compile(r"(.*?)([0-9]+)")
MAX_SUFFIX_DIGITS = 18
"""A longer numeric suffix does not fit Slurm's unsigned long: such a name is kept whole."""


def _natural_cmp(a: str, b: str) -> int:
    """Slurm's strnatcmp (Martin Pool's natural order), which orders hostlist prefixes.

    A run of digits compares as a number ("r2" < "r10"); one that starts with a
    zero compares digit by digit from the left, as a fraction would ("a01" < "a1").
    """
    ai = bi = 0
    while True:
        ca = a[ai] if ai < len(a) else ""
        cb = b[bi] if bi < len(b) else ""
        while ca.isspace():
            ai += 1
            ca = a[ai] if ai < len(a) else ""
        while cb.isspace():
            bi += 1
            cb = b[bi] if bi < len(b) else ""
        if _digit(ca) and _digit(cb):
            run = _compare_left if "0" in (ca, cb) else _compare_right
            result = run(a, ai, b, bi)
            if result:
                return result
        if not ca and not cb:
            return 0
        if ca != cb:
            return -1 if ca < cb else 1
        ai += 1
        bi += 1


def _digit(c: str) -> bool:
    return len(c) == 1 and "0" <= c <= "9"


def _compare_right(a: str, ai: int, b: str, bi: int) -> int:
    """Two runs of digits as whole numbers: the longer run wins, else the first difference."""
    bias = 0
    while True:
        da, db = _digit(a[ai:ai + 1]), _digit(b[bi:bi + 1])
        if not da and not db:
            return bias
        if not da:
            return -1
        if not db:
            return 1
        if not bias and a[ai] != b[bi]:
            bias = -1 if a[ai] < b[bi] else 1
        ai += 1
        bi += 1


def _compare_left(a: str, ai: int, b: str, bi: int) -> int:
    """Two runs of digits as fractions: the first difference wins."""
    while True:
        da, db = _digit(a[ai:ai + 1]), _digit(b[bi:bi + 1])
        if not da and not db:
            return 0
        if not da:
            return -1
        if not db:
            return 1
        if a[ai] != b[bi]:
            return -1 if a[ai] < b[bi] else 1
        ai += 1
        bi += 1


def _split(name: str) -> tuple[str, str | None]:
    """``"spot12"`` -> ``("spot", "12")``; a name without a numeric suffix -> ``(name, None)``."""
    m = _NUMBERED.fullmatch(name)
    if m is None or len(m.group(2)) > MAX_SUFFIX_DIGITS:
        return name, None
    return m.group(1), m.group(2)


def _slurm_order(a: tuple[str, str | None], b: tuple[str, str | None]) -> int:
    """Slurm's hostlist order: prefixes in natural order; a bare name before the numbered ones of
    its prefix; numbers of one width in numeric order, and narrower digit strings first (so
    ``n8`` < ``n9`` < ``n08`` < ``n100``: zero padding is part of the name)."""
    result = _natural_cmp(a[0], b[0])
    if result:
        return result
    if (a[1] is None) != (b[1] is None):
        return -1 if a[1] is None else 1
    # The prefix last: natural order may call two different ones equal (it skips spaces).
    ka = (len(a[1] or ""), a[1] or "", a[0])
    kb = (len(b[1] or ""), b[1] or "", b[0])
    return (ka > kb) - (ka < kb)


def slurm_sorted(names: Iterable[str]) -> list[str]:
    """Distinct ``names`` in the order Slurm sorts a hostlist (``scontrol show hostlistsorted``)."""
    parts = sorted({_split(n) for n in names}, key=functools.cmp_to_key(_slurm_order))
    return [p + (d or "") for p, d in parts]


def compress(names: Iterable[str]) -> str:
    """Node names as Slurm's compressed hostlist: ``["spot1", ..., "spot199"]`` -> ``"spot[1-199]"``.

    Sorted and without duplicates, as Slurm writes one: prefixes in natural
    order (``od[1-2],spot[1-4]``); zero padding kept (``n[08-10]``, and
    ``n[8,08]`` for two nodes that differ only in it). :func:`expand` (and
    ``scontrol show hostnames``) read it back to the same names, in
    :func:`slurm_sorted` order. For names of mixed padding Slurm's own order depends
    on the order it is given them; the order here is one it keeps.
    """
    names = list(names)
    for name in names:
        if not name or any(c in name for c in ",[] \n\t\0="):
            raise ValueError(f"not a node name: {name!r}")
    groups: list[tuple[str, list[tuple[str, str]]]] = []  # prefix -> ranges of digit strings, or a bare name
    for name in slurm_sorted(names):
        prefix, digits = _split(name)
        if digits is None:
            groups.append((name, []))
            continue
        if not groups or groups[-1][0] != prefix or not groups[-1][1]:
            groups.append((prefix, [(digits, digits)]))
            continue
        ranges = groups[-1][1]
        lo, hi = ranges[-1]
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        if int(digits) == int(hi) + 1 and str(int(digits)).zfill(width) == digits:
            ranges[-1] = (lo, digits)  # expand() writes each member of lo-hi with lo's padding
        else:
            ranges.append((digits, digits))
    out = []
    for prefix, ranges in groups:
        if not ranges:
            out.append(prefix)
        elif len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            out.append(prefix + ranges[0][0])
        else:
            out.append(prefix + "[" + ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges) + "]")
    return ",".join(out)
