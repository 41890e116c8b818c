"""Aligned plain-text tables: the one table printer of the CLI, the reports and the simulator.

Standard library only: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Sequence


def table(rows: Sequence[Sequence[object]], headers: Sequence[str], *, numbers: bool = False,
          rule: bool = False) -> str:
    """Columns two spaces apart, each as wide as its widest cell; lines carry no trailing spaces.

    A cell None prints empty; a row shorter than the headers leaves its last
    columns empty (a longer one is a ValueError). ``numbers``: every column
    but the first is right-aligned, so figures line up. ``rule``: a line of
    dashes under the headers.
    """
    head = [str(h) for h in headers]
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    widths = [len(h) for h in head]
    for row in cells:
        if len(row) > len(widths):
            raise ValueError(f"a row of {len(row)} cells under {len(widths)} headers: {row!r}")
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if numbers and i else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=False))).rstrip()

    lines = [line(head)]
    if rule:
        lines.append("  ".join("-" * w for w in widths))
    lines += [line(row) for row in cells]
    return "\n".join(lines)
