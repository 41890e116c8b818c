"""Slurm job arrays: the ``--array`` option and accounting's rows of array tasks.

squeue lists every task of an array on its own row (``--array``), with
``ArrayJobID`` and ``ArrayTaskID`` (:func:`broker.slurm.parse.array_fields`).
Accounting names a task ``<array>_<index>`` (``JobID``) and gives it a Slurm
id of its own (``JobIDRaw``); ``sacct --duplicates`` has a row per run of a
requeued task. This module reads those rows; the rest of the parsing is
:mod:`broker.slurm.parse`'s.
"""

from __future__ import annotations

import logging
import re

from broker.errors import SpecError
from broker.slurm import parse
from broker.slurm.backend import ArrayRow

log = logging.getLogger(__name__)

ARRAY_SACCT_FIELDS: tuple[str, ...] = (*parse.SACCT_FIELDS, "JobID")
"""``parse.SACCT_FIELDS`` and the task's name in its array (``123_7``)."""

_TASK_ID = re.compile(r"(\d+)_(\d+)")
_ARRAY = re.compile(r"\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*(%\d+)?")


def array_option(indices: str) -> str:
    """``--array=<indices>``, refused unless it is Slurm's grammar (digits, ranges, steps, ``%N``)."""
    if not _ARRAY.fullmatch(indices):
        raise SpecError(f"not a Slurm array: {indices!r}", hint='e.g. "1-40", "1-40:2" or "1,5,9-12%4"')
    return f"--array={indices}"


def parse_task_id(text: str) -> tuple[int, int] | None:
    """``"123_7"`` -> (123, 7); anything else (a plain job, the ``123_[8-40]`` of tasks not yet started) -> None."""
    m = _TASK_ID.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_array_sacct(stdout: str, fs: str = parse.FS) -> list[ArrayRow]:
    """Output of ``sacct -n -P --delimiter=<fs> -o <ARRAY_SACCT_FIELDS>``: the runs of array tasks, numbered per task."""
    named: dict[int, tuple[int, int]] = {}
    plain = []
    for fields in parse.delimited_rows(stdout, len(ARRAY_SACCT_FIELDS), "sacct", fs):
        *head, jobid = fields
        task = parse_task_id(jobid)
        raw = head[0].strip()
        if task is None or not raw.isdigit():
            continue  # a plain job, or tasks that never started (nothing ran, nothing to charge)
        named[int(raw)] = task
        plain.append(head)
    out = []
    for r in parse.sacct_rows(plain):
        array_id, index = named[r.job_id]
        out.append(ArrayRow(array_id=array_id, task=index, row=r))
    return out
