"""``#SBATCH`` lines in a user's script: which ones gbroker reads, and what each one means.

gbroker runs a user's script inside its own batch script (see
:mod:`broker.slurm.script`), so sbatch never sees the user's ``#SBATCH``
lines; every option reaches Slurm on sbatch's command line, built from the
job's fields. A line is therefore either *translated* into a job field (and
then honoured) or *refused* with the reason and what to write instead:
nothing a user writes is dropped.

Which lines count is sbatch's own rule: ``#SBATCH`` at the start of a line,
from the line after ``#!`` up to the first command (a line that is neither
blank nor a comment). Two lines sbatch would silently skip are refused, so
the user learns they have no effect: an indented ``#SBATCH`` among the
header (sbatch reads it as a comment) and a ``#SBATCH`` after the first
command (sbatch stops reading there).

Translated (``--opt=v``, ``--opt v``, ``-c 4`` and ``-c4`` all work; a long
option may be shortened as long as it stays unambiguous, as sbatch allows):

=====================================  ===================================
``--gres=gpu[:TYPE][:N]``              ``gpus_per_node = N``, ``gpu = TYPE``
``--gpus-per-node=[TYPE:]N``           ``gpus_per_node = N``, ``gpu = TYPE``
``--nodes``, ``-N``                    ``nodes``
``--ntasks-per-node``                  ``tasks_per_node``
``--cpus-per-task``, ``-c``            ``cpus_per_task``
``--cpus-per-gpu``                     ``cpus_per_gpu``
``--mem``                              ``mem``
``--mem-per-gpu``                      ``mem_per_gpu``
``--time``, ``-t``                     ``time_limit``
``--job-name``, ``-J``                 ``name``
=====================================  ===================================

This module only reads the syntax: each translated option becomes a
:class:`Line` holding the job-file key and the value as a job file would
hold it; :mod:`broker.spec` validates the value with the very code that
validates the job file, and refuses a line that disagrees with the job file
or the flags. Standard library only (``gbroker submit`` imports it).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from broker.errors import SpecError

MAGIC = "#SBATCH"

# sbatch's options (Slurm 22.05 to 24.11): long name -> (short letter, argument: "req", "opt" or "none").
# Every one of them is known so that a shortened name resolves as sbatch resolves it.
OPTIONS: dict[str, tuple[str | None, str]] = {
    "account": ("A", "req"), "acctg-freq": (None, "req"), "array": ("a", "req"), "batch": (None, "req"),
    "bb": (None, "req"), "bbf": (None, "req"), "begin": ("b", "req"), "chdir": ("D", "req"),
    "cluster-constraint": (None, "req"), "clusters": ("M", "req"), "comment": (None, "req"),
    "constraint": ("C", "req"), "container": (None, "req"), "container-id": (None, "req"),
    "contiguous": (None, "none"), "core-spec": ("S", "req"), "cores-per-socket": (None, "req"),
    "cpu-freq": (None, "req"), "cpus-per-gpu": (None, "req"), "cpus-per-task": ("c", "req"),
    "deadline": (None, "req"), "delay-boot": (None, "req"), "dependency": ("d", "req"),
    "distribution": ("m", "req"), "error": ("e", "req"), "exclude": ("x", "req"), "exclusive": (None, "opt"),
    "export": (None, "req"), "export-file": (None, "req"), "extra": (None, "req"),
    "extra-node-info": ("B", "req"), "get-user-env": (None, "opt"), "gid": (None, "req"),
    "gpu-bind": (None, "req"), "gpu-freq": (None, "req"), "gpus": ("G", "req"), "gpus-per-node": (None, "req"),
    "gpus-per-socket": (None, "req"), "gpus-per-task": (None, "req"), "gres": (None, "req"),
    "gres-flags": (None, "req"), "help": ("h", "none"), "hint": (None, "req"), "hold": ("H", "none"),
    "ignore-pbs": (None, "none"), "immediate": ("I", "opt"), "input": ("i", "req"), "job-name": ("J", "req"),
    "kill-on-invalid-dep": (None, "req"), "licenses": ("L", "req"), "mail-type": (None, "req"),
    "mail-user": (None, "req"), "mcs-label": (None, "req"), "mem": (None, "req"), "mem-bind": (None, "req"),
    "mem-per-cpu": (None, "req"), "mem-per-gpu": (None, "req"), "mincpus": (None, "req"),
    "network": (None, "req"), "nice": (None, "opt"), "no-kill": ("k", "opt"), "no-requeue": (None, "none"),
    "nodefile": ("F", "req"), "nodelist": ("w", "req"), "nodes": ("N", "req"), "ntasks": ("n", "req"),
    "ntasks-per-core": (None, "req"), "ntasks-per-gpu": (None, "req"), "ntasks-per-node": (None, "req"),
    "ntasks-per-socket": (None, "req"), "oom-kill-step": (None, "opt"), "open-mode": (None, "req"),
    "output": ("o", "req"), "overcommit": ("O", "none"), "oversubscribe": ("s", "none"),
    "parsable": (None, "none"), "partition": ("p", "req"), "power": (None, "req"), "prefer": (None, "req"),
    "priority": (None, "req"), "profile": (None, "req"), "propagate": (None, "opt"), "qos": ("q", "req"),
    "quiet": ("Q", "none"), "reboot": (None, "none"), "requeue": (None, "none"), "reservation": (None, "req"),
    "resv-ports": (None, "opt"), "segment": (None, "req"), "signal": (None, "req"),
    "sockets-per-node": (None, "req"), "spread-job": (None, "none"), "switches": (None, "req"),
    "test-only": (None, "none"), "thread-spec": (None, "req"), "threads-per-core": (None, "req"),
    "time": ("t", "req"), "time-min": (None, "req"), "tmp": (None, "req"), "tres-bind": (None, "req"),
    "tres-per-task": (None, "req"), "uid": (None, "req"), "umask": (None, "req"), "usage": ("u", "none"),
    "use-min-nodes": (None, "none"), "verbose": ("v", "none"), "version": ("V", "none"), "wait": ("W", "none"),
    "wait-all-nodes": (None, "req"), "wckey": (None, "req"), "wrap": (None, "req"),
}
SHORT: dict[str, str] = {short: name for name, (short, _) in OPTIONS.items() if short}

TRANSLATED: dict[str, str] = {
    "gres": "gpus_per_node", "gpus-per-node": "gpus_per_node", "nodes": "nodes",
    "ntasks-per-node": "tasks_per_node", "cpus-per-task": "cpus_per_task", "cpus-per-gpu": "cpus_per_gpu",
    "mem": "mem", "mem-per-gpu": "mem_per_gpu", "time": "time_limit", "job-name": "name",
}
"""sbatch option -> the job field it sets."""

SUPPORTED_HELP = ("#SBATCH lines gbroker reads: --gres=gpu[:TYPE]:N, --gpus-per-node=[TYPE:]N, --nodes/-N, "
                  "--ntasks-per-node, --cpus-per-task/-c, --cpus-per-gpu, --mem, --mem-per-gpu, --time/-t, "
                  "--job-name/-J")

_LOG = ("gbroker creates the job's log itself, as you, in the job's workdir (gbroker-<name>-XXXXXX.out; "
        "`gbroker show <id>` names it); choose the directory with workdir = ... (the directory you submit "
        "from by default) and the name with name = ..., and remove the line")
_PLACES = "gbroker places the job; ask for what it needs with gpu = ... / gpu_mem_gb = ..., or partition = ... for a managed pool"
_NOT_A_JOB_OPTION = "it is not a setting of the job; remove the line"

INSTEAD: dict[str, str] = {
    "partition": _PLACES,
    "account": "gbroker charges the job to its group: use group = ... (--group) and remove the line",
    "qos": "gbroker sets the QOS itself; remove the line",
    "reservation": _PLACES,
    "uid": "a job always runs as the user who submits it; remove the line",
    "gid": "a job always runs with the groups of the user who submits it; remove the line",
    "comment": "gbroker keeps the job's key in Slurm's comment; use name = ... to label the job",
    "array": "arrays are gbroker's: write pieces = \"1-10\" in the job file or gbroker submit --array 1-10 (one Slurm array task per piece)",
    "dependency": "dependencies are not supported yet; submit the next job once this one has finished",
    "kill-on-invalid-dep": "dependencies are not supported yet; remove the line",
    "mail-type": "gbroker does not pass Slurm's mails on; follow the job with `gbroker show <id>`",
    "mail-user": "gbroker does not pass Slurm's mails on; follow the job with `gbroker show <id>`",
    "exclusive": ("gbroker does not ask for whole nodes; ask for what the job uses: gpus_per_node, "
                  "cpus_per_gpu or cpus_per_task, mem or mem_per_gpu"),
    "oversubscribe": "gbroker decides how jobs share nodes; remove the line",
    "constraint": "node features are gbroker's to set; ask for a GPU type with gpu = ... (--gpu)",
    "cluster-constraint": _PLACES,
    "prefer": "ask for a GPU type with gpu = ... (any of several: gpu = [\"a100\", \"h100\"])",
    "clusters": _PLACES,
    "nodelist": "gbroker places the job and does not run it on named nodes; remove the line",
    "nodefile": "gbroker places the job and does not run it on named nodes; remove the line",
    "exclude": "gbroker places the job and does not run it on named nodes; remove the line",
    "switches": _PLACES,
    "chdir": "use workdir = ... in the job file (the directory you submit from by default)",
    "output": _LOG,
    "error": "stdout and stderr go to one log: " + _LOG,
    "input": "a job reads no standard input; open the file in your program",
    "open-mode": "gbroker appends to the job's log itself; remove the line",
    "signal": ("use warning_signal = \"USR1\" and signal_lead_s = ... (or checkpoint.style = \"signal\"), "
               "and remove the line"),
    "requeue": "gbroker requeues jobs itself (retries: max_retries = ...); remove the line",
    "no-requeue": "gbroker requeues jobs itself; set max_retries = 0 for no retries, and remove the line",
    "export": "give the job's environment with env = { NAME = \"value\" } (--env NAME=VALUE)",
    "export-file": "give the job's environment with env = { NAME = \"value\" } (--env NAME=VALUE)",
    "get-user-env": "give the job's environment with env = { NAME = \"value\" } (--env NAME=VALUE)",
    "gpus": "ask per node: --gpus-per-node=N (or gpus_per_node = N) with --nodes",
    "gpus-per-task": "ask per node: gpus_per_node = N, with tasks_per_node = \"gpu\" for one task per GPU",
    "gpus-per-socket": "ask per node: gpus_per_node = N",
    "ntasks-per-gpu": "use tasks_per_node = \"gpu\" (one task per GPU) or --ntasks-per-node",
    "ntasks": "ask per node: --ntasks-per-node=N (or tasks_per_node = N) with --nodes",
    "mem-per-cpu": "ask per GPU or per node: --mem-per-gpu or --mem (mem_per_gpu = / mem =)",
    "mincpus": "use --cpus-per-task or --cpus-per-gpu (cpus_per_task = / cpus_per_gpu =)",
    "time-min": "use --time (time_limit = ...); gbroker keeps the job's limit",
    "deadline": "use deadline = ... in the job file (--deadline): gbroker plans for it",
    "begin": "a later start is not supported; submit the job when it should start",
    "hold": "gbroker holds and releases jobs itself; submit the job when it may start",
    "priority": "gbroker and Slurm order the jobs; remove the line",
    "nice": "gbroker and Slurm order the jobs; remove the line",
    "wckey": "gbroker charges the job to its group (group = ...); remove the line",
    "licenses": "licenses are not supported yet; remove the line",
    "parsable": _NOT_A_JOB_OPTION, "test-only": _NOT_A_JOB_OPTION, "wait": _NOT_A_JOB_OPTION,
    "wrap": _NOT_A_JOB_OPTION, "help": _NOT_A_JOB_OPTION, "usage": _NOT_A_JOB_OPTION,
    "version": _NOT_A_JOB_OPTION, "verbose": _NOT_A_JOB_OPTION, "quiet": _NOT_A_JOB_OPTION,
    "batch": _NOT_A_JOB_OPTION, "ignore-pbs": _NOT_A_JOB_OPTION,
}
"""What to write instead of each refused option gbroker has a word for."""

DEFAULT_INSTEAD = "gbroker does not pass this option to Slurm, so it would have no effect; remove the line"

_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only


@dataclass(frozen=True)
class Line:
    """One translated option: the job field it sets and the value as a job file would hold it."""

    key: str
    value: int | str
    lineno: int
    option: str
    """The option as written on the line (``--gres=gpu:a100:2``)."""

    @property
    def where(self) -> str:
        return f"script line {self.lineno} ('#SBATCH {self.option}')"


def read(text: str) -> tuple[list[Line], list[SpecError]]:
    """The fields the script's ``#SBATCH`` lines set, and one error per line or option refused."""
    lines: list[Line] = []
    errors: list[SpecError] = []
    first_command: int | None = None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if lineno == 1:
            continue  # the #! line
        stripped = line.lstrip()
        if first_command is not None:
            if line.startswith(MAGIC):
                errors.append(_error(
                    lineno, f"'{line.strip()}' comes after the first command (line {first_command}), where "
                    "sbatch stops reading #SBATCH lines, so it would have no effect",
                    f"move it above line {first_command}; a line your program writes out for another job "
                    "can be made with printf '%s\\n' '#SBATCH ...'"))
            continue
        if line.startswith(MAGIC):
            body, ok = _tokens(line[len(MAGIC):])
            if not ok:
                errors.append(_error(lineno, f"'{line.strip()}' has an unclosed quote",
                                     "close the quote, or write the value without quotes"))
                continue
            found, refused = _options(body, lineno)
            lines.extend(found)
            errors.extend(refused)
        elif stripped.startswith(MAGIC):
            errors.append(_error(lineno, f"'{stripped}' does not start at the beginning of the line, so sbatch "
                                 "reads it as a comment", "remove the spaces before #SBATCH, or the line"))
        elif _NEAR_MAGIC.match(stripped):
            errors.append(_error(lineno, f"'{stripped}' is not #SBATCH (in capitals), so sbatch reads it as a "
                                 "comment and its option would have no effect",
                                 "write it as #SBATCH --..., or as ##SBATCH to keep it switched off"))
        elif stripped and not stripped.startswith("#"):
            first_command = lineno
    return lines, errors


