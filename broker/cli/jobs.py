"""Job commands for researchers: submit, status/ls, show, cancel, history."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from broker.cli.main import Context, cli
from broker.cli.output import client_of, duration, print_json, print_table
from broker.cli.params import WHOLE
from broker.errors import SpecError

if TYPE_CHECKING:
    from broker.client import Job, Plan

pass_ctx = click.make_pass_decorator(Context)

KINDS = ("render", "simulation", "finetune", "other")
CHECKPOINT_STYLES = ("signal", "pieces", "none")


_KEY_OF = {"script": "script", "sweep": "sweep", "checkpoint dir": "[checkpoint] dir"}
"""How a job file writes each path ``_file_path`` reads."""


def _file_path(path: str, base: str, what: str) -> str:
    """A path the job file names: ``~`` is your home, a relative path is from the job file's folder
    (``base``); an empty one, or one with a shell variable (nothing expands them here), is refused."""
    if not path.strip():
        raise SpecError(f"{what} is empty in the job file", hint=f"give the {what}'s path, or leave the key out")
    if "$" in path:
        raise SpecError(f"{what}: {path!r} holds a shell variable, and nothing expands it",
                        hint=f"write the path itself, e.g. {_KEY_OF[what]} = \"~/...\", or an absolute path")
    return os.path.join(base, os.path.expanduser(path))


def build_spec(job_file: str | None, flags: dict[str, Any], command: tuple[str, ...]) -> dict[str, Any]:
    """The fields the daemon checks (``build_request`` without its cautions)."""
    return build_request(job_file, flags, command)[0]


def build_request(job_file: str | None, flags: dict[str, Any],
                  command: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Merge a TOML job file with flags (flags win) into the fields the daemon checks, and the
    cautions of the parse made here (``JobSpec.cautions``; a job parsed by the daemon gets its own).

    Files (the job file, a script, a sweep) are read here, as the user, so the
    daemon never opens a path a user names: a job that names one is parsed
    here (``broker.spec``, which reads them) and goes as the parser wrote it.
    A job of flags and a command names no file: its fields go as written, and
    the daemon checks them with the same parser (its refusal reads the same),
    so ``gbroker submit -- cmd`` does not load the parser at all.
    """
    data: dict[str, Any] = {}
    base = os.getcwd()  # os.path, not pathlib: `gbroker submit` starts without pathlib and urllib
    if job_file:
        from broker.spec import load_job_file

        data = load_job_file(job_file)
        base = os.path.dirname(os.path.realpath(job_file))
        script = data.get("script")
        if isinstance(script, str) and "\n" not in script:
            data["script"] = _file_path(script, base, "script")
        sweep = data.get("sweep")
        if isinstance(sweep, str):
            data["sweep"] = _file_path(sweep, base, "sweep")
    for key, value in flags.items():
        if value is None:
            continue
        if key in ("checkpoint_dir", "checkpoint_style"):
            section = data.get("checkpoint") or {}
            section = {"style": section} if isinstance(section, str) else dict(section)
            if key == "checkpoint_dir":
                if not value.strip():
                    raise SpecError("--checkpoint-dir is empty", hint="give the folder the job saves in")
                section["dir"] = os.path.abspath(os.path.expanduser(value))  # a flag: from where you are
                if "style" not in section and not flags.get("checkpoint_style"):
                    section["style"] = "signal"  # --checkpoint-dir alone: the program saves on SIGUSR1
            else:
                section["style"] = value
            data["checkpoint"] = section
        elif key == "gpu":
            if value:  # --gpu a100,h100 and/or --gpu a100 --gpu h100
                data["gpu"] = [name.strip() for item in value for name in item.split(",")]
        elif key == "script_path":
            data["script"] = os.path.abspath(value)
        elif key == "array":
            data["pieces"] = value
        elif key == "sweep":
            data["sweep"] = os.path.abspath(value)  # read as you, by the spec parser; the daemon gets the lines
        elif key == "after":
            data["after"] = _job_numbers(value)
        elif key == "env":
            env = dict(data.get("env") or {})
            given: set[str] = set()
            for item in value:
                name, sep, val = item.partition("=")
                if not sep:
                    raise SpecError(f"env: {item!r} is not NAME=VALUE", hint="write --env NAME=VALUE")
                if name in given:
                    raise SpecError(f"env: --env {name}= is given twice", hint="give each variable once")
                given.add(name)
                env[name] = val  # a flag wins over the job file's value
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
    if job_file and isinstance(ck, dict) and isinstance(ck.get("dir"), str) and flags.get("checkpoint_dir") is None:
        ck["dir"] = _file_path(ck["dir"], base, "checkpoint dir")  # the job file's own value
    if not job_file and "script" not in data and "sweep" not in data:
        if "name" not in data:  # named here as the parser would: the log this client makes carries it
            from broker.jobname import DEFAULT_KIND, default_name

            data["name"] = default_name(data.get("command"), None, data.get("kind") or DEFAULT_KIND)
        return data, ()
    from datetime import UTC, datetime

    from broker.spec import parse_spec, spec_to_dict

    spec = parse_spec(data, now=datetime.now(UTC))
    return spec_to_dict(spec), spec.cautions


