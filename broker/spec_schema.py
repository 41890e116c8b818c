"""The job request as a JSON Schema (draft 2020-12, the dialect of OpenAPI 3.1).

``POST /v1/jobs`` takes ``{"spec": JobSpec, "key": "..."}``; this module
describes ``JobSpec``: the fields ``broker.spec.spec_from_dict`` reads on the
daemon's side, with the JSON types, choices, bounds and patterns that parser
checks. Every number, choice and name rule comes from ``broker.spec`` (or the
module it takes it from), so a limit changed there changes here too;
``tests/unit/test_spec_schema.py`` checks that the schema and the parser agree.

The schema is what to *send*, so it is in places stricter than the parser:

- a field sent as ``null`` is read by the parser as left out for most fields;
  here a field is either given a value or left out;
- ``warning_signal`` is listed in the form the parser answers with (``USR1``),
  though it also takes ``usr1`` and ``SIGUSR1``.

Some checks cannot be written in a schema, and the field's description says
them instead: limits that come from the daemon's settings (GPUs per node,
nodes, the partitions there are), rules between fields (a warning lead shorter
than the time limit, CPUs per GPU times GPUs), the script's ``#SBATCH`` lines,
and sizes counted in UTF-8 bytes (``maxLength`` counts characters, so it is
given as the bound it implies, never a tighter one). JSON Schema also counts
``2.0`` as an integer; the parser wants ``2``.

Pure data and small helpers; no gbroker module above the base layer, and no
dependency beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.durations import UNIT_SECONDS
from broker.pieces import MAX_CHUNK, MAX_PIECES
from broker.spec import (
    CHECKPOINT_KEYS,
    CHECKPOINT_STYLES,
    DEFAULT_MAX_GPUS_PER_NODE,
    DEFAULT_MAX_NODES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_SIGNAL_LEAD_S,
    ENV_KEY_RE,
    GPU_TYPE_RE,
    KINDS,
    LOADER_ENV_NAMES,
    LOADER_ENV_PREFIXES,
    MAX_AFTER,
    MAX_COMMAND_BYTES,
    MAX_CPUS_PER_NODE,
    MAX_ENV_VALUE_BYTES,
    MAX_GPU_MEM_GB,
    MAX_GPU_TYPES,
    MAX_JOB_ID,
    MAX_MEM_PER_NODE_MB,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    MAX_RETRIES_LIMIT,
    MAX_SCRIPT_BYTES,
    MAX_SIGNAL_LEAD_S,
    MAX_SWEEP_LINE_BYTES,
    MAX_TIME_LIMIT_S,
    NAME_RE,
    RESERVED_ENV_PREFIXES,
    SCRIPT_KEYS,
    SIZE_RE,
    TASKS_PER_GPU,
    TOP_LEVEL_KEYS,
    WARNING_SIGNALS,
)
from broker.jobname import DEFAULT_KIND

DIALECT = "https://json-schema.org/draft/2020-12/schema"
NO_WARNING = "none"
"""``warning_signal = "none"``: no warning, even for a job that saves on a signal."""


# --------------------------------------------------------------------------- helpers


def anchored(pattern: str) -> str:
    """``pattern`` matching a whole string, in both ECMA-262 (what OpenAPI tools use) and Python's ``re``
    (what ``jsonschema`` uses), where ``$`` also matches before a final newline: the look-ahead closes that
    (in ECMA-262 it never fails at the end)."""
    return f"^(?:{pattern})$(?!\\n)"


def any_case(word: str) -> str:
    """``word`` in any letter case, as a pattern (a schema's patterns have no flags): ``PATH`` -> ``[Pp][Aa]...``."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def one_of_words(words: Iterable[str]) -> str:
    """A pattern of any of ``words`` in any letter case (longest first, so none hides a longer one)."""
    return "|".join(any_case(w) for w in sorted(words, key=lambda w: (-len(w), w)))


def integer(lo: int, hi: int | None, description: str, default: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "minimum": lo}
    if hi is not None:
        out["maximum"] = hi
    if default is not None:
        out["default"] = default
    out["description"] = description
    return out


NO_BREAKS = "[^\\u0000\\n\\r]*"
"""Text without a NUL or a line break (arguments, paths, sweep lines)."""
NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS,
        "pattern": anchored(f"(?!-){NAME_RE.pattern}")}
