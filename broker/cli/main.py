"""The `gbroker` command: thin. Parse, call the daemon, print.

Nothing here imports the ORM or the Slurm backend: `gbroker status` must start
about as fast as a bare click program. The `daemon` and `simulate` commands
import their heavy parts only when they run.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from broker import __version__
from broker.errors import BrokerError


class Context:
    def __init__(self, socket_path: str | None, config_path: str | None) -> None:
        self._socket = socket_path
        self.config_path = config_path
        self._warned = False

    @property
    def socket(self) -> str:
        if self._socket:
            return self._socket
        from broker.config import client_socket, env_notes

        socket = client_socket(self.config_path)
        if not self._warned:
            self._warned = True
            for note in env_notes():  # a mistyped GBROKER_SOCKET would send the command elsewhere
                click.echo(f"gbroker: warning: {note}", err=True)
        return socket

    def call(self, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        """One request to the daemon; ``repeatable`` ones are sent again if the answer is lost."""
        from broker.client import call

        return call(self.socket, op, repeatable=repeatable, **args)


LAZY_COMMANDS = {
    # name -> "module:attribute"; imported only when that command runs.
    "daemon": "broker.cli.daemon_cmd:daemon",
    "simulate": "broker.cli.simulate:simulate",
    "node": "broker.cli.node:node",
    "semester": "broker.cli.admin:semester",
    "group": "broker.cli.admin:group",
    "quota": "broker.cli.admin:quota",
    "price": "broker.cli.admin:price",
    "budget": "broker.cli.admin:budget",
    "report": "broker.cli.report:report",
    "pools": "broker.cli.pools:pools",
    "config": "broker.cli.config_cmd:config",
    "token": "broker.cli.token_cmd:token",
}


class BrokerGroup(click.Group):
    """Loads heavy commands lazily; turns every BrokerError into a clear message and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module_name, attr = LAZY_COMMANDS[cmd_name].split(":")
            try:
                command = getattr(importlib.import_module(module_name), attr)
            except ImportError as exc:
                command = _unavailable(cmd_name, str(exc))
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokerError as exc:
            click.echo(f"gbroker: error: {exc.message}", err=True)
            if exc.hint:
                click.echo(f"  hint: {exc.hint}", err=True)
            sys.exit(exc.exit_code)


def _unavailable(name: str, why: str) -> click.Command:
    def fail() -> None:
        raise click.ClickException(f"`{name}` is not available in this install: {why}")

    return click.Command(name, callback=fail, help=f"(not available: {why})")


@click.group(cls=BrokerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gbroker")
@click.option(
    "--socket",
    "socket_path",
    envvar="GBROKER_SOCKET",
    metavar="PATH",
    help="The daemon's UNIX socket [env GBROKER_SOCKET; default: the settings' socket, else /run/gbroker/gbroker.sock "
         "when that daemon runs or you are root, else $XDG_RUNTIME_DIR/gbroker.sock].",
)
@click.option(
    "--config",
    "config_path",
    envvar="GBROKER_CONFIG",
    metavar="FILE",
    help="Config file (TOML) [env GBROKER_CONFIG; default /etc/gbroker/gbroker.toml].",
)
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, config_path: str | None) -> None:
    """gbroker: GPU batch jobs on spot or on-demand Slurm partitions.

    Submit with `gbroker submit`, watch with `gbroker status` and `gbroker show`.
    Jobs are checkpointed and resumed when spot nodes are reclaimed.
    """
    ctx.obj = Context(socket_path, config_path)


def main() -> None:
    from broker.cli import jobs  # noqa: F401  (registers the job commands)

    cli(prog_name="gbroker")


if __name__ == "__main__":  # pragma: no cover
    main()
