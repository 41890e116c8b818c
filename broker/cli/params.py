"""Parameter types of the command line that click's own read too loosely."""

from __future__ import annotations

from typing import Any

import click


class WholeNumber(click.ParamType):
    """A whole number written in ASCII digits, with an optional '-': ``8``, not ``1_0``, ``٢`` or
    ``+5``, which Python's int() would take as 10, 2 and 5. Its range is the reader's to check
    (``--gpus -2`` is refused by the job's parser, naming the field)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        digits = text.removeprefix("-")
        if not (digits.isascii() and digits.isdigit()):
            self.fail(f"{text!r} is not a whole number (write digits 0-9)", param, ctx)
        return int(text)


WHOLE = WholeNumber()


class PolicyOption(click.Option):
    """An option naming placement policies, whose help lists them when the help is shown, not when
    the module loads: the list is the policies package's registry, which imports numpy, and
    `gbroker --help` loads every command's module to show its summary."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from policies import names

        record = super().get_help_record(ctx)
        if record is None:
            return None
        return record[0], record[1].replace("{policies}", ", ".join(names()))