@cli.command()
@click.option("--name", help="Job name (letters, digits, . _ -; at most 64).")
@click.option("--kind", type=click.Choice(KINDS), help="What the job is [default: other].")
@click.option("--gpus", "gpus_per_node", type=WHOLE, help="GPUs per node [default: 1].")
@click.option("--nodes", type=WHOLE, help="Nodes, run as one gang [default: 1].")
@click.option("--gpu", multiple=True, metavar="TYPE[,TYPE...]",
              help="GPU type, or several (any of them), e.g. a100 or a100,h100; repeatable [default: any type].")
@click.option("--gpu-mem-gb", type=WHOLE, metavar="GB", help="At least this much memory per GPU, in GB.")
@click.option("--cpus-per-gpu", type=WHOLE, metavar="N", help="CPUs per GPU (not with --cpus-per-task).")
@click.option("--cpus-per-task", type=WHOLE, metavar="N", help="CPUs per task (not with --cpus-per-gpu).")
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
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="Where the job saves checkpoints (alone: --checkpoint-style signal, saves on SIGUSR1).")
@click.option(
    "--checkpoint-style",
    type=click.Choice(CHECKPOINT_STYLES),
    help="signal: the program saves on SIGUSR1; pieces: independent pieces restart freely; none.",
)
@click.option("--group", "-g", help="Your group (Slurm account), e.g. vision.")
@click.option("--partition", help="Force a partition instead of letting the policy choose.")
@click.option("--script", "script_path", metavar="FILE", help="A batch script to run.")
@click.option("--env", "-e", multiple=True, metavar="NAME=VALUE", help="Extra environment (repeatable).")
@click.option("--max-retries", type=WHOLE, help="Retries after the program's own failures [default: 2].")
@click.option("--array", metavar="PIECES",
              help="Run as an array of pieces, Slurm's --array grammar: 1-400, 1-400:2, 1,5,9-12, 1-400%16 "
              "(16 at a time). Each piece gets GBROKER_PIECE.")
@click.option("--chunk", type=WHOLE, metavar="N", help="Pieces per array task (GBROKER_PIECE_FIRST.._LAST) [default: 1].")
@click.option("--sweep", metavar="FILE",
              help="A sweep: one line of arguments per piece, appended to the command (read as you).")
@click.option("--after", metavar="ID[,ID...]", help="Start only after these jobs completed (afterok).")
@click.option("--key", metavar="KEY",
              help="Idempotency key (gb- and 8-40 lower-case letters or digits): submitting again with the "
              "same key returns the first job instead of making a second [default: a new one each time].")
@click.option("--dry-run", is_flag=True,
              help="Say where the job would go, what it would cost and whether it would be accepted "
              "(Slurm's pre-flight, quota, budget); store and queue nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[JOB_FILE.toml] [-- COMMAND...]")
