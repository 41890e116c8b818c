"""Parameter types of the command line that click's own read too loosely."""

from __future__ import annotations

from typing import Any

import click


class WholeNumber(click.ParamType):
    """A whole number written in ASCII digits: ``8``, not ``1_0``, ``٢`` or ``+5``, which Python's
    int() would take as 10, 2 and 5."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()):
            self.fail(f"{text!r} is not a whole number (write digits 0-9)", param, ctx)
        return int(text)


WHOLE = WholeNumber()
