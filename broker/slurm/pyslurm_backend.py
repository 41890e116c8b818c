"""The Backend on pyslurm, used only where pyslurm matches the running Slurm.

pyslurm links against one Slurm release (pyslurm 25.11 needs Slurm 25.11);
against another release it fails to import or misbehaves. So
:func:`pyslurm_usable` checks both that it imports and that its Slurm major
version equals the one ``sinfo --version`` reports, and the factory falls
back to the CLI backend otherwise.

Reads and simple job control go through pyslurm's API (no process per
call). Everything pyslurm does not cover cleanly here (submission as another
user, accounting history, node power actions) stays on the CLI backend this
class extends, so both backends keep the same contract.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from broker.errors import SlurmError, SlurmUnavailable
from broker.slurm import hostlist, statemap
from broker.slurm.backend import NodeInfo, SlurmJob
from broker.slurm.cli_backend import CliBackend
from broker.slurm.parse import array_fields, parse_gres_gpus
from broker.slurm.runner import Runner, is_unavailable

log = logging.getLogger(__name__)

_MAJOR = re.compile(r"(\d+)\.(\d+)")


def _major(text: str) -> str | None:
    m = _MAJOR.search(text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def sinfo_version(runner: Runner | None = None) -> str:
    """What ``sinfo --version`` prints (no controller needed), or '' when it cannot run; through
    the Slurm runner like every Slurm command (its bin directory, a clean environment)."""
    try:
        return (runner or Runner()).run(["sinfo", "--version"], timeout_s=10).stdout
    except (SlurmError, OSError):
        return ""


def _import_pyslurm() -> Any | None:
    try:
        return importlib.import_module("pyslurm")
    except (ImportError, OSError, RuntimeError) as exc:  # ABI mismatch, missing libslurm
        log.debug("pyslurm not usable: %s", exc)
        return None


def pyslurm_slurm_major(mod: Any) -> str | None:
    """The Slurm release pyslurm was built for: ``slurm_version()`` when it has
    one (a tuple or a string), else its own version, which follows Slurm's."""
    for name in ("slurm_version", "version"):
        fn = getattr(mod, name, None)
        if callable(fn):
            try:
                value = fn()
            except Exception as exc:  # noqa: BLE001 - a broken build is "not usable"
                log.debug("pyslurm.%s() failed: %s", name, exc)
                return None
            if isinstance(value, tuple):
                value = ".".join(str(v) for v in value)
            return _major(str(value))
    return _major(str(getattr(mod, "__version__", "")))


def pyslurm_check(runner: Runner | None = None) -> tuple[bool, str | None]:
    """(whether pyslurm imports and was built for the Slurm release that runs
    here, what ``sinfo --version`` printed). The version is None when pyslurm
    does not import (then it is not asked); ``make_backend`` hands it on so
    that one start runs ``sinfo --version`` once."""
    mod = _import_pyslurm()
    if mod is None:
        return False, None
    built_for = pyslurm_slurm_major(mod)
    text = sinfo_version(runner)
    running = _major(text)
    if built_for is None or running is None or built_for != running:
        log.info(
            "pyslurm built for Slurm %s but Slurm %s runs here; using the CLI", built_for, running
        )
        return False, text
    return True, text


def pyslurm_usable() -> bool:
    """True when pyslurm imports and was built for the Slurm release that runs here."""
    return pyslurm_check()[0]


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    return None


def _array_fields(job: Any) -> dict[str, Any]:
    """pyslurm's array attributes (``array_id``, ``array_task_id``, ``array_tasks_waiting``) as squeue's
    ArrayJobID/ArrayTaskID fields (``broker.slurm.parse.array_fields``); none for a plain job."""
    array_id = getattr(job, "array_id", None)
    task = getattr(job, "array_task_id", None)
    if array_id in (None, 0):
        return {}
    waiting = getattr(job, "array_tasks_waiting", None)
    return array_fields(str(array_id), str(task if task is not None else (waiting or "")))