_NEAR_MAGIC = re.compile(r"#(?!SBATCH)[Ss][Bb][Aa][Tt][Cc][Hh][ \t]+-")
"""``#sbatch --mem=16G``, ``#Sbatch -N 2``: meant as a directive, read as a comment. (``# SBATCH`` and
``##SBATCH`` are the usual ways to switch a directive off, and ``# sbatch --array=... job.sh`` a usage
note: those stay comments.)"""


def _error(lineno: int, message: str, hint: str) -> SpecError:
    return SpecError(f"script: line {lineno}: {message}", hint=hint)


def _tokens(body: str) -> tuple[list[str], bool]:
    """The words of a directive as sbatch splits them: quotes group, '#' starts a comment."""
    try:
        return shlex.split(body, comments=True), True
    except ValueError:
        return [], False


def _long_name(written: str) -> tuple[str | None, list[str]]:
    """The option a (possibly shortened) long name means, or None with the names it could mean."""
    if written in OPTIONS:
        return written, [written]
    matches = [name for name in OPTIONS if name.startswith(written)]
    return (matches[0] if len(matches) == 1 else None), matches


def _options(tokens: list[str], lineno: int) -> tuple[list[Line], list[SpecError]]:
    found: list[Line] = []
    errors: list[SpecError] = []
    i = 0

    def refuse(name: str, written: str) -> None:
        errors.append(_error(lineno, f"--{name} ('#SBATCH {written}') is not supported: "
                             f"{INSTEAD.get(name, DEFAULT_INSTEAD)}", hint=SUPPORTED_HELP))

    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--") and len(tok) > 2:
            written, eq, inline = tok[2:].partition("=")
            name, candidates = _long_name(written)
            if name is None:
                if candidates:
                    errors.append(_error(lineno, f"'--{written}' could be any of "
                                         + ", ".join(f"--{c}" for c in candidates),
                                         "write the option's full name"))
                else:
                    errors.append(_error(lineno, f"'{tok}' is not an sbatch option", SUPPORTED_HELP))
                return found, errors
            kind = OPTIONS[name][1]
            value: str | None = inline if eq else None
            if value is None and kind == "req" and i < len(tokens):
                value = tokens[i]
                i += 1
            shown = f"{tok} {value}" if value is not None and not eq else tok
            if name not in TRANSLATED:
                refuse(name, shown)
                continue
            if value is None:
                errors.append(_error(lineno, f"'--{name}' needs a value", f"e.g. #SBATCH --{name}=..."))
                return found, errors
            _translate(name, value, shown, lineno, found, errors)
        elif tok.startswith("-") and len(tok) > 1:
            # Short options: "-c4", "-c 4", and letters without a value bundled ("-Hk").
            j = 1
            while j < len(tok):
                letter = tok[j]
                long_name = SHORT.get(letter)
                if long_name is None:
                    errors.append(_error(lineno, f"'-{letter}' (in '{tok}') is not an sbatch option",
                                         SUPPORTED_HELP))
                    return found, errors
                kind = OPTIONS[long_name][1]
                if kind == "none":
                    refuse(long_name, f"-{letter}")
                    j += 1
                    continue
                attached = tok[j + 1:]
                value = attached or None
                if value is None and kind == "req" and i < len(tokens):
                    value = tokens[i]
                    i += 1
                shown = f"-{letter}{attached}" if attached or value is None else f"-{letter} {value}"
                if long_name not in TRANSLATED:
                    refuse(long_name, shown)
                elif value is None:
                    errors.append(_error(lineno, f"'-{letter}' needs a value", f"e.g. #SBATCH -{letter} ..."))
                else:
                    _translate(long_name, value, shown, lineno, found, errors)
                break
        else:
            errors.append(_error(lineno, f"'{tok}' is not an sbatch option (options start with '-')",
                                 SUPPORTED_HELP))
            return found, errors
    return found, errors