"""A job, group or partition name: letters, digits, '.', '_' and '-', not starting with '-'."""
PATH = {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS, "pattern": anchored(f"/{NO_BREAKS}")}
"""An absolute path (the job may run in another directory than the one it was submitted from)."""
SIZE = {"oneOf": [
    {"type": "integer", "minimum": 1, "maximum": MAX_MEM_PER_NODE_MB},
    {"type": "string", "pattern": anchored(f"\\s*(?=[0-9]*[1-9]){SIZE_RE.pattern}\\s*")},
]}
"""A memory size as sbatch reads it: a bare number is MB, or K, M, G, T (e.g. "32G"); never zero."""
DURATION_CHARS = "".join(u + u.upper() for u in UNIT_SECONDS)
SCRIPT_TEXT = {"type": "string", "maxLength": MAX_SCRIPT_BYTES, "pattern": "^#!",
               "not": {"pattern": "\\u0000|\\r\\n"}}
"""A script's text: starts with '#!', no NUL, Unix line breaks."""
GPU_TYPE = {"type": "string", "pattern": anchored(f"(?![-.])(?![0-9]+$){GPU_TYPE_RE.pattern}")}
"""A Slurm gres type (a100, h100-80gb): not only digits (gpu:2 means two GPUs), not starting with '-' or '.'."""
JOB_NUMBER = {"type": "integer", "minimum": 1, "maximum": MAX_JOB_ID}


# --------------------------------------------------------------------------- the fields


def _checkpoint() -> dict[str, Any]:
    style = {"type": "string", "enum": list(CHECKPOINT_STYLES)}
    section = {"type": "object", "additionalProperties": False,
               "properties": {"style": {**style, "default": "none",
                                        "description": "signal: the program saves when warned by a signal; pieces: "
                                                       "independent pieces (frames) that restart freely; none: a "
                                                       "restart starts from zero"},
                              "dir": {**PATH, "description": "where the program saves its state; required with "
                                                             "style signal, never used with style none"}}}
    assert set(section["properties"]) == set(CHECKPOINT_KEYS)
    return {"oneOf": [style, section],
            "description": "how the job survives a restart: a style, or a table {style, dir}; a dir needs a "
                           "style that uses it, and style signal needs a dir"}


def _script() -> dict[str, Any]:
    section = {"type": "object", "additionalProperties": False, "required": ["text"],
               "properties": {"text": SCRIPT_TEXT,
                              "path": {**PATH, "description": "where the client read it (remembered, never read)"}}}
    assert set(section["properties"]) == set(SCRIPT_KEYS)
    bare = {**SCRIPT_TEXT, "allOf": [{"pattern": "\\n"}],
            "description": "the script's text (a string with a line break; without one it would be a path, "
                           "which only the gbroker command reads)"}
    return {"oneOf": [bare, section],
            "description": f"the batch script's text (at most {MAX_SCRIPT_BYTES // 1024} KiB in UTF-8, starting "
                           "'#!'), instead of command; the client reads a script file and sends its text. Its "
                           "#SBATCH lines set the same fields and must agree with them"}


def _env() -> dict[str, Any]:
    reserved = f"^(?:{one_of_words(RESERVED_ENV_PREFIXES + LOADER_ENV_PREFIXES)})"
    loaders = f"^(?:{one_of_words(LOADER_ENV_NAMES)})$"
    return {"type": "object",
            "propertyNames": {"pattern": anchored(ENV_KEY_RE.pattern),
                              "not": {"anyOf": [{"pattern": reserved}, {"pattern": loaders}]}},
            "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_BYTES,
                                     "not": {"pattern": "\\u0000"}},
            "description": "variables set in the job's environment: NAME = \"value\"; names Slurm or gbroker "
                           f"read ({', '.join(RESERVED_ENV_PREFIXES)}, any case) and names that change how "
                           "programs load (PATH, LD_*, PYTHONPATH...) are refused; values at most "
                           f"{MAX_ENV_VALUE_BYTES // 1024} KiB in UTF-8"}


