"""JobSpec: parse and validate what a researcher asks for (flags or a TOML job file).

Two sides call this module. The CLI calls ``load_job_file`` and ``parse_spec``
as the submitting user (it may read the job file and a script file), then sends
``spec_to_dict(spec)`` over the socket. The daemon calls ``spec_from_dict``,
which validates everything again but never reads a file: the daemon runs as
root and must not open paths a user names.

Only the standard library is imported here, so ``gbroker submit`` starts fast.

What a job asks of a node: GPUs (``gpu``: a type or a list of types, any of
them; ``gpu_mem_gb``: memory per GPU), CPUs (``cpus_per_gpu`` or
``cpus_per_task``) and memory (``mem_per_gpu`` or ``mem`` per node, in
Slurm's sizes: a bare number is MB, or K/M/G/T). The ``#SBATCH`` lines at the
top of a script set the same fields (:mod:`broker.sbatch_lines` reads them);
a line that disagrees with the job file or the flags, and an option gbroker
does not read, are refused.

Durations follow Slurm: a bare number is *minutes* ("90" = 1h30m), as in
``sbatch --time=90``. Unit forms ("90s", "45m", "2h", "1h30m", "2d") and the
Slurm clock forms ("MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS") work too
(``broker.durations`` reads them, for every part of gbroker).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from broker.durations import DURATION_HELP, format_duration, parse_duration
from broker.errors import BrokerError, SpecError
from broker.timeparse import from_iso
from broker.timeparse import why as _why
from broker.jobname import DEFAULT_KIND, MAX_NAME_CHARS, default_name

if TYPE_CHECKING:
    from broker.pieces import Pieces
    from broker.pools import GpuRequest

# broker.pieces, broker.sbatch_lines and shlex are imported where an array, a script or a
# sweep needs them: `gbroker submit -- cmd` starts without them.

T = TypeVar("T")

KINDS: tuple[str, ...] = ("render", "simulation", "finetune", "other")
CHECKPOINT_STYLES: tuple[str, ...] = ("signal", "pieces", "none")
"""signal: the program saves state when warned by a signal; pieces: independent
pieces (frame ranges) that restart freely; none: a restart starts from zero."""

DEFAULT_MAX_GPUS_PER_NODE = 8
DEFAULT_MAX_NODES = 16
DEFAULT_MAX_RETRIES = 2
DEFAULT_SIGNAL_LEAD_S = 120
WARNING_MARGIN_S = 60
"""sbatch(1) on --signal: "the signal may be sent up to 60 seconds earlier than specified"; a lead
that leaves less of the run than this is not asked of Slurm."""
MAX_RETRIES_LIMIT = 100
MAX_SIGNAL_LEAD_S = 3600
MAX_TIME_LIMIT_S = 365 * 24 * 3600
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_JOB_FILE_BYTES = 1024 * 1024
MAX_COMMAND_BYTES = 128 * 1024
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_PATH_CHARS = 4096
MAX_DEADLINE_AHEAD_S = 2 * 365 * 24 * 3600
MAX_GPU_TYPES = 16
MAX_GPU_MEM_GB = 1024
"""Memory per GPU a job may ask for (the largest GPUs have under 200 GB)."""
MAX_CPUS_PER_NODE = 1024
"""CPUs a job may ask for on one node (cpus_per_gpu x GPUs, or cpus_per_task x tasks)."""
MAX_MEM_PER_NODE_MB = 16 * 1024 * 1024
"""Memory a job may ask for on one node: 16 TiB (mem, or mem_per_gpu x GPUs)."""

_MINUTES_SECONDS = re.compile(r"\s*([0-9]+):([0-9]+)\s*")
"""A duration written M:SS, which Slurm (and ``parse_duration``) read as minutes and seconds."""
SIZE_RE = re.compile(r"([0-9]{1,12})(?:([KMGTkmgt])[Bb]?)?")
"""Digits are ASCII 0-9 only: ``\\d`` would also take other scripts' digits."""
SIZE_UNIT_MB = {"M": 1, "G": 1024, "T": 1024 * 1024}
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
GPU_TYPE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A Slurm gres type name (``a100``, ``h100-80gb``)."""
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
    "gpu",
    "gpu_mem_gb",
    "cpus_per_gpu",
    "cpus_per_task",
    "mem_per_gpu",
    "mem",
    "pieces",
    "chunk",
    "sweep",
    "after",
)
MAX_SWEEP_LINE_BYTES = 4096
MAX_AFTER = 64
"""Jobs one job may wait for (``after``)."""
MAX_JOB_ID = 2**63 - 1
"""The largest job number (SQLite's largest integer), for ``after`` here and every job id the daemon reads."""
KEY_INSTEAD = {"gpus": "gpus_per_node", "gpu_count": "gpus_per_node", "ngpus": "gpus_per_node",
               "num_gpus": "gpus_per_node"}
"""Unknown keys whose closest spelling is the wrong field (``gpu`` is the GPU *type*): the key meant instead."""
BOM = "\ufeff"
BOM_HINT = 'save it without one (as "UTF-8", not "UTF-8 with BOM")'
BOM_PROBLEM = "starts with a byte-order mark (a UTF-8 BOM, as some Windows editors write)"
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
    gpu_types: tuple[str, ...] = ()
    """Any of these GPU types (Slurm gres types); empty: any type."""
    gpu_mem_gb: int | None = None
    """At least this much memory per GPU."""
    cpus_per_gpu: int | None = None
    cpus_per_task: int | None = None
    mem_per_gpu_mb: int | None = None
    mem_mb: int | None = None
    """Memory per node; at most one of ``mem_mb`` and ``mem_per_gpu_mb`` is set."""
    pieces: str | None = None
    """An array: the indices in Slurm's ``--array`` grammar (``"1-400"``, ``"1-400:2%16"``); None: one job."""
    chunk: int = 1
    """Indices per array task (one task runs ``chunk`` consecutive pieces)."""
    sweep: tuple[tuple[str, ...], ...] = ()
    """A sweep: the arguments of each piece (piece i gets line i), appended to the command."""
    after: tuple[int, ...] = ()
    """gbroker jobs that must complete before this one is submitted (``afterok``)."""
    cautions: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """Values as written that Slurm reads otherwise than people often mean ("1:30" is 90 seconds):
    said back at submit, never stored, and no part of the job's identity."""

    @property
    def is_array(self) -> bool:
        return self.pieces is not None

    def array(self) -> Pieces:
        """The array's pieces (only for ``is_array``)."""
        from broker.pieces import parse_pieces

        assert self.pieces is not None
        return parse_pieces(self.pieces, self.chunk)

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

    @property
    def cpus_per_node(self) -> int | None:
        """CPUs the job asks for on each node, or None when it asks for none in particular."""
        if self.cpus_per_gpu is not None:
            return self.cpus_per_gpu * self.gpus_per_node
        if self.cpus_per_task is not None:
            return self.cpus_per_task * self.tasks
        return None

    @property
    def mem_per_node_mb(self) -> int | None:
        """Memory the job asks for on each node, or None when it asks for none in particular."""
        if self.mem_mb is not None:
            return self.mem_mb
        if self.mem_per_gpu_mb is not None:
            return self.mem_per_gpu_mb * self.gpus_per_node
        return None

    def gpu_request(self) -> GpuRequest:
        """What the job asks of the capacity it runs on, for the pool catalog's fit."""
        from broker.pools import GpuRequest

        return GpuRequest(
            gpus_per_node=self.gpus_per_node, nodes=self.nodes, gpu_types=self.gpu_types,
            gpu_mem_gb=self.gpu_mem_gb, cpus_per_node=self.cpus_per_node,
            mem_per_node_mb=self.mem_per_node_mb, interruptible=self.interruptible,
        )


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
    if text.startswith(BOM):
        raise SpecError(f"job file {path}: {BOM_PROBLEM}", hint=BOM_HINT)
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
    return _Parser(now, partitions, max_gpus_per_node, max_nodes, read_files=True, read_lines=True).parse(data)


def default_signal_lead(time_limit_s: int | None) -> int:
    """The warning lead a job gets when it names none: a short job is warned half-way."""
    return DEFAULT_SIGNAL_LEAD_S if time_limit_s is None else min(DEFAULT_SIGNAL_LEAD_S, time_limit_s // 2)


def default_warning_signal(style: str) -> str | None:
    """The warning a job gets when it names none: only a job that saves on a signal asks for one."""
    return "USR1" if style == "signal" else None


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
    }
    # The warning as written: what the parser would not have chosen by itself (so a job that left
    # them to their defaults is not read as one that asked for them).
    if spec.warning_signal != default_warning_signal(spec.checkpoint_style):
        out["warning_signal"] = spec.warning_signal or "none"
    if spec.warning_signal is not None and spec.signal_lead_s != default_signal_lead(spec.time_limit_s):
        out["signal_lead_s"] = spec.signal_lead_s
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
    if spec.gpu_types:
        out["gpu"] = list(spec.gpu_types)
    for key, value in (("gpu_mem_gb", spec.gpu_mem_gb), ("cpus_per_gpu", spec.cpus_per_gpu),
                       ("cpus_per_task", spec.cpus_per_task)):
        if value is not None:
            out[key] = value
    if spec.mem_per_gpu_mb is not None:
        out["mem_per_gpu"] = f"{spec.mem_per_gpu_mb}M"
    if spec.mem_mb is not None:
        out["mem"] = f"{spec.mem_mb}M"
    if spec.sweep:
        import shlex

        out["sweep"] = [shlex.join(args) for args in spec.sweep]
    elif spec.pieces is not None:
        out["pieces"] = spec.pieces
    if spec.chunk != 1:
        out["chunk"] = spec.chunk
    if spec.after:
        out["after"] = list(spec.after)
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

    With ``now`` the script's ``#SBATCH`` lines are read again (a hostile
    client could have left them out of the fields). A stored spec is not read
    for them: its fields are the request that was admitted and submitted
    (``spec_to_dict`` writes every field a line set), and a spec stored before
    gbroker read these lines ran with its fields alone.
    """
    return _Parser(now, partitions, max_gpus_per_node, max_nodes, read_files=False,
                   read_lines=now is not None).parse(data)


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


def _noted(err: SpecError, cautions: list[str]) -> SpecError:
    """``err`` with the request's cautions after its hint: a value Slurm reads otherwise than
    meant ("1:30" is 90 seconds) is often why the request was refused."""
    if cautions:
        notes = "\n  ".join(f"note: {c}" for c in cautions)
        BrokerError.__init__(err, err.message, hint=f"{err.hint}\n  {notes}" if err.hint else notes[len("note: "):])
    return err


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
        read_lines: bool,
    ) -> None:
        if now is not None and (now.tzinfo is None or now.utcoffset() is None):
            raise ValueError("now must be timezone-aware")
        self.now = now
        self.partitions = partitions
        self.max_gpus_per_node = max_gpus_per_node
        self.max_nodes = max_nodes
        self.read_files = read_files
        self.read_lines = read_lines
        self.sources: dict[str, str] = {}
        """Fields an #SBATCH line set, and which line (for messages)."""
        self.cautions: list[str] = []
        """What a new request wrote that Slurm reads otherwise than people often mean (``JobSpec.cautions``)."""

    # -- helpers ---------------------------------------------------------------

    @staticmethod
    def fail(fld: str, message: str, hint: str | None = None) -> SpecError:
        return SpecError(f"{fld}: {message}", hint=hint)

    def caution(self, fld: str, value: Any, what: str) -> None:
        """Note a value a new request wrote that Slurm reads otherwise than people often mean; it is
        taken as Slurm takes it (a request is never rewritten), and the note is said back at submit."""
        if self.now is None:  # a stored spec, read back: it was said when it was submitted
            return
        shown = f'"{value.strip()}"' if isinstance(value, str) else str(value)
        where = f", from {self.sources[fld]}," if fld in self.sources else ""
        self.cautions.append(f"{fld} {shown}{where} {what}")

    @staticmethod
    def check_keys(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
        errors = []
        for key in data:
            if not isinstance(key, str):
                errors.append(SpecError(f"{where}: keys must be strings, got {key!r}"))
                continue
            if key in known:
                continue
            close = KEY_INSTEAD.get(key) if where == "job" else None
            if close is not None:
                hint = f"did you mean {close}? (gpu is the GPU type, e.g. gpu = \"a100\")"
            else:
                close = _close_match(key, known)
                hint = f"did you mean {close}?" if close else f"known keys: {', '.join(known)}"
            label = f"{where}.{key}" if where != "job" else key
            errors.append(SpecError(f"{label}: unknown key", hint=hint))
        if errors:
            raise _combine(errors)

    def integer(self, data: Mapping[str, Any], fld: str, default: int, lo: int, hi: int, why_hi: str) -> int:
        value = data.get(fld, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(fld, f"must be a whole number, got {_type_name(value)} {value!r}",
                            hint=_whole_number_hint(fld, value, default))
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
        no_script: tuple[str | None, str | None] = (None, None)
        script, script_path = check(self.script, data, fallback=no_script)
        if script is not None and self.read_lines:
            data = self.with_script_lines(data, script, errors)
        kind = check(self.kind, data, fallback="other")
        group = check(self.group, data, fallback="")
        gpus_per_node = check(self.gpus_per_node, data, fallback=1)
        nodes = check(self.nodes, data, fallback=1)
        time_limit_s: int | None = check(self.time_limit, data, fallback=None)
        deadline = check(self.deadline, data, time_limit_s, fallback=None)
        interruptible = check(self.boolean, data, "interruptible", True, fallback=True)
        no_ckpt: tuple[str, str | None] = ("none", None)
        style, ckpt_dir = check(self.checkpoint, data, fallback=no_ckpt)
        partition = check(self.partition, data, fallback=None)
        command = check(self.command, data, fallback=None)
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
        if self.now is not None:  # a new request: what it wrote must take effect (a stored one is read as it was)
            check(self.warning_takes_effect, data, warning_signal, signal_lead_s, time_limit_s, fallback=None)
        one: int | str = 1
        tasks_per_node = check(self.tasks_per_node, data, fallback=one)
        no_types: tuple[str, ...] = ()
        gpu_types = check(self.gpu_types, data, fallback=no_types)
        gpu_mem_gb = check(self.gpu_mem_gb, data, fallback=None)
        cpus_per_gpu = check(self.cpus_per_gpu, data, fallback=None)
        cpus_per_task = check(self.cpus_per_task, data, fallback=None)
        mem_per_gpu_mb = check(self.size_mb, data, "mem_per_gpu", fallback=None)
        mem_mb = check(self.size_mb, data, "mem", fallback=None)
        no_sweep: tuple[tuple[str, ...], ...] = ()
        sweep = check(self.sweep, data, fallback=no_sweep)
        chunk = check(self.integer, data, "chunk", 1, 1, 100_000, "the largest array", fallback=1)
        pieces = check(self.pieces, data, sweep, chunk, fallback=None)
        no_after: tuple[int, ...] = ()
        after = check(self.after, data, fallback=no_after)
        name_raw = check(self.string, data, "name", fallback=None)
        name = (check(self.name, "name", name_raw, fallback="") if name_raw is not None
                else default_name(command, script_path, kind))
        spec = JobSpec(
            name=name, kind=kind, group=group, time_limit_s=time_limit_s or 1, gpus_per_node=gpus_per_node,
            nodes=nodes, deadline=deadline, interruptible=interruptible, checkpoint_style=style,
            checkpoint_dir=ckpt_dir, partition=partition, command=command, script=script,
            script_path=script_path, workdir=workdir, env=env, max_retries=max_retries,
            signal_lead_s=signal_lead_s, warning_signal=warning_signal, tasks_per_node=tasks_per_node,
            gpu_types=gpu_types, gpu_mem_gb=gpu_mem_gb, cpus_per_gpu=cpus_per_gpu, cpus_per_task=cpus_per_task,
            mem_per_gpu_mb=mem_per_gpu_mb, mem_mb=mem_mb, pieces=pieces, chunk=chunk, sweep=sweep, after=after,
            cautions=tuple(self.cautions),
        )
        check(self.check_resources, spec, fallback=None)
        if errors:
            raise _noted(_combine(errors), self.cautions)
        assert time_limit_s is not None
        return spec

    # -- arrays and chains -----------------------------------------------------

    def sweep(self, data: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
        """``sweep``: the lines of a sweep file (one piece's arguments a line), as the CLI read them.

        A path is read here on the CLI side (as the user); the daemon only takes the lines.
        """
        value = data.get("sweep")
        if value is None:
            return ()
        lines: list[tuple[str, Any]]  # (where, line): a file's lines are named by their number in the file
        if isinstance(value, str):
            if not self.read_files:
                raise self.fail("sweep", "arrived as a path; the client must send the file's lines",
                                hint="submit with the gbroker command, which reads the sweep file as you")
            path = self.path("sweep", value)
            lines = [(f"sweep {path} line {n}", line) for n, line in _read_sweep(path)]
            if not lines:
                raise self.fail("sweep", f"{path} has no lines of arguments (blank lines and # comments are skipped)",
                                hint="write one line of arguments per piece")
        elif isinstance(value, list) and value:
            lines = [(f"sweep line {i}", line) for i, line in enumerate(value, start=1)]
        else:
            raise self.fail("sweep", "must be a file path or a non-empty list of argument lines",
                            hint='sweep = "/abs/path/points.txt" (one line of arguments per piece)')
        import shlex

        from broker.pieces import MAX_PIECES

        if len(lines) > MAX_PIECES:
            raise self.fail("sweep", f"has {len(lines)} lines; an array has at most {MAX_PIECES} pieces")
        out = []
        for where, line in lines:
            if not isinstance(line, str):
                raise self.fail(where, f"must be a string, got {_type_name(line)}")
            if not line.strip() and self.now is not None:  # a new request (a stored one is read as it was)
                raise self.fail(where, f"{line!r} is empty: its piece would run with no arguments",
                                hint="remove the entry (each entry is one piece's arguments), "
                                     "or write the arguments that piece needs")
            if "\x00" in line or "\n" in line or "\r" in line or not _is_utf8(line):
                raise self.fail(where, "contains a NUL, a line break or text that is not UTF-8")
            if len(line.encode()) > MAX_SWEEP_LINE_BYTES:
                raise self.fail(where, f"longer than {MAX_SWEEP_LINE_BYTES} bytes", hint="put long input in a file")
            try:
                out.append(tuple(shlex.split(line)))
            except ValueError as exc:
                raise self.fail(where, f"{line!r} cannot be split into arguments ({exc})",
                                hint="close every quote; the line is split as a shell would, but no shell runs it") \
                    from None
        return tuple(out)

    def pieces(self, data: Mapping[str, Any], sweep: tuple[tuple[str, ...], ...], chunk: int) -> str | None:
        value = data.get("pieces")
        if sweep:
            if value is not None:
                raise self.fail("pieces", "give pieces or a sweep, not both (a sweep has a piece per line)",
                                hint="leave pieces out: the sweep's lines are pieces 1-N")
            if data.get("chunk", 1) != 1 and self.now is not None:  # a new request (a stored one is read as it was)
                raise self.fail("chunk", "a sweep runs one piece per line: its lines cannot be chunked "
                                "(a chunk's task would get its first line's arguments only)",
                                hint="leave chunk out, or put what one task should run on one sweep line")
            return f"1-{len(sweep)}" if len(sweep) > 1 else "1"
        if value is None:
            if data.get("chunk", 1) != 1:
                raise self.fail("chunk", "only an array has chunks", hint='add pieces = "1-400", or leave chunk out')
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            raise self.fail("pieces", f"pieces = {value} is ambiguous",
                            hint=f'write pieces = "1-{value}" for {value} pieces, or pieces = "{value}" for the '
                                 f"single index {value}")
        if not isinstance(value, str):
            raise self.fail("pieces", f"must be a string like \"1-400\", got {_type_name(value)} {value!r}")
        from broker.pieces import PiecesError, parse_pieces

        example = 'e.g. "1-400", "1-400:2" (every second), "1,5,9-12", "1-400%16" (16 at a time)'
        if not value.isascii() and self.now is not None:  # the text goes to Slurm as written: digits 0-9
            raise self.fail("pieces", f"{value!r} is not Slurm's array grammar ({_not_ascii(value)})", hint=example)
        try:
            parsed = parse_pieces(value, chunk)
        except PiecesError as exc:
            raise self.fail("pieces", str(exc), hint=example) from None
        if chunk > 1 and not parsed.evenly_spaced and self.now is not None:
            raise self.fail("chunk", f"chunk {chunk} needs evenly spaced pieces (one range, e.g. \"1-400\" or "
                            f"\"1-400:5\"); {value.strip()!r} has gaps of different sizes, so a chunk would run "
                            "indices nobody asked for", hint="leave chunk out, or submit one array per range")
        head, at_a_time, limit = value.strip().partition("%")  # "40%4": the one index 40, 4 at a time
        if head.strip().isdigit() and int(head) > 1:
            n = int(head)
            self.caution("pieces", value, f"is one piece, index {n} (Slurm's --array grammar); "
                         f'if you meant {n} pieces, write "1-{n}{at_a_time}{limit.strip()}"')
        return value.strip() if parsed.indices else None

    def after(self, data: Mapping[str, Any]) -> tuple[int, ...]:
        value = data.get("after")
        if value is None:
            return ()
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.fail("after", f"must be a list of job numbers, got {_type_name(value)} {value!r}",
                            hint="after = [12, 13]  or  --after 12,13")
        if len(value) > MAX_AFTER:
            raise self.fail("after", f"at most {MAX_AFTER} jobs, got {len(value)}")
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_JOB_ID:
                raise self.fail("after", f"{v!r} is not a job number", hint="gbroker status lists your jobs")
            out.append(v)
        return tuple(dict.fromkeys(out))

    # -- what a node must have -------------------------------------------------

    def source(self, key: str) -> str:
        return self.sources.get(key, "the job")

    def check_resources(self, spec: JobSpec) -> None:
        """The rules between the resource fields: one way to ask for CPUs and for memory, sizes a node can have."""
        errors: list[SpecError] = []
        for a, b, both in (("cpus_per_gpu", "cpus_per_task", spec.cpus_per_gpu is not None
                            and spec.cpus_per_task is not None),
                           ("mem_per_gpu", "mem", spec.mem_per_gpu_mb is not None and spec.mem_mb is not None)):
            if both:
                per = "CPUs per GPU or per task" if a == "cpus_per_gpu" else "memory per GPU or per node"
                errors.append(SpecError(
                    f"{a}/{b}: give one of them, not both ({a} from {self.source(a)}, {b} from {self.source(b)})",
                    hint=f"they ask for {per}; keep the one you mean"))
        cpus = spec.cpus_per_node
        if cpus is not None and cpus > MAX_CPUS_PER_NODE:
            how = (f"cpus_per_gpu {spec.cpus_per_gpu} x {spec.gpus_per_node} GPUs" if spec.cpus_per_gpu is not None
                   else f"cpus_per_task {spec.cpus_per_task} x {spec.tasks} tasks")
            fld = "cpus_per_gpu" if spec.cpus_per_gpu is not None else "cpus_per_task"
            errors.append(SpecError(f"{fld}: {how} is {cpus} CPUs per node, more than the {MAX_CPUS_PER_NODE} "
                                    "a node can have", hint=f"lower {fld}"))
        mem = spec.mem_per_node_mb
        if spec.mem_per_gpu_mb is not None and mem is not None and mem > MAX_MEM_PER_NODE_MB:
            errors.append(SpecError(f"mem_per_gpu: {spec.mem_per_gpu_mb}M x {spec.gpus_per_node} GPUs is more than "
                                    "16 TiB per node", hint="lower mem_per_gpu"))
        if errors:
            raise _combine(errors)

    def with_script_lines(self, data: Mapping[str, Any], script: str, errors: list[SpecError]) -> dict[str, Any]:
        """``data`` with the fields the script's #SBATCH lines set; a line that disagrees is refused.

        A field given in the job (file or flags) and by a line must have the same
        value; each line's value is checked by the same code as the job file's.
        """
        from broker import sbatch_lines

        found, refused = sbatch_lines.read(script)
        errors.extend(refused)
        said = len(self.cautions)  # the checks here only compare: each field's own check says its caution
        merged = dict(data)
        checkers = self.line_fields()
        seen: dict[str, tuple[sbatch_lines.Line, Any]] = {}
        for line in found:
            check_one = checkers[line.key]
            try:
                value = check_one({line.key: line.value})
            except SpecError as exc:
                errors.append(SpecError(f"script: line {line.lineno}: '#SBATCH {line.option}': {exc.message}",
                                        hint=exc.hint))
                continue
            if line.key in seen:
                first, first_value = seen[line.key]
                if not _same(first_value, value):
                    errors.append(SpecError(
                        f"{line.key}: {first.where} and {line.where} disagree",
                        hint="keep one of the two lines"))
                continue
            seen[line.key] = (line, value)
            if data.get(line.key) is not None:
                try:
                    given = check_one(data)
                except SpecError:
                    continue  # the field's own check reports it
                if not _same(given, value):
                    errors.append(SpecError(
                        f"{line.key}: the job gives {_shown(data[line.key])}, but {line.where} asks for "
                        f"{_shown(line.value)}",
                        hint=f"give {line.key} in one place (the job file, a flag or the #SBATCH line), "
                        "or make them agree"))
                continue
            merged[line.key] = line.value
            self.sources[line.key] = line.where
        del self.cautions[said:]
        return merged

    def line_fields(self) -> dict[str, Callable[[Mapping[str, Any]], Any]]:
        """The check of each field an #SBATCH line can set (the job file's own checks)."""
        return {
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu_types,
            "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "cpus_per_gpu": self.cpus_per_gpu,
            "mem": lambda d: self.size_mb(d, "mem"),
            "mem_per_gpu": lambda d: self.size_mb(d, "mem_per_gpu"),
            "time_limit": self.time_limit,
            "name": self.job_name,
        }

    def gpus_per_node(self, data: Mapping[str, Any]) -> int:
        return self.integer(data, "gpus_per_node", 1, 1, self.max_gpus_per_node, "the largest node has that many GPUs")

    def nodes(self, data: Mapping[str, Any]) -> int:
        return self.integer(data, "nodes", 1, 1, self.max_nodes, "the cluster's limit per job")

    def optional_count(self, data: Mapping[str, Any], fld: str, hi: int, why_hi: str) -> int | None:
        if data.get(fld) is None:
            return None
        return self.integer(data, fld, 1, 1, hi, why_hi)

    def gpu_mem_gb(self, data: Mapping[str, Any]) -> int | None:
        return self.optional_count(data, "gpu_mem_gb", MAX_GPU_MEM_GB, "more than any GPU has; it is in GB")

    def cpus_per_gpu(self, data: Mapping[str, Any]) -> int | None:
        return self.optional_count(data, "cpus_per_gpu", MAX_CPUS_PER_NODE, "more than a node has")

    def cpus_per_task(self, data: Mapping[str, Any]) -> int | None:
        return self.optional_count(data, "cpus_per_task", MAX_CPUS_PER_NODE, "more than a node has")

    def job_name(self, data: Mapping[str, Any]) -> str | None:
        raw = self.string(data, "name")
        return None if raw is None else self.name("name", raw)

    def gpu_types(self, data: Mapping[str, Any]) -> tuple[str, ...]:
        value = data.get("gpu")
        if value is None:
            return ()
        example = 'gpu = "a100", or gpu = ["a100", "h100"] for any of them; leave gpu out for any type'
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            raise self.fail("gpu", f"must be a GPU type or a list of them, got {_type_name(value)} {value!r}",
                            hint=example)
        if len(items) > MAX_GPU_TYPES:
            raise self.fail("gpu", f"lists {len(items)} types, more than {MAX_GPU_TYPES}", hint=example)
        out: list[str] = []
        for i, item in enumerate(items):
            fld = "gpu" if isinstance(value, str) else f"gpu[{i}]"
            if not isinstance(item, str):
                raise self.fail(fld, f"must be a GPU type name, got {_type_name(item)} {item!r}", hint=example)
            if not GPU_TYPE_RE.fullmatch(item) or item[0] in "-." or _is_number(item):
                if not item:
                    why = "empty"
                elif len(item) > 64:
                    why = "longer than 64 characters"
                elif _is_number(item):
                    why = "only digits (gpu:2 means two GPUs)"
                elif item[0] in "-.":
                    why = f"starts with {item[0]!r}"
                else:
                    why = "contains " + ", ".join(repr(c) for c in sorted({c for c in item
                                                                           if not GPU_TYPE_RE.fullmatch(c)}))
                raise self.fail(fld, f"{item!r} is not a GPU type name ({why})",
                                hint="a Slurm gres type: letters, digits, '_', '.' and '-', e.g. a100 or h100")
            if any(t.lower() == item.lower() for t in out):
                raise self.fail("gpu", f"lists {item!r} twice", hint="name each type once")
            out.append(item)
        return tuple(out)

    def size_mb(self, data: Mapping[str, Any], fld: str) -> int | None:
        """A memory size in MB, as sbatch reads it: a bare number is MB; K, M, G, T suffixes."""
        value = data.get(fld)
        if value is None:
            return None
        example = f'e.g. {fld} = "32G" or "512M" (a bare number is MB, as in sbatch)'
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self.fail(fld, f"must be a size, got {_type_name(value)} {value!r}", hint=example)
        if isinstance(value, int):
            mb = value
        else:
            m = SIZE_RE.fullmatch(value.strip())
            if m is None:
                decimal = re.fullmatch(r"\s*[0-9]*\.[0-9]+\s*[A-Za-z]*\s*", value)
                hint = "sizes are whole numbers; write 1.5G as 1536M" if decimal else example
                raise self.fail(fld, f"{value!r} is not a size", hint=hint)
            number, unit = int(m.group(1)), (m.group(2) or "M").upper()
            mb = -(-number // 1024) if unit == "K" else number * SIZE_UNIT_MB[unit]
        if mb <= 0:
            raise self.fail(fld, f"must be more than zero, got {value!r}",
                            hint=f"{example}; sbatch reads 0 as all of a node's memory, so gbroker needs a size")
        if mb > MAX_MEM_PER_NODE_MB:
            raise self.fail(fld, f"{value!r} is more than 16 TiB", hint=example)
        if mb < 1024 and (isinstance(value, int) or value.strip().isdigit()):
            per = "per GPU" if fld == "mem_per_gpu" else "per node"
            self.caution(fld, value, f"is {mb} MB {per} (a bare number is MB, as sbatch reads it); "
                         f'if you meant gigabytes, write "{mb}G"')
        return mb

    def group(self, data: Mapping[str, Any]) -> str:
        raw = self.string(data, "group")
        if raw is None:
            raise self.fail("group", "missing", hint='name the Slurm account to charge: group = "mylab"')
        return account_name(self.name("group", raw))

    def boolean(self, data: Mapping[str, Any], fld: str, default: bool) -> bool:
        value = data.get(fld, default)
        if not isinstance(value, bool):
            said = str(value).strip().lower()
            if said in ("true", "yes", "on", "1"):
                hint = f"write {fld} = true"
            elif said in ("false", "no", "off", "0"):
                hint = f"write {fld} = false"
            else:
                hint = f"write {fld} = true or {fld} = false, without quotes"
            raise self.fail(fld, f"must be true or false, got {value!r}", hint=hint)
        return value

    def signal_lead(self, data: Mapping[str, Any], time_limit_s: int | None) -> int:
        lead = self.integer(data, "signal_lead_s", default_signal_lead(time_limit_s), 0, MAX_SIGNAL_LEAD_S,
                            "one hour")
        if time_limit_s is not None and lead >= time_limit_s:
            raise self.fail("signal_lead_s", f"{lead}s is not shorter than the time limit ({time_limit_s}s)",
                            hint="the warning signal must come before the job ends; lower signal_lead_s")
        return lead

    def warning_takes_effect(self, data: Mapping[str, Any], warning: str | None, lead: int,
                             time_limit_s: int | None) -> None:
        """A lead written with no warning, or a warning asked for that Slurm cannot give safely, is refused."""
        if warning is None:
            if data.get("signal_lead_s") is not None:
                raise self.fail("signal_lead_s", "there is no warning signal for it to lead",
                                hint='set warning_signal (e.g. "USR1") or checkpoint.style = "signal", '
                                     "or leave signal_lead_s out")
            return
        lead_written = data.get("signal_lead_s") is not None
        asked = lead_written or data.get("warning_signal") is not None
        if asked and time_limit_s is not None and time_limit_s - lead < WARNING_MARGIN_S:
            if time_limit_s <= WARNING_MARGIN_S:
                hint = "a job of a minute or less cannot be warned: raise time_limit, or leave the warning out"
            elif lead_written:
                hint = (f"lower signal_lead_s to at most {time_limit_s - WARNING_MARGIN_S}, or raise time_limit to "
                        f"at least {lead + WARNING_MARGIN_S}s")
            else:  # the default lead: half of a short time limit, at most DEFAULT_SIGNAL_LEAD_S
                hint = (f"set signal_lead_s to at most {time_limit_s - WARNING_MARGIN_S}, or raise time_limit to at "
                        f"least {2 * WARNING_MARGIN_S - 1}s")
            raise self.fail("signal_lead_s" if lead_written else "warning_signal",
                            f"the warning would come {time_limit_s - lead}s after the start (time limit "
                            f"{time_limit_s}s, lead {lead}s); Slurm may send it up to {WARNING_MARGIN_S}s early, "
                            "before the job can catch it", hint=hint)

    def warning_signal(self, data: Mapping[str, Any], style: str) -> str | None:
        value = data.get("warning_signal")
        if value is None:
            return default_warning_signal(style)
        if not isinstance(value, str):
            raise self.fail("warning_signal", f"must be a signal name, got {_type_name(value)} {value!r}",
                            hint=f"one of {', '.join(WARNING_SIGNALS)}, e.g. warning_signal = \"USR1\"")
        name = value.strip().upper()
        if name == "NONE":
            return None
        name = name.removeprefix("SIG")
        if not name:
            raise self.fail("warning_signal", f"{value!r} names no signal",
                            hint=f"write a signal name such as \"USR1\" (one of {', '.join(WARNING_SIGNALS)}), "
                                 "or \"none\" for no warning")
        if name not in WARNING_SIGNALS:
            raise self.fail("warning_signal", f"{value!r} is not a signal a job can be warned with",
                            hint=f"one of {', '.join(WARNING_SIGNALS)}, or \"none\"")
        return name

    def tasks_per_node(self, data: Mapping[str, Any]) -> int | str:
        value = data.get("tasks_per_node", 1)
        if isinstance(value, str) and value.strip().lower() == TASKS_PER_GPU:
            return TASKS_PER_GPU
        quoted_number = isinstance(value, str) and _is_number(value.strip())  # the integer check's hint: no quotes
        if not quoted_number and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.fail("tasks_per_node", f"must be a whole number or \"gpu\", got {value!r}",
                            hint='tasks_per_node = 1 (one program per node) or "gpu" (one per GPU, for srun)')
        return self.integer(data, "tasks_per_node", 1, 1, 256, "a node's cores")

    def kind(self, data: Mapping[str, Any]) -> str:
        kind = data.get("kind", DEFAULT_KIND)
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
        if isinstance(value, str) and not value.isascii():
            raise self.fail("time_limit", f"{value!r} is not a duration ({_not_ascii(value)})", hint=DURATION_HELP)
        try:
            seconds = value * 60 if isinstance(value, int) else parse_duration(value)
        except ValueError as exc:
            raise self.fail("time_limit", f"{value!r} is not a duration{_why(exc)}", hint=DURATION_HELP) from None
        if seconds <= 0:
            raise self.fail("time_limit", f"must be longer than zero, got {value!r}", hint=DURATION_HELP)
        if seconds > MAX_TIME_LIMIT_S:
            raise self.fail("time_limit", f"{value!r} is longer than a year", hint="split the work into shorter jobs")
        clock = _MINUTES_SECONDS.fullmatch(value) if isinstance(value, str) else None
        if clock is not None and int(clock.group(1)) < 24:
            meant = format_duration(int(clock.group(1)) * 3600 + int(clock.group(2)) * 60)
            self.caution("time_limit", value, f"is {format_duration(seconds)} (minutes:seconds, as sbatch reads it); "
                         f'if you meant {meant}, write "{clock.group(1)}:{int(clock.group(2)):02d}:00" or "{meant}"')
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
                if not text.isascii():
                    raise self.fail("deadline", f"{value!r} is not a relative time ({_not_ascii(text)})",
                                    hint='e.g. "+36h" or "+2d"')
                if self.now is None:
                    raise self.fail("deadline", f"relative deadline {value!r} has no reference time",
                                    hint="store deadlines as ISO-8601 date-times")
                try:
                    offset = parse_duration(text[1:])
                except ValueError as exc:
                    raise self.fail("deadline", f"{value!r} is not a relative time{_why(exc)}",
                                    hint='e.g. "+36h" or "+2d"') from None
                if offset > MAX_DEADLINE_AHEAD_S:
                    raise self.fail("deadline", f"{value!r} is more than two years away",
                                    hint="leave the deadline out instead")
                when = self.now + timedelta(seconds=offset)
            else:
                try:
                    when = from_iso(text)
                except ValueError as exc:
                    raise self.fail("deadline", f"{value!r} is not an ISO-8601 date-time{_why(exc)}",
                                    hint='e.g. "2026-10-01T18:00:00+02:00" or "+36h"') from None
        elif isinstance(value, date):  # a TOML date alone
            raise self.fail("deadline", f"{value.isoformat()} is a day, not a moment",
                            hint=f'give a time and its zone, e.g. deadline = "{value.isoformat()}T18:00:00+02:00"')
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
        if ckpt_dir is not None and self.now is not None:  # a new request (a stored one is read as it was)
            if "style" not in value:
                raise self.fail("checkpoint.style", "a checkpoint dir needs a style",
                                hint='add style = "signal" (the program saves when it gets SIGUSR1), "pieces" '
                                     '(independent pieces such as frames) or "none"; on the command line '
                                     "--checkpoint-dir alone means signal")
            if style == "none":
                raise self.fail("checkpoint.dir", "is never used with style 'none'",
                                hint='drop dir, or choose style "signal" or "pieces"')
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
            import shlex

            try:
                suggestion = json.dumps(shlex.split(value))
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
        if (" " in value[0] or "\t" in value[0]) and "/" not in value[0] and self.now is not None:
            # A program named "python t.py" is almost surely two arguments; a path with a space is written whole.
            raise self.fail("command[0]", f"{value[0]!r} is one argument with a space, run as a program of that name",
                            hint="split it: command = " + json.dumps([*value[0].split(), *value[1:]])
                            + " (or, on the command line, -- " + " ".join(value[0].split()) + " ...; a program "
                            "whose path has a space: give its path, e.g. ./my tool)")
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
            if text is not None and path is not None and self.read_files:  # as written by a user, not the wire
                raise self.fail("script", "give script.text or script.path, not both",
                                hint="the text would run and the file would never be read")
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
        if text.startswith(BOM):
            raise self.fail("script", BOM_PROBLEM, hint=BOM_HINT)
        if not text.startswith("#!"):
            raise self.fail("script", "does not start with '#!' (sbatch needs an interpreter line)",
                            hint="make the first line e.g. #!/bin/bash")

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


def _same(a: Any, b: Any) -> bool:
    """Two checked values of one field mean the same (GPU types: the same set)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return set(a) == set(b)
    return bool(a == b)


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " or ".join(str(v) for v in value)
    return str(value)


def account_name(name: str) -> str:
    """A Slurm account name as Slurm compares it: account names ignore letter case (stored lower)."""
    return name.lower()


def _not_ascii(text: str) -> str:
    """Why ``text`` is refused: its first character outside ASCII, named, e.g. an en dash pasted
    from a web page or another script's digit."""
    import unicodedata

    c = next(ch for ch in text if not ch.isascii())
    fix = "write digits as 0-9" if unicodedata.numeric(c, None) is not None else "write it in plain ASCII"
    return f"{c!r} at {text.index(c) + 1} is U+{ord(c):04X} {unicodedata.name(c, 'a character outside ASCII')}; {fix}"


def _is_number(text: str) -> bool:
    """Only ASCII digits 0-9 (``str.isdigit`` also takes "²" and other scripts' digits)."""
    return text.isascii() and text.isdigit()


def _whole_number_hint(fld: str, value: Any, default: int) -> str:
    """What to write for a whole-number field that got ``value``: the number it holds, when it holds one."""
    text = str(value).strip()
    if fld == "gpu_mem_gb":
        m = re.fullmatch(r"([0-9]+)(?:\.0*)?\s*(?:[Gg][Bb]?)?", text)
        number = f"{int(m.group(1))}" if m else "80"
        return f"gpu_mem_gb is a whole number of GB, no quotes or unit: write gpu_mem_gb = {number}"
    if isinstance(value, float) and value.is_integer():
        return f"write {fld} = {int(value)}"
    if isinstance(value, str) and _is_number(text):
        return f"write {fld} = {int(text)}"
    return f"write a whole number without quotes, e.g. {fld} = {default}"


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


def _read_sweep(path: str) -> list[tuple[int, str]]:
    """The lines of a sweep file with their line numbers (CLI side, as the user): blank lines and ``#`` comments
    left out."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JOB_FILE_BYTES * 8 + 1)
    except OSError as exc:
        raise SpecError(f"sweep: cannot read {path} ({exc.strerror or exc})",
                        hint="check the path and that you may read the file") from exc
    if len(raw) > MAX_JOB_FILE_BYTES * 8:
        raise SpecError(f"sweep: {path} is larger than 8 MiB", hint="a sweep file holds one line of arguments a piece")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"sweep: {path} is not valid UTF-8 (byte {exc.start})", hint="save it as UTF-8") from exc
    if text.startswith(BOM):
        raise SpecError(f"sweep: {path} {BOM_PROBLEM}", hint=BOM_HINT)
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), start=1)]
    return [(n, ln) for n, ln in lines if ln and not ln.startswith("#")]


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