class PyslurmBackend(CliBackend):
    """pyslurm for reads and job control; the CLI for the rest."""

    name = "pyslurm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        mod = _import_pyslurm()
        if mod is None:
            raise SlurmError("pyslurm cannot be imported", hint="use the CLI backend")
        self._ps = mod

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        self.calls.record([f"pyslurm.{what}"])
        try:
            return fn(*args)
        except Exception as exc:
            text = str(exc)
            cls = SlurmUnavailable if is_unavailable(text) else SlurmError
            raise cls(
                f"pyslurm {what} failed: {text}", argv=[f"pyslurm.{what}"], stderr=text
            ) from exc

    def jobs(
        self, job_ids: Iterable[int] | None = None, name_prefix: str | None = None
    ) -> list[SlurmJob]:
        loaded = self._call("Jobs.load", self._ps.Jobs.load)
        wanted = set(job_ids) if job_ids is not None else None
        out: list[SlurmJob] = []
        for job in loaded.values():
            if wanted is not None and job.id not in wanted and getattr(job, "array_id", None) not in wanted:
                continue
            name = job.name or ""
            if name_prefix is not None and not name.startswith(name_prefix):
                continue
            state_raw = str(job.state)
            limit = getattr(job, "time_limit", None)  # minutes, None when unlimited
            out.append(
                SlurmJob(
                    job_id=int(job.id),
                    name=name,
                    user=job.user_name or "",
                    account=job.account or "",
                    partition=job.partition or "",
                    state_raw=state_raw,
                    state=statemap.job_state(state_raw),
                    reason="" if job.state_reason in (None, "None") else str(job.state_reason),
                    nodes=hostlist.expand(getattr(job, "allocated_nodes", None) or ""),
                    restarts=int(getattr(job, "requeue_count", 0) or 0),
                    comment=job.comment or "",
                    submit_time=_utc(job.submit_time),
                    start_time=_utc(job.start_time),
                    time_limit_s=int(limit) * 60 if isinstance(limit, int) else None,
                    **_array_fields(job),
                )
            )
        return out

    def nodes(self) -> list[NodeInfo]:
        loaded = self._call("Nodes.load", self._ps.Nodes.load)
        out: list[NodeInfo] = []
        for node in loaded.values():
            complete = str(node.state)  # pyslurm prints the complete form: IDLE+CLOUD+...
            parsed = statemap.parse_node_state(complete)
            gres = node.configured_gres or {}
            out.append(
                NodeInfo(
                    name=node.name,
                    state_raw=complete,
                    state=parsed.state,
                    partitions=list(node.partitions or []),
                    features=list(node.available_features or []),
                    gpus=int(gres.get("gpu", 0))
                    if isinstance(gres, dict)
                    else parse_gres_gpus(str(gres)),
                    reason=node.reason or "",
                    flags=parsed.flags,
                )
            )
        return out

    def cancel(self, job_ids: Iterable[int]) -> None:
        for jid in job_ids:
            self._call("Job.cancel", self._ps.Job(int(jid)).cancel)

    def cancel_tasks(self, tasks: Iterable[tuple[int, int]]) -> None:
        # pyslurm names a job by its number only: a running task by its own, found in the queue.
        wanted = {(int(a), int(i)) for a, i in tasks}
        if wanted:
            self.cancel(j.job_id for j in self.jobs() if (j.array_job_id, j.array_task) in wanted)

    def hold(self, job_ids: Iterable[int]) -> None:
        for jid in job_ids:
            self._call("Job.hold", self._ps.Job(int(jid)).hold)

    def release(self, job_ids: Iterable[int]) -> None:
        for jid in job_ids:
            self._call("Job.release", self._ps.Job(int(jid)).release)

    def ping(self) -> bool:
        try:
            self._call("slurmctld.ping", lambda: self._ps.Jobs.load())
        except SlurmError:
            return False
        return True

