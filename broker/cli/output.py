"""Printing for the CLI: aligned tables for people (``broker.tables``), JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from broker.tables import table

if TYPE_CHECKING:
    from broker.cli.main import Context
    from broker.client import Client


def client_of(ctx: Context) -> Client:
    """The typed client (``broker.client.Client``) over the command's ``Context.call``."""
    from broker.client import Client

    return Client(transport=ctx.call)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    click.echo(table(rows, headers))


def duration(seconds: float | int | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
