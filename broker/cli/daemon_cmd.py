"""`gbroker daemon`: run the broker (imports the ORM and Slurm backend; loaded lazily)."""

from __future__ import annotations

import logging
import os

import click

from broker.cli.main import Context
from broker.cli.params import PolicyOption

pass_ctx = click.make_pass_decorator(Context)


@click.command("daemon")
@click.option("--db", "db_url", metavar="URL",
              help="Database URL (sqlite:///PATH or postgresql://...), instead of the settings' db_url.")
@click.option("--policy", metavar="NAME",
              cls=PolicyOption, help="Placement policy, instead of the settings' policy: {policies}.")
@click.option("--tick", "tick_seconds", type=float,
              help="Seconds between reconcile ticks, instead of the settings' tick_seconds [default 15].")
@click.option("--wait", "wait_for_lease", is_flag=True, help="If another daemon is active, wait to take over.")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING"]),
              help="Log lines at this level and above, to stderr (the journal under systemd).")
@pass_ctx
def daemon(
    ctx: Context,
    db_url: str | None,
    policy: str | None,
    tick_seconds: float | None,
    wait_for_lease: bool,
    log_level: str,
) -> None:
    """Run the gbroker daemon in the foreground.

    It serves the CLI on a UNIX socket, places and submits jobs, reconciles
    with Slurm every tick and recovers reclaimed jobs. Run one per database
    (a lease stops a second one). Stop it with SIGTERM or Ctrl-C.
    """
    # Everything the daemon creates (database, journals, logs) is private by default;
    # what it runs as a user gets the usual umask back (broker.proc).
    os.umask(0o077)
    from broker.ops.systemd import log_handler

    # Under systemd each line carries its syslog priority (<3> for errors): `journalctl -p err` finds them.
    logging.basicConfig(level=getattr(logging, log_level), handlers=[log_handler()])
    for noisy in ("apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from broker.config import env_notes, load_settings
    from broker.daemon import Daemon

    overrides = {
        "db_url": db_url,
        "policy": policy,
        "tick_seconds": tick_seconds,
        "socket": ctx._socket,
    }
    settings = load_settings(ctx.config_path, overrides=overrides)
    for note in env_notes():
        logging.getLogger("broker.daemon").warning("%s", note)
    d = Daemon(settings)
    d.config_path, d.overrides = ctx.config_path, overrides  # what SIGHUP reads again
    d.run_forever(wait_for_lease=wait_for_lease)
