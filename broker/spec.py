"""JobSpec: parse and validate what a researcher asks for (flags or a TOML job file).

Two sides call this module. The CLI calls ``load_job_file`` and ``parse_spec``
as the submitting user (it may read the job file and a script file), then sends
``spec_to_dict(spec)`` over the socket. The daemon calls ``spec_from_dict``,
which validates everything again but never reads a file: the daemon runs as
root and must not open paths a user names.

Only the standard library is imported here, so ``gbroker submit`` starts fast.

Durations follow Slurm: a bare number is *minutes* ("90" = 1h30m), as in
``sbatch --time=90``. Unit forms ("90s", "45m", "2h", "1h30m", "2d") and the
Slurm clock forms ("MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS") work too
(``broker.durations`` reads them, for every part of gbroker).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from broker.durations import DURATION_HELP, format_duration, parse_duration
from broker.errors import SpecError

T = TypeVar("T")

KINDS: tuple[str, ...] = ("render", "simulation", "finetune", "other")
CHECKPOINT_STYLES: tuple[str, ...] = ("signal", "pieces", "none")
"""signal: the program saves state when warned by a signal; pieces: independent
pieces (frame ranges) that restart freely; none: a restart starts from zero."""

DEFAULT_MAX_GPUS_PER_NODE = 8
DEFAULT_MAX_NODES = 16
DEFAULT_MAX_RETRIES = 2
DEFAULT_SIGNAL_LEAD_S = 120
MAX_RETRIES_LIMIT = 100
MAX_SIGNAL_LEAD_S = 3600
MAX_TIME_LIMIT_S = 365 * 24 * 3600
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_JOB_FILE_BYTES = 1024 * 1024
MAX_NAME_CHARS = 64
MAX_COMMAND_BYTES = 128 * 1024
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_PATH_CHARS = 4096
MAX_DEADLINE_AHEAD_S = 2 * 365 * 24 * 3600

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "GBROKER_")
"""Slurm's tools read SLURM_*/SBATCH_*/SALLOC_*/SRUN_* (SBATCH_ACCOUNT would change
the account, SLURM_CONF the cluster), and gbroker sets GBROKER_* for the
checkpoint helper. Compared ignoring letter case."""
LOADER_ENV_NAMES = frozenset({
    "PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "GLOBIGNORE",
    "CDPATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE",
    "PERL5LIB", "PERLLIB", "PERL5OPT", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
    "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "TZDIR",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GIT_EXEC_PATH", "XDG_CONFIG_DIRS",
})
"""Names that change how programs find binaries, libraries, modules or start-up
files. gbroker sets the job's basic environment itself; a job that needs one of
these sets it in its own script, where it affects nothing but that program."""
LOADER_ENV_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "MALLOC_", "GLIBC_")

INTERPRETERS = frozenset({"python", "python3", "bash", "sh", "zsh", "env", "srun", "mpirun", "torchrun"})

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "name",
    "kind",
    "gpus_per_node",
    "nodes",
    "time_limit",
    "deadline",
    "interruptible",
    "checkpoint",
    "group",
    "partition",
    "command",
    "script",
    "workdir",
    "env",
    "max_retries",
    "signal_lead_s",
    "warning_signal",
    "tasks_per_node",
)
WARNING_SIGNALS: tuple[str, ...] = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT")
"""Signals a job may ask for as its time-limit warning (sent to every process of the job)."""
TASKS_PER_GPU = "gpu"
"""``tasks_per_node = "gpu"``: one Slurm task per GPU (DDP launched by srun)."""
CHECKPOINT_KEYS: tuple[str, ...] = ("dir", "style")
SCRIPT_KEYS: tuple[str, ...] = ("text", "path")


@dataclass(frozen=True)
class JobSpec:
    """A validated job request. Times in whole seconds; datetimes in UTC.

    ``script`` always holds the script *text* (read by the CLI, as the user);
    ``script_path`` only remembers where it came from.
    """

    name: str
    kind: str
    group: str
    time_limit_s: int
    gpus_per_node: int = 1
    nodes: int = 1
    deadline: datetime | None = None
    interruptible: bool = True
    checkpoint_style: str = "none"
    checkpoint_dir: str | None = None
    partition: str | None = None
    command: tuple[str, ...] | None = None
    script: str | None = None
    script_path: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Sorted (name, value) pairs; a tuple keeps the spec immutable and hashable."""
    max_retries: int = DEFAULT_MAX_RETRIES
    signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S
    warning_signal: str | None = None
    """The time-limit warning the job asked for (``USR1``...), or None: no warning.
    A job with ``checkpoint.style = "signal"`` gets USR1 unless it names another."""
    tasks_per_node: int | str = 1
    """Slurm tasks per node: a number, or ``"gpu"`` for one per GPU."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def checkpointable(self) -> bool:
        return self.checkpoint_style != "none"

    @property
    def tasks(self) -> int:
        """Slurm tasks per node, ``"gpu"`` resolved."""
        return self.gpus_per_node if self.tasks_per_node == TASKS_PER_GPU else int(self.tasks_per_node)

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


# --------------------------------------------------------------------------- entry points


def load_job_file(path: str) -> dict[str, Any]:
    """Read a TOML job file. Errors carry the file name and tomllib's line/column."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError(
            f"job file {path}: cannot read it ({exc.strerror or exc})",
            hint="check the path and that you may read the file",
        ) from exc
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise SpecError(f"job file {path}: larger than 1 MiB", hint="a job file holds settings, not data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"job file {path}: not valid UTF-8 ({exc.reason} at byte {exc.start})",
                        hint="save the file as UTF-8") from exc
    import tomllib  # only when a job file is read: `gbroker submit -- cmd` never pays for it

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(
            f"job file {path}: not valid TOML: {exc}",
            hint="see https://toml.io; strings need quotes, lists use [\"a\", \"b\"]",
        ) from exc
    except RecursionError:
        raise SpecError(f"job file {path}: nested too deeply to be a job file",
                        hint="a job file is a flat table of settings") from None