def _fields() -> dict[str, dict[str, Any]]:
    """Each top-level field the parser reads, in ``TOP_LEVEL_KEYS`` order."""
    fields: dict[str, dict[str, Any]] = {
        "name": {**NAME, "description": "the job's name (letters, digits, '.', '_', '-'; at most "
                                        f"{MAX_NAME_CHARS}); default: the program or script it runs"},
        "kind": {"type": "string", "enum": list(KINDS), "default": DEFAULT_KIND, "description": "what the job is"},
        "gpus_per_node": integer(1, None, "GPUs per node; at most the GPUs of the largest node the pools have "
                                          f"(a setting of the daemon, {DEFAULT_MAX_GPUS_PER_NODE} by default)", 1),
        "nodes": integer(1, None, "nodes, run as one gang; at most the cluster's limit per job (a setting of the "
                                  f"daemon, {DEFAULT_MAX_NODES} by default)", 1),
        "time_limit": {"oneOf": [
            {"type": "string", "pattern": anchored(f"\\s*[0-9][0-9{DURATION_CHARS}:-]*\\s*")},
            {"type": "integer", "minimum": 1, "maximum": MAX_TIME_LIMIT_S // 60},
        ], "description": "how long the job may run, as Slurm reads it: a bare number is minutes; \"90s\", "
                          "\"45m\", \"2h\", \"1h30m\", \"2d\", \"HH:MM:SS\", \"D-HH:MM:SS\"; more than zero, "
                          "at most a year"},
        "deadline": {"type": "string", "pattern": "^\\s*[+0-9]",
                     "description": "when the job must be done: an ISO-8601 date-time with its zone "
                                    "(\"2026-10-01T18:00:00+02:00\") or a time from now (\"+36h\"); in the "
                                    "future, at most two years away, no sooner than now + time_limit"},
        "interruptible": {"type": "boolean", "default": True,
                          "description": "whether the job may run on spot capacity, which can be reclaimed"},
        "checkpoint": _checkpoint(),
        "group": {**NAME, "description": "the Slurm account to charge (your lab group; letter case is ignored)"},
        "partition": {**NAME, "description": "a Slurm partition the daemon's pools list; leave it out and "
                                             "gbroker places the job"},
        "command": {"type": "array", "minItems": 1,
                    "items": {"type": "string", "pattern": anchored(NO_BREAKS)},
                    "prefixItems": [{"minLength": 1}],
                    "description": "the program and its arguments, run without a shell (no NUL or line break; "
                                   f"at most {MAX_COMMAND_BYTES // 1024} KiB in all); instead of script"},
        "script": _script(),
        "workdir": {**PATH, "description": "where the job runs and writes its log; default: where it was "
                                           "submitted from"},
        "env": _env(),
        "max_retries": integer(0, MAX_RETRIES_LIMIT, "restarts after a failure that was not the job's own "
                                                     "(a reclaimed node)", DEFAULT_MAX_RETRIES),
        "signal_lead_s": integer(0, MAX_SIGNAL_LEAD_S, "seconds before the time limit the warning signal comes "
                                                       f"(default {DEFAULT_SIGNAL_LEAD_S}, half a short time "
                                                       "limit); shorter than the time limit, and only with a "
                                                       "warning signal"),
        "warning_signal": {"type": "string", "enum": [*WARNING_SIGNALS, NO_WARNING],
                           "description": "the signal sent to every process of the job before its time limit, "
                                          "or none; default USR1 with checkpoint style signal, else none"},
        "tasks_per_node": {"oneOf": [{"type": "integer", "minimum": 1},
                                     {"type": "string", "enum": [TASKS_PER_GPU]}], "default": 1,
                           "description": "Slurm tasks per node: a number (at most a node's cores), or \"gpu\" "
                                          "for one per GPU (DDP launched by srun)"},
        "gpu": {"oneOf": [GPU_TYPE, {"type": "array", "items": GPU_TYPE, "minItems": 1, "maxItems": MAX_GPU_TYPES,
                                     "uniqueItems": True}],
                "description": "the GPU type, or a list of types any of which will do (Slurm gres types, each "
                               "named once, ignoring case); leave it out for any type"},
        "gpu_mem_gb": integer(1, MAX_GPU_MEM_GB, "at least this much memory per GPU, in GB"),
        "cpus_per_gpu": integer(1, MAX_CPUS_PER_NODE, "CPUs per GPU (times the GPUs per node at most "
                                                      f"{MAX_CPUS_PER_NODE}); not with cpus_per_task"),
        "cpus_per_task": integer(1, MAX_CPUS_PER_NODE, "CPUs per task (times the tasks per node at most "
                                                       f"{MAX_CPUS_PER_NODE}); not with cpus_per_gpu"),
        "mem_per_gpu": {**SIZE, "description": "memory per GPU, as sbatch reads it (a bare number is MB; K, M, "
                                               "G, T); times the GPUs per node at most 16 TiB; not with mem"},
        "mem": {**SIZE, "description": "memory per node, as sbatch reads it (a bare number is MB; K, M, G, T); "
                                       "at most 16 TiB; not with mem_per_gpu"},
        "pieces": {"type": "string", "pattern": "^\\s*[0-9][0-9,:%\\s-]*$",
                   "description": "an array: its indices in Slurm's --array grammar (\"1-400\", \"1-400:2\", "
                                  f"\"1,5,9-12\", \"1-400%16\" for 16 at a time), at most {MAX_PIECES} pieces; "
                                  "not with sweep"},
        "chunk": integer(1, MAX_CHUNK, "indices per array task (one task runs chunk consecutive pieces, evenly "
                                       "spaced); only with pieces", 1),
        "sweep": {"type": "array", "minItems": 1, "maxItems": MAX_PIECES,
                  "items": {"type": "string", "maxLength": MAX_SWEEP_LINE_BYTES, "pattern": anchored(f"(?=.*\\S){NO_BREAKS}")},
                  "description": "a sweep: one line of arguments per piece (split as a shell would, no shell "
                                 "runs it), appended to the command; the client reads a sweep file and sends "
                                 f"its lines (at most {MAX_SWEEP_LINE_BYTES} bytes each)"},
        "after": {"oneOf": [JOB_NUMBER, {"type": "array", "items": JOB_NUMBER, "minItems": 1,
                                         "maxItems": MAX_AFTER}],
                  "description": f"gbroker jobs (at most {MAX_AFTER}) that must complete before this one is "
                                 "submitted"},
    }
    assert tuple(fields) == TOP_LEVEL_KEYS, "a field of broker.spec.TOP_LEVEL_KEYS has no schema, or one too many"
    return fields


def job_spec_schema() -> dict[str, Any]:
    """The job request's JSON Schema: a new dict each call (callers may embed or change it)."""
    return {
        "$schema": DIALECT,
        "title": "JobSpec",
        "description": "A job request, as `gbroker submit --json` sends it; the daemon checks it again "
                       "(broker/spec.py) and its refusal names the field and what to write.",
        "type": "object",
        "properties": _fields(),
        "additionalProperties": False,
        "required": ["group", "time_limit"],
        "oneOf": [{"required": ["command"]}, {"required": ["script"]}],
        "allOf": [{"not": {"required": pair}} for pair in
                  (["cpus_per_gpu", "cpus_per_task"], ["mem_per_gpu", "mem"], ["pieces", "sweep"])],
    }