@pass_ctx
def submit(ctx: Context, args: tuple[str, ...], as_json: bool, key: str | None, dry_run: bool,
           **flags: Any) -> None:
    """Submit a job from a TOML job file (name ending in .toml) and/or flags.

    \b
    Examples:
      gbroker submit job.toml
      gbroker submit --group vision --gpus 2 --time 4h --checkpoint-dir ~/ck -- python train.py
      gbroker submit --kind render --no-interruptible --group climate --time 2h --script render.sh

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
    if args and args[0].lower().endswith(".toml"):
        job_file, command = args[0], args[1:]
        if not os.path.isfile(job_file):
            raise SpecError(f"job file {job_file} does not exist", hint="check the path")
    spec, cautions = build_request(job_file, flags, command)
    if dry_run:
        if key is not None:
            raise SpecError("--key names the job a submission makes, and --dry-run makes none",
                            hint="leave out --key, or --dry-run to submit")
        _print_plan(client_of(ctx).plan(spec), cautions, as_json)
        return
    # The key is made here (by the client), so a retry after a lost answer (a daemon restart)
    # names the same job.
    result = client_of(ctx).submit(spec, key=key)
    said = tuple(dict.fromkeys(cautions + result.cautions))  # a job file's parse here, the daemon's of the rest
    if as_json:
        print_json({**result.raw, "cautions": list(said)} if said else result.raw)
        return
    job = result.job
    slurm = f", Slurm job {result.slurm_job_id}" if result.slurm_job_id else ""
    click.echo(f"Submitted job {job.id} ({job.name}) to {job.partition} [{job.capacity}]{slurm}")
    if result.note:
        click.echo(f"  note: {result.note}")
    for caution in said:
        click.echo(f"  note: {caution}")


def _print_plan(plan: Plan, cautions: tuple[str, ...], as_json: bool) -> None:
    said = tuple(dict.fromkeys(cautions + plan.cautions))
    if as_json:
        print_json({**plan.raw, "cautions": list(said)} if said else plan.raw)
        return
    raw = plan.raw
    click.echo(f"Would submit {plan.name} to {plan.partition} [{plan.capacity}]: nothing stored or queued (--dry-run)")
    where = ", ".join(x for x in (raw.get("gpu_type"), f"zone {raw['zone']}" if raw.get("zone") else None) if x)
    click.echo(f"  pool      {plan.pool}{f' ({where})' if where else ''}; {plan.placed_by}")
    shown = raw.get("estimates") if isinstance(raw.get("estimates"), dict) else {}
    costs = [f"{text} on {'on-demand' if c == 'ondemand' else c}" for c, text in shown.items() if text]
    tasks = raw.get("tasks") if isinstance(raw.get("tasks"), int) else 1
    size = f"{raw.get('gpus')} GPU(s) x {duration(raw.get('slurm_limit_s'))}" + (f" x {tasks} tasks" if tasks > 1 else "")
    click.echo(f"  estimate  {', '.join(costs) or 'no price in the price book'} "
               f"(at most: {size}, Slurm's limit in whole minutes)")
    budget = raw.get("budget")
    if isinstance(budget, dict):
        click.echo(f"  budget    {budget.get('left_after')} of {budget.get('amount')} in {budget.get('semester')} "
                   "would be left, with this job's estimate reserved")
    click.echo(f"  Slurm     {plan.slurm}")
    for pool, why in (raw.get("partition_limits") or {}).items():
        click.echo(f"  skipped   {pool}: {why}")
    if plan.note:
        click.echo(f"  note: {plan.note}")
    for caution in said:
        click.echo(f"  note: {caution}")


def _job_numbers(text: str) -> list[int]:
    out = []
    for item in str(text).split(","):
        if not (item.strip().isascii() and item.strip().isdigit()):
            raise SpecError(f"after: {item.strip()!r} is not a job number", hint="--after 12,13")
        out.append(int(item))
    return out


def _job_rows(jobs: list[Job]) -> list[list[Any]]:
    return [
        [j.id, j.name, j.owner, j.group, j.state, j.capacity or "", j.partition or "", j.attempt_count,
         j.slurm_job_id or "", duration(j.age_s)]
        for j in jobs
    ]


_JOB_HEADERS = ["ID", "NAME", "USER", "GROUP", "STATE", "CAPACITY", "PARTITION", "ATTEMPTS", "SLURM", "AGE"]


def job_filters(f: Any) -> Any:
    """The options that pick jobs (status, history, cancel); the daemon filters all but the name."""
    from broker.client import JOB_STATES

    for option in reversed((
        click.option("--name", "name_glob", metavar="PATTERN",
                     help="Only jobs whose name matches, shell-style (quote it): 'sweep-*'."),
        click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state."),
        click.option("--group", "-g", help="Only jobs of this group (Slurm account)."),
        click.option("--partition", "partitions", multiple=True, metavar="PARTITION",
                     help="Only jobs placed on this partition (repeatable)."),
        click.option("--user", "-u", metavar="NAME", help="Only this user's jobs (another user's: admins only)."),
    )):
        f = option(f)
    return f


def select_jobs(ctx: Context, *, active: bool, all_users: bool, limit: int, name_glob: str | None,
                state: str | None, group: str | None, partitions: tuple[str, ...], user: str | None) -> list[Job]:
    """The jobs the filters pick, newest first, at most ``limit``."""
    from broker.client import MAX_LIST

    jobs = client_of(ctx).jobs(active=active, all_users=all_users, limit=MAX_LIST if name_glob else limit,
                               user=user, group=group, state=state, partitions=list(partitions) or None)
    if name_glob is not None:
        import fnmatch

        jobs = [j for j in jobs if fnmatch.fnmatchcase(j.name, name_glob)][:limit]
    return jobs


@cli.command()
@click.option("--all", "all_users", is_flag=True, help="Every user's jobs (admins only).")
@job_filters
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def status(ctx: Context, all_users: bool, as_json: bool, **filters: Any) -> None:
    """List your active jobs (with --state: the jobs in that state, ended ones too).

    \b
    Examples:
      gbroker status --name 'sweep-*'
      gbroker status --state pending --group vision
    """
    jobs = select_jobs(ctx, active=True, all_users=all_users, limit=200, **filters)
    if as_json:
        print_json([j.raw for j in jobs])
    elif not jobs:
        picked = any(v for v in filters.values())
        click.echo("No job matches." if picked else "No active jobs. `gbroker history` lists finished ones.")
    else:
        print_table(_job_rows(jobs), _JOB_HEADERS)
        _progress_lines(jobs)
        for j in (j for j in jobs if j.state in ("pending", "held") and j.reason):
            click.echo(f"  job {j.id} {j.state}: {j.reason}")


def _progress_lines(jobs: list[Job]) -> None:
    arrays = [j for j in jobs if j.pieces]
    if arrays:
        click.echo("")
    for j in arrays:
        click.echo(f"  job {j.id} pieces: {(j.pieces or {}).get('line', '')}")


cli.add_command(status, "ls")


@cli.command()
@click.option("--limit", default=50, show_default=True, help="How many jobs.")
@click.option("--all", "all_users", is_flag=True, help="Every user's jobs (admins only).")
@job_filters
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def history(ctx: Context, limit: int, all_users: bool, as_json: bool, **filters: Any) -> None:
    """List your jobs, newest first, finished ones included."""
    jobs = select_jobs(ctx, active=False, all_users=all_users, limit=limit, **filters)
    if as_json:
        print_json([j.raw for j in jobs])
    elif not jobs:
        click.echo("No job matches." if any(v for v in filters.values()) else "No jobs yet.")
    else:
        print_table(_job_rows(jobs), _JOB_HEADERS)


@cli.command()
@click.argument("job_id", type=WHOLE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--follow", is_flag=True, help="Then follow it until it ends, as `gbroker watch`.")
@pass_ctx
def show(ctx: Context, job_id: int, as_json: bool, follow: bool) -> None:
    """Show one job: its state, placement, log, attempts and recent events (all its fields with --json)."""
    job = client_of(ctx).show(job_id)
    if follow:
        _show(job, as_json)
        click.get_current_context().invoke(watch, job_id=job_id)
        return
    _show(job, as_json)


def _show(job: Job, as_json: bool) -> None:
    if as_json:
        print_json(job.raw)
        return
    click.echo(f"Job {job.id}  {job.name}  ({job.kind})")
    click.echo(f"  owner      {job.owner}   group {job.group}")
    click.echo(f"  state      {job.state}" + (f"  — {job.reason}" if job.reason else ""))
    click.echo(f"  placement  {job.capacity or '-'} on {job.partition or '-'} (policy {job.policy})")
    click.echo(f"  reclaims   {job.reclaims}   failures {job.failures}")
    if job.deadline:
        click.echo(f"  deadline   {job.deadline}")
    if job.log:
        click.echo(f"  log        {job.log}")
    if job.pieces:
        click.echo(f"  pieces     {job.pieces.get('line', '')}")
        for state, ranges in (job.array or {}).get("by_state", {}).items():
            click.echo(f"    {state:<10} {ranges}")
        failed = [p for p in (job.array or {}).get("pieces", []) if p["state"] == "failed"]
        for p in failed[:20]:
            click.echo(f"    piece {p['piece']} failed: {p['reason']}")
    click.echo("")
    rows = [
        [a.number, a.slurm_job_id or "", a.partition or "", a.capacity or "", a.state, a.nodes or "",
         a.started_at or "", a.ended_at or "", duration(a.lost_s)]
        for a in job.attempts
    ]
    print_table(rows, ["ATTEMPT", "SLURM", "PARTITION", "CAPACITY", "OUTCOME", "NODES", "START", "END", "LOST"])
    if job.events:
        click.echo("")
        for e in job.events[-10:]:
            click.echo(f"  {e.at}  {e.kind:<12} {e.message}")


@cli.command()
@click.argument("job_ids", type=WHOLE, nargs=-1)
@job_filters
@click.option("--all", "every", is_flag=True, help="Every active job of yours (with filters: every one they pick).")
@pass_ctx
def cancel(ctx: Context, job_ids: tuple[int, ...], every: bool, **filters: Any) -> None:
    """Cancel jobs (your own; admins: any), by number or by what they are.

    \b
    Examples:
      gbroker cancel 12 13
      gbroker cancel --name 'sweep-*'       # your active jobs of that name
      gbroker cancel --state pending --group vision
      gbroker cancel --all                  # every active job of yours
    """
    from broker.client import ENDED

    picked = any(v for v in filters.values())
    if job_ids and (picked or every):
        raise SpecError("give job numbers, or filters (--name, --state, --group, --partition, --user, --all), "
                        "not both", hint="`gbroker status` with the same filters lists what they pick")
    if not job_ids and not (picked or every):
        raise SpecError("name the jobs to cancel",
                        hint="gbroker cancel 12 13; or pick them: --name 'sweep-*', --state pending, --group, "
                        "--partition; --all for every active job of yours")
    if filters["state"] in ENDED:
        raise SpecError(f"jobs in state {filters['state']} have ended; there is nothing to cancel",
                        hint="pick an active state: admitted, pending, running, recovering, held or unknown")
    if not job_ids:
        from broker.client import MAX_LIST

        job_ids = tuple(j.id for j in select_jobs(ctx, active=True, all_users=False, limit=MAX_LIST, **filters))
        if not job_ids:
            click.echo("No active job matches; nothing cancelled.")
            return
    for item in client_of(ctx).cancel(list(job_ids)):
        click.echo(f"Job {item.id}: {item.state}")


def _progress_text(job: Job) -> str:
    from broker.pieces import bar

    pieces = job.pieces
    if pieces:
        return f"job {job.id} {bar(pieces['counts'].get('done', 0), pieces['total'])} {pieces['line']}"
    return f"job {job.id} {job.state}" + (f" — {job.reason}" if job.reason else "")


@cli.command()
@click.argument("job_id", type=WHOLE)
@click.option("--interval", default=2.0, show_default=True, help="Seconds between looks.")
@pass_ctx
def watch(ctx: Context, job_id: int, interval: float) -> None:
    """Follow a job until it ends: a progress bar for an array, its state for a job."""
    import sys
    import time

    tty = sys.stdout.isatty()
    last = ""
    while True:
        job = client_of(ctx).show(job_id)
        text = _progress_text(job)
        if text != last:
            if tty:
                click.echo("\r" + text.ljust(len(last)), nl=False)
            else:
                click.echo(text)
            last = text
        if job.ended:
            if tty:
                click.echo("")
            click.echo(f"job {job_id} {job.state}" + (f": {job.reason}" if job.reason else ""))
            return
        time.sleep(max(0.2, interval))


LOG_MAX_BYTES = 16 * 1024 * 1024
"""What `gbroker logs` prints at most by default (--max-bytes 0: all of it)."""
LOG_CHUNK = 1024 * 1024
"""Bytes read at a time; a line longer than this is printed in pieces."""


@cli.command()
@click.argument("job_id", type=WHOLE)
@click.option("--piece", type=WHOLE, help="An array's piece (its GBROKER_PIECE).")
@click.option("--attempt", type=WHOLE, help="Only this attempt's output (the lines after its start line).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the job writes, across attempts, until it ends.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between looks with --follow.")
@click.option("--raw", is_flag=True,
              help="Print the log's bytes as they are (by default control characters show escaped, ESC as \\x1b).")
@click.option("--max-bytes", type=click.IntRange(min=0), default=LOG_MAX_BYTES, show_default=True, metavar="N",
              help="Read at most N bytes of the log, then say what was left out (0: no limit).")
@pass_ctx
def logs(ctx: Context, job_id: int, piece: int | None, attempt: int | None, follow: bool, interval: float,
         raw: bool, max_bytes: int) -> None:
    """Print a job's output, read as the job's owner (the daemon only says where the log is).

    An admin running this as root reads another user's log as that user, and only
    a regular file of theirs: a symlink, a FIFO or a device in its place is refused.
    Control characters the job printed show escaped unless --raw.
    """
    import time

    client = client_of(ctx)
    job = client.show(job_id)
    path = job.log_for(piece)
    printer = _LogPrinter(attempt, raw)
    fd: int | None = None
    offset = 0
    try:
        while True:
            if fd is None:
                fd = _open_log(path, job)
                if fd is None and not follow:
                    click.echo(f"job {job_id}: no output yet ({path} does not exist)", err=True)
                    return
            data = b""
            if fd is not None:
                want = LOG_CHUNK if not max_bytes else min(LOG_CHUNK, max_bytes - offset)
                data = os.pread(fd, want, offset) if want > 0 else b""
                offset += len(data)
                printer.feed(data)
                if max_bytes and offset >= max_bytes and (follow or os.fstat(fd).st_size > offset):
                    printer.finish()
                    _say_cut(job_id, path, offset, os.fstat(fd).st_size)
                    return
            if data:
                continue  # more may be there already
            if not follow:
                printer.finish()
                return
            if client.show(job_id).ended:
                follow = False  # one more read for what it wrote last, then stop
                continue
            time.sleep(max(0.1, interval))
    finally:
        if fd is not None:
            os.close(fd)


def _open_log(path: str, job: Job) -> int | None:
    """The log's descriptor, opened as the job's owner (``broker.joblog.open_log``); None while it is not there."""
    from broker import joblog

    try:
        return joblog.open_log(path, job.owner, job.owner_uid)
    except joblog.Unreadable as exc:
        raise SpecError(f"job {job.id}: {exc}",
                        hint="only the job's owner's own log file is shown; ask them what is there") from None


def _say_cut(job_id: int, path: str, read: int, size: int) -> None:
    click.echo(f"job {job_id}: stopped after {read:,} bytes of {path} ({size:,} bytes now; --max-bytes); "
               f"`gbroker logs {job_id} --max-bytes 0` prints all of it, --attempt N one attempt's", err=True)


class _LogPrinter:
    """Writes a log's bytes line by line: one attempt's lines (or all), escaped for a terminal unless raw."""

    def __init__(self, attempt: int | None, raw: bool) -> None:
        self.attempt = attempt
        self.raw = raw
        self.shown = attempt is None
        self.pending = b""

    def feed(self, data: bytes) -> None:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()  # an unfinished last line waits for its end ...
        self._write(lines)
        if len(self.pending) > LOG_CHUNK:  # ... unless it is that long: then it goes out as it is
            if self.shown:
                self._put(self.pending.decode("utf-8", "surrogateescape"), b"")
            self.pending = b""

    def finish(self) -> None:
        if self.pending:
            self._write([self.pending])
            self.pending = b""

    def _write(self, lines: list[bytes]) -> None:
        from broker.client import attempt_lines

        texts = [line.decode("utf-8", "surrogateescape") for line in lines]
        picked, self.shown = attempt_lines(texts, self.attempt, self.shown)
        for text in picked:
            self._put(text, b"\n")

    def _put(self, text: str, end: bytes) -> None:
        import sys

        from broker.joblog import shown

        line = text if self.raw else shown(text)
        sys.stdout.buffer.write(line.encode("utf-8", "surrogateescape") + end)
        sys.stdout.buffer.flush()