def _translate(name: str, value: str, shown: str, lineno: int, found: list[Line], errors: list[SpecError]) -> None:
    def add(key: str, v: int | str) -> None:
        found.append(Line(key, v, lineno, shown))

    def bad(what: str, hint: str) -> None:
        errors.append(_error(lineno, f"'#SBATCH {shown}': {what}", hint))

    if name in ("gres", "gpus-per-node"):
        gpu = _gpus(name, value)
        if isinstance(gpu, str):
            bad(gpu, "e.g. #SBATCH --gres=gpu:2, --gres=gpu:a100:2 or --gpus-per-node=a100:2")
            return
        gpu_type, count = gpu
        add("gpus_per_node", count)
        if gpu_type is not None:
            add("gpu", gpu_type)
    elif name in ("nodes", "ntasks-per-node", "cpus-per-task", "cpus-per-gpu"):
        if name == "nodes" and re.fullmatch(r"[0-9]+-[0-9]+|[0-9]+:[0-9]+|[0-9]+(,[0-9]+)+", value):
            bad("gbroker runs a job on a fixed number of nodes, not a range",
                "write one number, e.g. #SBATCH --nodes=2")
            return
        if not _COUNT.fullmatch(value):
            bad(f"{value!r} is not a whole number", f"e.g. #SBATCH --{name}=2")
            return
        add(TRANSLATED[name], int(value))
    else:  # mem, mem-per-gpu, time, job-name: checked as the job file's fields are
        add(TRANSLATED[name], value)


def _gpus(name: str, value: str) -> tuple[str | None, int] | str:
    """(type or None, count) from ``gpu[:TYPE][:N]`` (--gres) or ``[TYPE:]N`` (--gpus-per-node); else why not."""
    if "," in value:
        return "one GPU request per line (gbroker runs a job on one kind of GPU; any of several: gpu = [...])"
    parts = value.split(":")
    if name == "gres":
        if parts[0] != "gpu":
            return (f"gbroker asks only for GPUs, not {parts[0]!r}" if parts[0] else "no resource named")
        parts = parts[1:]
        if not parts:
            return None, 1  # as Slurm: "gpu" is one GPU
        if len(parts) == 1 and not _COUNT.fullmatch(parts[0]):
            return parts[0], 1  # "gpu:a100" is one a100
    if len(parts) == 1:
        gpu_type, count = None, parts[0]
    elif len(parts) == 2:
        gpu_type, count = parts[0], parts[1]
    else:
        return f"{value!r} has too many ':' parts"
    if not _COUNT.fullmatch(count):
        return f"{count!r} is not a number of GPUs"
    if gpu_type == "":
        return "the GPU type is empty"
    return gpu_type, int(count)