def parse_spec(
    data: Mapping[str, Any],
    *,
    now: datetime,
    partitions: set[str] | None = None,
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> JobSpec:
    """Validate a job request from the CLI side; may read a script file named by path.

    ``now`` (timezone-aware) anchors relative deadlines ("+36h") and the
    "deadline in the future" check. ``partitions``, when given, lists the
    partitions a user may name.
    """
    return _Parser(now, partitions, max_gpus_per_node, max_nodes, read_files=True).parse(data)


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """A JSON-able dict that ``spec_from_dict`` turns back into an equal JobSpec."""
    out: dict[str, Any] = {
        "name": spec.name,
        "kind": spec.kind,
        "group": spec.group,
        "gpus_per_node": spec.gpus_per_node,
        "nodes": spec.nodes,
        "time_limit": f"{spec.time_limit_s}s",
        "interruptible": spec.interruptible,
        "checkpoint": {"style": spec.checkpoint_style},
        "env": dict(spec.env),
        "max_retries": spec.max_retries,
        "signal_lead_s": spec.signal_lead_s,
    }
    if spec.warning_signal is not None:
        out["warning_signal"] = spec.warning_signal
    if spec.tasks_per_node != 1:
        out["tasks_per_node"] = spec.tasks_per_node
    if spec.checkpoint_dir is not None:
        out["checkpoint"]["dir"] = spec.checkpoint_dir
    if spec.deadline is not None:
        out["deadline"] = spec.deadline.isoformat()
    if spec.partition is not None:
        out["partition"] = spec.partition
    if spec.command is not None:
        out["command"] = list(spec.command)
    if spec.script is not None:
        script: dict[str, str] = {"text": spec.script}
        if spec.script_path is not None:
            script["path"] = spec.script_path
        out["script"] = script
    if spec.workdir is not None:
        out["workdir"] = spec.workdir
    return out


def spec_from_dict(
    data: Mapping[str, Any],
    *,
    now: datetime | None = None,
    partitions: set[str] | None = None,
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> JobSpec:
    """Re-validate a dict from ``spec_to_dict``; never touches disk.

    With ``now`` (the daemon at submit time) every check runs. Without it (a
    stored spec read back later) the deadline is not required to lie in the
    future, and relative deadlines are refused because nothing anchors them.
    A script must come as text: a bare path is refused, the client reads it.
    """
    return _Parser(now, partitions, max_gpus_per_node, max_nodes, read_files=False).parse(data)


# --------------------------------------------------------------------------- #SBATCH guard

FORBIDDEN_SBATCH_LONG: tuple[str, ...] = ("partition", "account", "uid", "gid", "qos", "reservation", "comment")
"""Set by gbroker itself. sbatch accepts unambiguous prefixes of long options,
so '--part=x' counts too. The comment carries gbroker's job key."""
FORBIDDEN_SBATCH_SHORT = frozenset("pAq")
# sbatch short options that take no argument, and so may be bundled ("-Hp gpu").
_SBATCH_SHORT_NO_ARG = frozenset("hHIkOQsuvVW")


def forbidden_sbatch_option(line: str) -> str | None:
    """The forbidden option a '#SBATCH' line sets, or None."""
    body = line.strip()[len("#SBATCH"):]
    try:
        tokens = shlex.split(body, comments=True)
    except ValueError:
        tokens = body.split()
    for tok in tokens:
        if tok.startswith("--"):
            opt = tok[2:].split("=", 1)[0]
            if not opt:
                continue
            for name in FORBIDDEN_SBATCH_LONG:
                if name.startswith(opt):
                    return f"--{name}"
        elif tok.startswith("-") and len(tok) > 1:
            for ch in tok[1:]:
                if ch in FORBIDDEN_SBATCH_SHORT:
                    return f"-{ch}"
                if ch not in _SBATCH_SHORT_NO_ARG:
                    break  # the rest of the token is this option's argument
    return None


# --------------------------------------------------------------------------- the parser


def _close_match(word: str, choices: tuple[str, ...], cutoff: float = 0.6) -> str | None:
    import difflib  # only on an error path; keeps the CLI's start fast

    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    return close[0] if close else None


class SpecProblems(SpecError):
    """Several problems in one request; ``problems`` holds one SpecError per problem."""

    def __init__(self, problems: list[SpecError]) -> None:
        self.problems = problems
        lines = []
        for p in problems:
            lines.append(f"  - {p.message}")
            if p.hint:
                lines.append(f"      hint: {p.hint}")
        super().__init__(f"{len(problems)} problems in the job spec:\n" + "\n".join(lines),
                         hint="fix them all, then submit again")


def _combine(errors: list[SpecError]) -> SpecError:
    """One error as is; several as one SpecProblems (flattened), a line per problem."""
    flat: list[SpecError] = []
    for e in errors:
        flat.extend(e.problems if isinstance(e, SpecProblems) else [e])
    return flat[0] if len(flat) == 1 else SpecProblems(flat)


def _type_name(value: Any) -> str:
    return {bool: "true/false", int: "a whole number", float: "a decimal number", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


class _Parser:
    """One validation pass. Raises SpecError on the first problem, naming the field."""

    def __init__(
        self,
        now: datetime | None,
        partitions: set[str] | None,
        max_gpus_per_node: int,
        max_nodes: int,
        *,
        read_files: bool,
    ) -> None:
        if now is not None and (now.tzinfo is None or now.utcoffset() is None):
            raise ValueError("now must be timezone-aware")
        self.now = now
        self.partitions = partitions
        self.max_gpus_per_node = max_gpus_per_node
        self.max_nodes = max_nodes
        self.read_files = read_files

    # -- helpers ---------------------------------------------------------------

    @staticmethod
    def fail(fld: str, message: str, hint: str | None = None) -> SpecError:
        return SpecError(f"{fld}: {message}", hint=hint)

    @staticmethod
    def check_keys(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
        errors = []
        for key in data:
            if not isinstance(key, str):
                errors.append(SpecError(f"{where}: keys must be strings, got {key!r}"))
                continue
            if key in known:
                continue
            close = _close_match(key, known)
            label = f"{where}.{key}" if where != "job" else key
            hint = f"did you mean {close}?" if close else f"known keys: {', '.join(known)}"
            errors.append(SpecError(f"{label}: unknown key", hint=hint))
        if errors:
            raise _combine(errors)

    def integer(self, data: Mapping[str, Any], fld: str, default: int, lo: int, hi: int, why_hi: str) -> int:
        value = data.get(fld, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(fld, f"must be a whole number, got {_type_name(value)} {value!r}",
                            hint=f"write {fld} = {default}")
        if value < lo:
            raise self.fail(fld, f"must be at least {lo}, got {value}")
        if value > hi:
            raise self.fail(fld, f"must be at most {hi} ({why_hi}), got {value}")
        return value

    def string(self, data: Mapping[str, Any], fld: str) -> str | None:
        value = data.get(fld)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(fld, f"must be a string, got {_type_name(value)} {value!r}",
                            hint=f'put it in quotes: {fld} = "..."')
        return value

    def name(self, fld: str, value: str) -> str:
        if not NAME_RE.fullmatch(value) or value.startswith("-"):
            if len(value) > MAX_NAME_CHARS:
                why = f"longer than {MAX_NAME_CHARS} characters"
            elif not value:
                why = "empty"
            elif value.startswith("-"):
                why = "starts with '-'"
            else:
                bad = sorted({c for c in value if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
                why = "contains " + ", ".join(repr(c) for c in bad)
            raise self.fail(fld, f"{value!r} is not allowed ({why})",
                            hint=f"use only letters, digits, '.', '_' and '-', at most {MAX_NAME_CHARS} characters")
        return value

    def path(self, fld: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(fld, f"must be a path string, got {_type_name(value)} {value!r}")
        if "\x00" in value or "\n" in value or "\r" in value:
            raise self.fail(fld, "contains a NUL or line break", hint="use a plain absolute path")
        if not _is_utf8(value):
            raise self.fail(fld, "is not valid UTF-8 text")
        if not value.startswith("/"):
            raise self.fail(fld, f"{value!r} is a relative path",
                            hint="write the full path starting with '/' (the job may run in another directory)")
        if len(value) > MAX_PATH_CHARS:
            raise self.fail(fld, f"longer than {MAX_PATH_CHARS} characters")
        return _clean_path(value)

    # -- the fields ------------------------------------------------------------

    def parse(self, data: Mapping[str, Any]) -> JobSpec:
        """Check every field, then raise one SpecError listing every problem (fix all in one go)."""
        if not isinstance(data, Mapping):
            raise SpecError(f"job: expected a table of settings, got {_type_name(data)}")
        errors: list[SpecError] = []

        def check(fn: Callable[..., T], *args: Any, fallback: T) -> T:
            try:
                return fn(*args)
            except SpecError as exc:
                errors.append(exc)
                return fallback

        check(self.check_keys, data, TOP_LEVEL_KEYS, "job", fallback=None)
        kind = check(self.kind, data, fallback="other")
        group = check(self.group, data, fallback="")
        gpus_per_node = check(self.integer, data, "gpus_per_node", 1, 1, self.max_gpus_per_node,
                              "the largest node has that many GPUs", fallback=1)
        nodes = check(self.integer, data, "nodes", 1, 1, self.max_nodes, "the cluster's limit per job", fallback=1)
        time_limit_s: int | None = check(self.time_limit, data, fallback=None)
        deadline = check(self.deadline, data, time_limit_s, fallback=None)
        interruptible = check(self.boolean, data, "interruptible", True, fallback=True)
        no_ckpt: tuple[str, str | None] = ("none", None)
        style, ckpt_dir = check(self.checkpoint, data, fallback=no_ckpt)
        partition = check(self.partition, data, fallback=None)
        command = check(self.command, data, fallback=None)
        no_script: tuple[str | None, str | None] = (None, None)
        script, script_path = check(self.script, data, fallback=no_script)
        if data.get("command") is None and data.get("script") is None:
            errors.append(SpecError("command: give a command (a list) or a script",
                                    hint='command = ["python", "train.py"]  or  script = "/abs/path/job.sh"'))
        elif data.get("command") is not None and data.get("script") is not None:
            errors.append(SpecError("command/script: give one of command or script, not both"))
        workdir = None if data.get("workdir") is None else check(self.path, "workdir", data["workdir"], fallback=None)
        no_env: tuple[tuple[str, str], ...] = ()
        env = check(self.env, data, fallback=no_env)
        max_retries = check(self.integer, data, "max_retries", DEFAULT_MAX_RETRIES, 0, MAX_RETRIES_LIMIT,
                            "the limit", fallback=DEFAULT_MAX_RETRIES)
        signal_lead_s = check(self.signal_lead, data, time_limit_s, fallback=DEFAULT_SIGNAL_LEAD_S)
        warning_signal = check(self.warning_signal, data, style, fallback=None)
        one: int | str = 1
        tasks_per_node = check(self.tasks_per_node, data, fallback=one)
        name_raw = check(self.string, data, "name", fallback=None)
        name = (check(self.name, "name", name_raw, fallback="") if name_raw is not None
                else _default_name(command, script_path, kind))
        if errors:
            raise _combine(errors)
        assert time_limit_s is not None
        return JobSpec(
            name=name, kind=kind, group=group, time_limit_s=time_limit_s, gpus_per_node=gpus_per_node,
            nodes=nodes, deadline=deadline, interruptible=interruptible, checkpoint_style=style,
            checkpoint_dir=ckpt_dir, partition=partition, command=command, script=script,
            script_path=script_path, workdir=workdir, env=env, max_retries=max_retries,
            signal_lead_s=signal_lead_s, warning_signal=warning_signal, tasks_per_node=tasks_per_node,
        )

    def group(self, data: Mapping[str, Any]) -> str:
        raw = self.string(data, "group")
        if raw is None:
            raise self.fail("group", "missing", hint='name the Slurm account to charge: group = "mylab"')
        return account_name(self.name("group", raw))

    def boolean(self, data: Mapping[str, Any], fld: str, default: bool) -> bool:
        value = data.get(fld, default)
        if not isinstance(value, bool):
            raise self.fail(fld, f"must be true or false, got {value!r}")
        return value

    def signal_lead(self, data: Mapping[str, Any], time_limit_s: int | None) -> int:
        # A short job given no lead gets warned half-way rather than refused.
        default_lead = DEFAULT_SIGNAL_LEAD_S if time_limit_s is None else min(DEFAULT_SIGNAL_LEAD_S, time_limit_s // 2)
        lead = self.integer(data, "signal_lead_s", default_lead, 0, MAX_SIGNAL_LEAD_S, "one hour")
        if time_limit_s is not None and lead >= time_limit_s:
            raise self.fail("signal_lead_s", f"{lead}s is not shorter than the time limit ({time_limit_s}s)",
                            hint="the warning signal must come before the job ends; lower signal_lead_s")
        return lead

    def warning_signal(self, data: Mapping[str, Any], style: str) -> str | None:
        value = data.get("warning_signal")
        if value is None:
            return "USR1" if style == "signal" else None
        if not isinstance(value, str):
            raise self.fail("warning_signal", f"must be a signal name, got {_type_name(value)} {value!r}",
                            hint=f"one of {', '.join(WARNING_SIGNALS)}, e.g. warning_signal = \"USR1\"")
        name = value.strip().upper().removeprefix("SIG")
        if name in ("", "NONE"):
            return None
        if name not in WARNING_SIGNALS:
            raise self.fail("warning_signal", f"{value!r} is not a signal a job can be warned with",
                            hint=f"one of {', '.join(WARNING_SIGNALS)}, or \"none\"")
        return name

    def tasks_per_node(self, data: Mapping[str, Any]) -> int | str:
        value = data.get("tasks_per_node", 1)
        if isinstance(value, str) and value.strip().lower() == TASKS_PER_GPU:
            return TASKS_PER_GPU
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail("tasks_per_node", f"must be a whole number or \"gpu\", got {value!r}",
                            hint='tasks_per_node = 1 (one program per node) or "gpu" (one per GPU, for srun)')
        return self.integer(data, "tasks_per_node", 1, 1, 256, "a node's cores")

    def kind(self, data: Mapping[str, Any]) -> str:
        kind = data.get("kind", "other")
        if not isinstance(kind, str) or kind not in KINDS:
            close = _close_match(str(kind), KINDS, cutoff=0.5)
            hint = f"did you mean {close}?" if close else None
            raise self.fail("kind", f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}", hint=hint)
        return kind

    def time_limit(self, data: Mapping[str, Any]) -> int:
        value = data.get("time_limit")
        if value is None:
            raise self.fail("time_limit", "missing", hint='add e.g. time_limit = "2h" (a bare number is minutes, as in Slurm)')
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail("time_limit", f"must be a duration string, got {_type_name(value)} {value!r}",
                            hint=DURATION_HELP)
        try:
            seconds = value * 60 if isinstance(value, int) else parse_duration(value)
        except ValueError as exc:
            raise self.fail("time_limit", f"{value!r} is not a duration ({exc})", hint=DURATION_HELP) from None
        if seconds <= 0:
            raise self.fail("time_limit", f"must be longer than zero, got {value!r}", hint=DURATION_HELP)
        if seconds > MAX_TIME_LIMIT_S:
            raise self.fail("time_limit", f"{value!r} is longer than a year", hint="split the work into shorter jobs")
        return seconds

    def deadline(self, data: Mapping[str, Any], time_limit_s: int | None) -> datetime | None:
        value = data.get("deadline")
        if value is None:
            return None
        if isinstance(value, datetime):  # TOML offset date-times arrive parsed
            when = value
        elif isinstance(value, str):
            text = value.strip()
            if text.startswith("+"):
                if self.now is None:
                    raise self.fail("deadline", f"relative deadline {value!r} has no reference time",
                                    hint="store deadlines as ISO-8601 date-times")
                try:
                    offset = parse_duration(text[1:])
                except ValueError:
                    raise self.fail("deadline", f"{value!r} is not a relative time",
                                    hint='e.g. "+36h" or "+2d"') from None
                if offset > MAX_DEADLINE_AHEAD_S:
                    raise self.fail("deadline", f"{value!r} is more than two years away",
                                    hint="leave the deadline out instead")
                when = self.now + timedelta(seconds=offset)
            else:
                try:
                    when = datetime.fromisoformat(text)
                except ValueError:
                    raise self.fail("deadline", f"{value!r} is not an ISO-8601 date-time",
                                    hint='e.g. "2026-10-01T18:00:00+02:00" or "+36h"') from None
        else:
            raise self.fail("deadline", f"must be a date-time string, got {_type_name(value)} {value!r}",
                            hint='e.g. "2026-10-01T18:00:00+02:00" or "+36h"')
        if when.tzinfo is None or when.utcoffset() is None:
            raise self.fail("deadline", f"{value!r} has no time zone",
                            hint='add one, e.g. "+02:00" or "Z" for UTC')
        try:
            when = when.astimezone(UTC)
        except OverflowError:
            raise self.fail("deadline", f"{value!r} is out of range",
                            hint='e.g. "2026-10-01T18:00:00+02:00" or "+36h"') from None
        if self.now is not None:
            if when > self.now + timedelta(seconds=MAX_DEADLINE_AHEAD_S):
                raise self.fail("deadline", f"{when.isoformat()} is more than two years away",
                                hint="leave the deadline out instead")
            if when <= self.now:
                raise self.fail("deadline", f"{when.isoformat()} is in the past",
                                hint="give a future date-time, or leave the deadline out")
            if time_limit_s is not None and when < self.now + timedelta(seconds=time_limit_s):
                raise self.fail("deadline", f"{when.isoformat()} is sooner than now + time_limit "
                                f"({format_duration(time_limit_s)})",
                                hint="move the deadline later or shorten time_limit")
        return when

    def checkpoint(self, data: Mapping[str, Any]) -> tuple[str, str | None]:
        value = data.get("checkpoint")
        if value is None:
            return "none", None
        if isinstance(value, str):
            value = {"style": value}
        if not isinstance(value, Mapping):
            raise self.fail("checkpoint", f"must be a table, got {_type_name(value)}",
                            hint='checkpoint = { style = "signal", dir = "/scratch/me/ckpt" }')
        self.check_keys(value, CHECKPOINT_KEYS, "checkpoint")
        style = value.get("style", "none")
        if not isinstance(style, str) or style not in CHECKPOINT_STYLES:
            raise self.fail("checkpoint.style", f"unknown style {style!r}; valid: {', '.join(CHECKPOINT_STYLES)}")
        ckpt_dir = None if value.get("dir") is None else self.path("checkpoint.dir", value["dir"])
        if style == "signal" and ckpt_dir is None:
            raise self.fail("checkpoint.dir", "required when checkpoint.style is 'signal'",
                            hint="name the directory the program saves its state in")
        return style, ckpt_dir

    def partition(self, data: Mapping[str, Any]) -> str | None:
        value = self.string(data, "partition")
        if value is None:
            return None
        self.name("partition", value)
        if self.partitions is not None and value not in self.partitions:
            raise self.fail("partition", f"unknown partition {value!r}; valid: {', '.join(sorted(self.partitions))}",
                            hint="or leave it out and let gbroker place the job")
        return value

    def command(self, data: Mapping[str, Any]) -> tuple[str, ...] | None:
        value = data.get("command")
        if value is None:
            return None
        if isinstance(value, str):
            try:
                suggestion = repr(shlex.split(value)).replace("'", '"')
            except ValueError:
                suggestion = '["prog", "arg"]'
            raise self.fail("command", "must be a list of arguments, not one string (no shell runs it)",
                            hint=f"command = {suggestion}")
        if not isinstance(value, list) or not value:
            raise self.fail("command", f"must be a non-empty list of strings, got {_type_name(value)}")
        total = 0
        for i, arg in enumerate(value):
            if not isinstance(arg, str):
                raise self.fail(f"command[{i}]", f"must be a string, got {_type_name(arg)} {arg!r}",
                                hint="quote every argument")
            if "\x00" in arg or "\n" in arg or "\r" in arg:
                raise self.fail(f"command[{i}]", "contains a NUL or line break",
                                hint="use a script for multi-line programs")
            if not _is_utf8(arg):
                raise self.fail(f"command[{i}]", "is not valid UTF-8 text")
            total += len(arg.encode("utf-8", "surrogatepass")) + 1
        if not value[0]:
            raise self.fail("command[0]", "the program name is empty")
        if total > MAX_COMMAND_BYTES:
            raise self.fail("command", "longer than 128 KiB", hint="put long input in a file")
        return tuple(value)

    def script(self, data: Mapping[str, Any]) -> tuple[str | None, str | None]:
        value = data.get("script")
        if value is None:
            return None, None
        path: str | None = None
        text: str | None = None
        if isinstance(value, str):
            if "\n" in value:
                text = value
            else:
                path = self.path("script", value)
        elif isinstance(value, Mapping):
            self.check_keys(value, SCRIPT_KEYS, "script")
            if value.get("path") is not None:
                path = self.path("script.path", value["path"])
            if value.get("text") is not None:
                if not isinstance(value["text"], str):
                    raise self.fail("script.text", f"must be a string, got {_type_name(value['text'])}")
                text = value["text"]
            if text is None and path is None:
                raise self.fail("script", "give script.text or script.path")
        else:
            raise self.fail("script", f"must be a path or the script text, got {_type_name(value)}")
        if text is None:
            assert path is not None
            if not self.read_files:
                raise self.fail("script", "arrived as a path; the client must send the script text",
                                hint="submit with the gbroker command, which reads the script as you")
            text = _read_script(path)
        self.check_script(text)
        return text, path

    def check_script(self, text: str) -> None:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_SCRIPT_BYTES:
            raise self.fail("script", f"is {size} bytes, larger than 1 MiB", hint="keep data out of the script")
        if not _is_utf8(text):
            raise self.fail("script", "is not valid UTF-8", hint="save the script as UTF-8")
        if "\x00" in text:
            raise self.fail("script", "contains a NUL byte", hint="is this a binary file? give a text script")
        if "\r\n" in text:
            raise self.fail("script", "has DOS line breaks (\\r\\n)", hint="convert it, e.g. with dos2unix")
        if not text.startswith("#!"):
            raise self.fail("script", "does not start with '#!' (sbatch needs an interpreter line)",
                            hint="make the first line e.g. #!/bin/bash")
        for lineno, line in enumerate(text.split("\n"), start=1):
            if line.lstrip().startswith("#SBATCH"):
                opt = forbidden_sbatch_option(line)
                if opt is not None:
                    raise self.fail(
                        "script", f"line {lineno}: '#SBATCH {opt}' is not allowed: gbroker sets the partition, "
                        "account (group), qos, reservation, user and comment itself",
                        hint="remove the line; use group = / partition = in the job spec instead")

    def env(self, data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        value = data.get("env")
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self.fail("env", f"must be a table of NAME = \"value\", got {_type_name(value)}")
        pairs = []
        for key, val in value.items():
            if not isinstance(key, str):
                raise self.fail("env", f"{key!r} is not a valid variable name")
            check_env_name(key)
            if not isinstance(val, str):
                raise self.fail(f"env.{key}", f"must be a string, got {_type_name(val)} {val!r}",
                                hint=f'quote it: {key} = "{val}"')
            if "\x00" in val:
                raise self.fail(f"env.{key}", "contains a NUL byte")
            if not _is_utf8(val):
                raise self.fail(f"env.{key}", "is not valid UTF-8 text")
            if len(val.encode("utf-8", "surrogatepass")) > MAX_ENV_VALUE_BYTES:
                raise self.fail(f"env.{key}", "longer than 32 KiB")
            pairs.append((key, val))
        return tuple(sorted(pairs))


def check_env_name(key: str) -> None:
    """Raise SpecError unless ``key`` may be set in a job's environment (one rule for all callers)."""
    if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
        raise SpecError(f"env.{key!r}: {key!r} is not a valid variable name",
                        hint="use letters, digits and '_', not starting with a digit, at most 64 characters")
    upper = key.upper()
    if upper.startswith(RESERVED_ENV_PREFIXES):
        raise SpecError(f"env.{key}: names starting with {', '.join(RESERVED_ENV_PREFIXES)} (in any letter case) "
                        "are reserved", hint="gbroker and Slurm set these; pick another name")
    if upper in LOADER_ENV_NAMES or upper.startswith(LOADER_ENV_PREFIXES):
        raise SpecError(f"env.{key}: {key} changes how programs find binaries, libraries or start-up files, "
                        "so a job may not set it through gbroker",
                        hint=f"set it inside your job script (export {key}=...), or call programs by "
                        "their full path (e.g. a virtualenv's bin/python)")


def account_name(name: str) -> str:
    """A Slurm account name as Slurm compares it: account names ignore letter case (stored lower)."""
    return name.lower()


def _is_utf8(text: str) -> bool:
    """False for lone surrogates (from JSON escapes or undecodable file names): they cannot reach argv or a script."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean_path(path: str) -> str:
    """'/a//b/./c/' -> '/a/b/c'. Keeps '..' (with symlinks it is not the same as dropping a part)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def _base_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _read_script(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"script: cannot read {path} ({exc.strerror or exc})",
                        hint="check the path and that you may read the file") from exc
    if len(raw) > MAX_SCRIPT_BYTES:
        raise SpecError(f"script: {path} is larger than 1 MiB", hint="keep data out of the script")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"script: {path} is not valid UTF-8 (byte {exc.start})",
                        hint="save the script as UTF-8") from exc


def _default_name(command: tuple[str, ...] | None, script_path: str | None, kind: str) -> str:
    """A name a human recognises: 'train.py' for ['python', 'train.py'], the script's file name."""
    source = None
    if command:
        source = command[0]
        base = _base_name(source)
        if base.rstrip("0123456789.") in INTERPRETERS and len(command) > 1 and not command[1].startswith("-"):
            source = command[1]
    elif script_path:
        source = script_path
    base = _base_name(source) if source else ""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip("-")[:MAX_NAME_CHARS]
    return cleaned or kind
