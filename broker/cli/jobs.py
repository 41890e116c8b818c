"""Job commands for researchers: submit, status/ls, show, cancel, history."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from broker.cli.main import Context, cli
from broker.cli.output import duration, print_json, print_table
from broker.errors import SpecError

pass_ctx = click.make_pass_decorator(Context)

KINDS = ("render", "simulation", "finetune", "other")
CHECKPOINT_STYLES = ("signal", "pieces", "none")


def build_spec(job_file: str | None, flags: dict[str, Any], command: tuple[str, ...]) -> dict[str, Any]:
    """Merge a TOML job file with flags (flags win), validate, and return the dict the daemon re-checks.

    Files (the job file, a script) are read here, as the user, so the daemon
    never opens a path a user names.
    """
    from datetime import UTC, datetime

    from broker.spec import load_job_file, parse_spec, spec_to_dict

    data: dict[str, Any] = {}
    base = Path.cwd()
    if job_file:
        data = load_job_file(job_file)
        base = Path(job_file).resolve().parent
        script = data.get("script")
        if isinstance(script, str) and "\n" not in script and not os.path.isabs(script):
            data["script"] = str(base / script)
    for key, value in flags.items():
        if value is None:
            continue
        if key in ("checkpoint_dir", "checkpoint_style"):
            section = dict(data.get("checkpoint") or {})
            section["dir" if key == "checkpoint_dir" else "style"] = value
            data["checkpoint"] = section
        elif key == "gpu":
            if value:  # --gpu a100,h100 and/or --gpu a100 --gpu h100
                data["gpu"] = [name.strip() for item in value for name in item.split(",")]
        elif key == "script_path":
            data["script"] = os.path.abspath(value)
        elif key == "env":
            env = dict(data.get("env") or {})
            for item in value:
                name, sep, val = item.partition("=")
                if not sep:
                    raise SpecError(f"env: {item!r} is not NAME=VALUE", hint="write --env NAME=VALUE")
                env[name] = val
            if env:
                data["env"] = env
        else:
            data[key] = value
    if command:
        data["command"] = list(command)
    data.setdefault("workdir", os.getcwd())
    workdir = data.get("workdir")
    if isinstance(workdir, str) and os.path.isabs(workdir) and not os.access(workdir, os.W_OK | os.X_OK):
        raise SpecError(
            f"workdir: you cannot write to {workdir}; the job runs there and writes its output there",
            hint="run gbroker submit from a directory of yours, or set workdir in the job file",
        )
    ck = data.get("checkpoint")
    if isinstance(ck, dict) and isinstance(ck.get("dir"), str) and not os.path.isabs(ck["dir"]):
        ck["dir"] = str(base / ck["dir"])
    if ck and isinstance(ck, dict) and ck.get("dir") and "style" not in ck:
        ck["style"] = "signal"
    return spec_to_dict(parse_spec(data, now=datetime.now(UTC)))


@cli.command()
@click.option("--name", help="Job name (letters, digits, . _ -; at most 64).")
@click.option("--kind", type=click.Choice(KINDS), help="What the job is [default: other].")
@click.option("--gpus", "gpus_per_node", type=int, help="GPUs per node [default: 1].")
@click.option("--nodes", type=int, help="Nodes, run as one gang [default: 1].")
@click.option("--gpu", multiple=True, metavar="TYPE[,TYPE...]",
              help="GPU type, or several (any of them), e.g. a100 or a100,h100; repeatable [default: any type].")
@click.option("--gpu-mem-gb", type=int, metavar="GB", help="At least this much memory per GPU, in GB.")
@click.option("--cpus-per-gpu", type=int, metavar="N", help="CPUs per GPU (not with --cpus-per-task).")
@click.option("--cpus-per-task", type=int, metavar="N", help="CPUs per task (not with --cpus-per-gpu).")
@click.option("--mem-per-gpu", metavar="SIZE",
              help="Memory per GPU: 32G, 512M (a bare number is MB, as in sbatch; not with --mem).")
@click.option("--mem", metavar="SIZE", help="Memory per node: 64G, 4000M (a bare number is MB; not with --mem-per-gpu).")
@click.option("--time", "time_limit", metavar="DURATION", help="Time limit: 90m, 2h, 1h30m, 1-02:00:00.")
@click.option("--deadline", metavar="WHEN", help="Finish by: ISO time with zone, or +36h from now.")
@click.option(
    "--interruptible/--no-interruptible",
    default=None,
    help="May run on spot and be reclaimed [default: interruptible].",
)
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), help="Where the job saves checkpoints.")
@click.option(
    "--checkpoint-style",
    type=click.Choice(CHECKPOINT_STYLES),
    help="signal: the program saves on SIGUSR1; pieces: independent pieces restart freely; none.",
)
@click.option("--group", "-g", help="Your group (Slurm account), e.g. vision.")
@click.option("--partition", help="Force a partition instead of letting the policy choose.")
@click.option("--script", "script_path", metavar="FILE", help="A batch script to run.")
@click.option("--env", "-e", multiple=True, metavar="NAME=VALUE", help="Extra environment (repeatable).")
@click.option("--max-retries", type=int, help="Retries after the program's own failures [default: 2].")
@click.option("--key", metavar="KEY",
              help="Idempotency key (gb- and 8-40 lower-case letters or digits): submitting again with the "
              "same key returns the first job instead of making a second [default: a new one each time].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[JOB_FILE.toml] [-- COMMAND...]")
@pass_ctx
def submit(ctx: Context, args: tuple[str, ...], as_json: bool, key: str | None, **flags: Any) -> None:
    """Submit a job from a TOML job file (name ending in .toml) and/or flags.

    \b
    Examples:
      gbroker submit job.toml
      gbroker submit --group vision --gpus 2 --time 4h --checkpoint-dir ~/ck -- python train.py
      gbroker submit --kind render --no-interruptible --group climate --script render.sh

    Put the command after `--`. Flags override the job file.

    \b
    #SBATCH lines at the top of a --script are read too: --gres=gpu[:TYPE]:N,
    --gpus-per-node, --nodes/-N, --ntasks-per-node, --cpus-per-task/-c,
    --cpus-per-gpu, --mem, --mem-per-gpu, --time/-t, --job-name/-J. A line
    that disagrees with a flag or the job file, and any other #SBATCH
    option, is refused with what to write instead.
    """
    job_file = None
    command = args
    if args and args[0].endswith(".toml"):
        job_file, command = args[0], args[1:]
        if not Path(job_file).is_file():
            raise SpecError(f"job file {job_file} does not exist", hint="check the path")
    spec = build_spec(job_file, flags, command)
    # The key is made here, so a retry after a lost answer (a daemon restart) names the same job.
    result = ctx.call("submit", repeatable=True, spec=spec, key=key or _new_key())
    if as_json:
        print_json(result)
        return
    slurm = f", Slurm job {result['slurm_job_id']}" if result.get("slurm_job_id") else ""
    click.echo(f"Submitted job {result['id']} ({result['name']}) to {result['partition']} [{result['capacity']}]{slurm}")
    if result.get("note"):
        click.echo(f"  note: {result['note']}")


def _new_key() -> str:
    import secrets

    return "gb-" + secrets.token_hex(6)


def _job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j["id"],
            j["name"],
            j["owner"],
            j["group"],
            j["state"],
            j.get("capacity") or "",
            j.get("partition") or "",
            j.get("attempts", 0),
            j.get("slurm_job_id") or "",
            duration(j.get("age_s")),
        ]
        for j in jobs
    ]


_JOB_HEADERS = ["ID", "NAME", "USER", "GROUP", "STATE", "CAPACITY", "PARTITION", "ATTEMPTS", "SLURM", "AGE"]


@cli.command()
@click.option("--all", "all_users", is_flag=True, help="Every user's jobs (admins only).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def status(ctx: Context, all_users: bool, as_json: bool) -> None:
    """List your active jobs."""
    jobs = ctx.call("list", repeatable=True, active=True, all_users=all_users)
    if as_json:
        print_json(jobs)
    elif not jobs:
        click.echo("No active jobs. `gbroker history` lists finished ones.")
    else:
        print_table(_job_rows(jobs), _JOB_HEADERS)


cli.add_command(status, "ls")


@cli.command()
@click.option("--limit", default=50, show_default=True, help="How many jobs.")
@click.option("--all", "all_users", is_flag=True, help="Every user's jobs (admins only).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def history(ctx: Context, limit: int, all_users: bool, as_json: bool) -> None:
    """List your jobs, newest first, finished ones included."""
    jobs = ctx.call("list", repeatable=True, active=False, all_users=all_users, limit=limit)
    if as_json:
        print_json(jobs)
    elif not jobs:
        click.echo("No jobs yet.")
    else:
        print_table(_job_rows(jobs), _JOB_HEADERS)


@cli.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def show(ctx: Context, job_id: int, as_json: bool) -> None:
    """Show one job: its spec, attempts and recent events."""
    job = ctx.call("show", repeatable=True, job_id=job_id)
    if as_json:
        print_json(job)
        return
    click.echo(f"Job {job['id']}  {job['name']}  ({job['kind']})")
    click.echo(f"  owner      {job['owner']}   group {job['group']}")
    click.echo(f"  state      {job['state']}" + (f"  — {job['reason']}" if job.get("reason") else ""))
    click.echo(f"  placement  {job.get('capacity') or '-'} on {job.get('partition') or '-'} (policy {job.get('policy')})")
    click.echo(f"  reclaims   {job.get('reclaims', 0)}   failures {job.get('failures', 0)}")
    if job.get("deadline"):
        click.echo(f"  deadline   {job['deadline']}")
    if job.get("log"):
        click.echo(f"  log        {job['log']}")
    click.echo("")
    rows = [
        [
            a["number"],
            a.get("slurm_job_id") or "",
            a.get("partition") or "",
            a.get("capacity") or "",
            a["state"],
            a.get("nodes") or "",
            a.get("started_at") or "",
            a.get("ended_at") or "",
            duration(a.get("lost_s")),
        ]
        for a in job["attempts"]
    ]
    print_table(rows, ["ATTEMPT", "SLURM", "PARTITION", "CAPACITY", "OUTCOME", "NODES", "START", "END", "LOST"])
    if job.get("events"):
        click.echo("")
        for e in job["events"][-10:]:
            click.echo(f"  {e['at']}  {e['kind']:<12} {e['message']}")


@cli.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@pass_ctx
def cancel(ctx: Context, job_ids: tuple[int, ...]) -> None:
    """Cancel jobs (your own; admins: any)."""
    result = ctx.call("cancel", job_ids=list(job_ids))
    for item in result:
        click.echo(f"Job {item['id']}: {item['state']}")
