"""`gbroker token`: a sign-in token for the web dashboard, bound to you by the daemon.

The daemon mints it for the uid the kernel reports on the socket; the token
is printed once (only its hash is kept). `--list` shows your tokens (an
admin: `--all`), `--revoke ID` ends one (an admin: anyone's) and signs out
every browser signed in with it. One user holds at most `[web]
max_tokens_per_user` live tokens (20 by default); past it the daemon refuses
and says to revoke one.
"""

from __future__ import annotations

import click

from broker.cli.main import Context
from broker.cli.params import WHOLE
from broker.cli.output import print_json, print_table
from broker.durations import DURATION_HELP, format_duration, parse_duration
from broker.errors import SpecError

pass_ctx = click.make_pass_decorator(Context)


@click.command("token")
@click.option("--ttl", default="12h", show_default=True, metavar="DURATION",
              help=f"How long the token lives, 1 minute to 30 days ({DURATION_HELP}).")
@click.option("--note", default="", metavar="TEXT", help="A word to tell your tokens apart in --list.")
@click.option("--list", "do_list", is_flag=True, help="List your tokens instead of making one.")
@click.option("--all", "all_users", is_flag=True, help="With --list: every user's tokens (admins).")
@click.option("--revoke", "revoke_id", type=WHOLE, metavar="ID",
              help="End the token ID and sign out every browser signed in with it (yours; an admin: anyone's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def token(ctx: Context, ttl: str, note: str, do_list: bool, all_users: bool, revoke_id: int | None,
          as_json: bool) -> None:
    """Make a sign-in token for the web dashboard ([metrics] listen in the settings), list or revoke them.

    Paste the token into the dashboard's sign-in page; it shows what your CLI shows you. You hold at
    most [web] max_tokens_per_user live tokens (20 by default): revoke one you no longer use to make another."""
    source = click.get_current_context().get_parameter_source
    if sum([do_list, revoke_id is not None]) > 1:
        raise SpecError("give --list or --revoke, not both")
    made_with = [f"--{n}" for n in ("ttl", "note") if source(n) != click.core.ParameterSource.DEFAULT]
    if (do_list or revoke_id is not None) and made_with:
        raise SpecError(f"{', '.join(made_with)} only apply when making a token", hint="drop them, or drop --list/--revoke")
    if all_users and not do_list:
        raise SpecError("--all goes with --list", hint="gbroker token --list --all")
    if revoke_id is not None:
        row = ctx.call("token_revoke", token_id=revoke_id)
        if as_json:
            print_json(row)
        else:
            click.echo(f"token {row['id']} of {row['user']}: revoked at {row['revoked_at']} by {row['revoked_by']}")
        return
    if do_list:
        rows = ctx.call("token_list", repeatable=True, all_users=all_users)
        if as_json:
            print_json(rows)
            return
        print_table([[r["id"], r["user"], r["status"], r["created_at"], r["expires_at"], r["last_used_at"] or "-",
                      r["note"]] for r in rows],
                    ["ID", "USER", "STATUS", "CREATED", "EXPIRES", "LAST SIGN-IN", "NOTE"])
        return
    try:
        ttl_s = parse_duration(ttl)
    except ValueError as exc:
        raise SpecError(f"--ttl {ttl!r}: {exc}", hint=DURATION_HELP) from None
    row = ctx.call("token_mint", ttl_s=ttl_s, note=note)
    if as_json:
        print_json(row)
        return
    click.echo(row["token"])
    click.echo(f"token {row['id']} for {row['user']}, valid {format_duration(ttl_s)} until {row['expires_at']}; "
               f"paste it into the dashboard's sign-in page. End it early: gbroker token --revoke {row['id']}",
               err=True)
