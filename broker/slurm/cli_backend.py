"""The Backend on Slurm's own command-line tools, through the one runner.

Only machine-readable output is read (``-O``/``-P`` formats with control
character separators, see :mod:`broker.slurm.parse`), and only options both
Slurm 22.05 and 24.11 have. Query commands run with ``TZ=UTC`` and
``SLURM_TIME_FORMAT=standard`` so every time Slurm prints is ISO UTC.
SLURM_CONF comes from the environment, like every other Slurm client.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from broker.config import SLURM_SUBMIT_WAYS
from broker.errors import BrokerError, ConfigError, SlurmError, SpecError
from broker.slurm import arrays, parse
from broker.slurm.arrays import array_option
from broker.slurm.backend import (
    UPDATE_FIELDS, ArrayRow, Backend, NodeInfo, SacctRow, SlurmJob, StartedSubmit, SubmitRequest, time_limit_minutes,
)
from broker.slurm.hostlist import compress
from broker.slurm.partitions import PartitionInfo
from broker.slurm.runner import CompletedRun, RunFn, Runner, RunningCommand, clean_env

if TYPE_CHECKING:
    from broker.slurm.native import Native

log = logging.getLogger(__name__)


_GRES_TYPE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""A GPU type as it may appear in ``--gres=gpu:TYPE:N`` (the spec checks users' names the same way)."""

# Errors that only say "that job is already gone": cancelling it again is a no-op.
_ALREADY_DONE = (
    "already completing or completed",
    "job/step already completing",
    "invalid job id specified",
    "job has already finished",
)


def _ids(job_ids: Iterable[int]) -> list[str]:
    out = []
    for jid in job_ids:
        if isinstance(jid, bool) or not isinstance(jid, int) or jid <= 0:
            raise ValueError(f"not a Slurm job id: {jid!r}")
        out.append(str(jid))
    return out


def _fmt_time(t: datetime) -> str:
    """A time sacct reads; we run it with TZ=UTC, so give it UTC wall time."""
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return t.strftime("%Y-%m-%dT%H:%M:%S")


class CliBackend(Backend):
    """Slurm through squeue/sacct/sinfo/sbatch/scontrol/scancel."""

    name = "cli"

    def __init__(
        self,
        runner: RunFn | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        query_timeout_s: float = 30.0,
        submit_timeout_s: float = 60.0,
        submit_with: str = "sbatch",
        sinfo_version: str | None = None,
    ) -> None:
        self.runner: RunFn = runner if runner is not None else Runner()
        self._sinfo_version = sinfo_version
        """What ``sinfo --version`` printed, when the caller already asked."""
        self._environ = environ
        self.query_timeout_s = query_timeout_s
        self.submit_timeout_s = submit_timeout_s
        self.native = self._load_native(submit_with)
        """libslurm submission (:mod:`broker.slurm.native`), or None: sbatch as the user."""

    def _running_version(self) -> str:
        """What ``sinfo --version`` says (the release of the cluster's commands), or ''."""
        if self._sinfo_version is not None:
            return self._sinfo_version
        try:
            return self.runner.run(["sinfo", "--version"], timeout_s=self.query_timeout_s, env=self.query_env()).stdout
        except BrokerError:
            return ""

    def _load_native(self, submit_with: str) -> Native | None:
        if submit_with not in SLURM_SUBMIT_WAYS:
            raise ConfigError(f"unknown way to submit {submit_with!r}",
                              hint=f"choose one of: {', '.join(SLURM_SUBMIT_WAYS)}")
        if submit_with == "sbatch":
            return None
        from broker.slurm import native  # ctypes and the compiled module: only when it may be used

        loaded = native.load(self._slurm_conf().get("SLURM_CONF"), self._running_version())
        if loaded is None and submit_with == "libslurm":
            raise ConfigError(
                "submission through libslurm is not available here",
                hint="build it for this Slurm with: python -m broker.slurm.native_build "
                     "(needs libslurm-dev), or set slurm_submit = \"auto\"",
            )
        return loaded

    @property
    def calls(self):  # type: ignore[no-untyped-def]
        """The runner's call counter (how many Slurm commands ran)."""
        return self.runner.counter

    # -- environments -----------------------------------------------------

    def _base_environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def _slurm_conf(self) -> dict[str, str]:
        conf = self._base_environ().get("SLURM_CONF")
        return {"SLURM_CONF": conf} if conf else {}

    def query_env(self) -> dict[str, str]:
        """Queries and control commands: the clean base, UTC times in ISO form."""
        return clean_env({**self._slurm_conf(), "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"})

    def submit_env(self, req: SubmitRequest) -> dict[str, str]:
        """sbatch's environment, which the job inherits: the clean base only.

        Never the daemon's own variables (database passwords, tokens) and
        never the job's ``env``: sbatch reads its environment (SBATCH_*,
        SLURM_*, PATH to find itself and its plugins), so what the user asks
        for reaches the job through its batch script instead.
        """
        return clean_env(self._slurm_conf())

    def _query(self, argv: list[str], **env: str) -> str:
        return self.runner.run(argv, timeout_s=self.query_timeout_s, env={**self.query_env(), **env}).stdout

    def _control(self, argv: list[str]) -> None:
        self.runner.run(argv, timeout_s=self.query_timeout_s, env=self.query_env())

    # -- submit -----------------------------------------------------------

    def sbatch_argv(self, req: SubmitRequest) -> list[str]:
        """The sbatch command line for ``req`` (public so tests can read it)."""
        for label, value in (("partition", req.partition), ("job name", req.job_name),
                             ("comment", req.comment), ("workdir", req.workdir)):  # fmt: skip
            if "\n" in value or "\0" in value:
                raise SpecError(f"{label} must be one line of text")
        if req.nodes < 1:
            raise SpecError(f"a job needs at least one node, got {req.nodes}")
        if req.gpus_per_node < 0:
            raise SpecError(f"gpus per node cannot be negative, got {req.gpus_per_node}")
        argv = [
            "sbatch",
            "--parsable",
            f"--partition={req.partition}",
            f"--job-name={req.job_name}",
            f"--comment={req.comment}",
            f"--chdir={req.workdir}",
            f"--nodes={req.nodes}",
            f"--ntasks-per-node={req.ntasks_per_node}",
            f"--time={time_limit_minutes(req.time_limit_s)}",
            "--requeue" if req.requeue else "--no-requeue",
            "--export=ALL",
            "--open-mode=append",
        ]
        if req.account:
            argv.append(f"--account={req.account}")
        if req.gres_type is not None:
            if not _GRES_TYPE.fullmatch(req.gres_type) or req.gres_type.isdigit():
                raise SpecError(f"GPU type {req.gres_type!r} is not a Slurm gres type name")
            if req.gpus_per_node < 1:
                raise SpecError(f"a GPU type ({req.gres_type}) needs at least one GPU per node")
        if req.gpus_per_node > 0:
            typed = f"{req.gres_type}:" if req.gres_type else ""
            argv.append(f"--gres=gpu:{typed}{req.gpus_per_node}")
        for option, amount in (("cpus-per-gpu", req.cpus_per_gpu), ("cpus-per-task", req.cpus_per_task),
                              ("mem", req.mem_mb), ("mem-per-gpu", req.mem_per_gpu_mb)):
            if amount is None:
                continue
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
                raise SpecError(f"--{option} must be a whole number of at least 1, got {amount!r}")
            argv.append(f"--{option}={amount}M" if option.startswith("mem") else f"--{option}={amount}")
        if req.mem_mb is not None and req.mem_per_gpu_mb is not None:
            raise SpecError("give memory per node or per GPU, not both")
        if req.cpus_per_gpu is not None and req.cpus_per_task is not None:
            raise SpecError("give CPUs per GPU or per task, not both")
        if req.output:
            argv.append(f"--output={req.output}")
        if req.hold:
            argv.append("--hold")
        if req.constraint:
            argv.append(f"--constraint={req.constraint}")
        if req.signal:
            argv.append(f"--signal={req.signal}")
        if req.array is not None:
            argv.append(array_option(req.array))
        return argv

    def submit(self, req: SubmitRequest) -> int:
        argv = self.sbatch_argv(req)  # validates the request, whichever way it is sent
        if self.native is not None:
            self.runner.counter.record(["libslurm.submit"])
            return self.native.submit(req, self.submit_env(req), argv)
        result = self.runner.run(
            argv,
            timeout_s=self.submit_timeout_s,
            env=self.submit_env(req),
            user=req.user,
            input=req.script,
            cwd=req.workdir if req.user is not None else None,
        )
        return _job_id(argv, result)

    def start_submit(self, req: SubmitRequest) -> StartedSubmit | None:
        """sbatch as the user, started now, reading its script from stdin when ``finish`` writes it."""
        runner = self.runner
        if self.native is not None:
            return None  # one RPC in this process: nothing to start early
        if not isinstance(runner, Runner) or type(runner).run is not Runner.run:
            return None  # a test's runner (or one that wraps run): submit as usual
        try:
            argv = self.sbatch_argv(req)
            running = runner.start(argv, timeout_s=self.submit_timeout_s, env=self.submit_env(req), user=req.user,
                                   cwd=req.workdir if req.user is not None else None)
        except BrokerError:
            return None  # submit() says why, the usual way
        return _StartedSbatch(argv, running)

    def check(self, req: SubmitRequest) -> None:
        """``sbatch --test-only`` as the user: Slurm validates account, partition and
        size without creating a job. Raises SlurmError with Slurm's message."""
        argv = self.sbatch_argv(req)
        argv.insert(1, "--test-only")
        self.runner.run(
            argv, timeout_s=self.submit_timeout_s, env=self.submit_env(req), user=req.user, input=req.script,
            cwd=req.workdir if req.user is not None else None,
        )

    # -- reads ------------------------------------------------------------

    def jobs(
        self, job_ids: Iterable[int] | None = None, name_prefix: str | None = None
    ) -> list[SlurmJob]:
        # Without --array: an array's tasks that have not started are one row (ArrayTaskID
        # "5-1000%16"), so a listing grows with the tasks started, not with the tasks asked for.
        # The format (with this listing's own separators) goes in the environment, out of sight.
        sep = parse.Separators.fresh()
        out = self._query(["squeue", "--all", "--noheader", "--states=all"],
                          **{parse.SQUEUE_FORMAT_ENV: parse.long_format(parse.SQUEUE_FIELDS, sep)})
        jobs = parse.parse_squeue(out, sep)
        if job_ids is not None:
            wanted = set(job_ids)
            jobs = [j for j in jobs if j.job_id in wanted or j.array_job_id in wanted]
        if name_prefix is not None:
            jobs = [j for j in jobs if j.name.startswith(name_prefix)]
        return jobs

    def history(
        self, job_ids: Iterable[int] | None = None, since: datetime | None = None
    ) -> list[SacctRow]:
        sep = parse.Separators.fresh()  # sacct has no other way to take it than its command line
        argv = [
            "sacct", "--allusers", "--allocations", "--duplicates", "--noheader",
            "--parsable2", f"--delimiter={sep.fs}",
            f"--format={','.join(parse.SACCT_FIELDS)}",
            f"--starttime={_fmt_time(since) if since else '1970-01-01T00:00:00'}",
            "--endtime=now",
        ]  # fmt: skip
        ids = _ids(job_ids) if job_ids is not None else None
        if ids is not None:
            if not ids:
                return []
            argv.append(f"--jobs={','.join(ids)}")
        return parse.parse_sacct(self._query(argv), sep.fs)

    def array_history(self, array_ids: Iterable[int]) -> list[ArrayRow]:
        """Every run of every task of these arrays: ``sacct --duplicates`` with the task's ``JobID`` (``123_7``)."""
        ids = _ids(array_ids)
        if not ids:
            return []
        sep = parse.Separators.fresh()
        argv = [
            "sacct", "--allusers", "--allocations", "--duplicates", "--noheader",
            "--parsable2", f"--delimiter={sep.fs}",
            f"--format={','.join(arrays.ARRAY_SACCT_FIELDS)}",
            "--starttime=1970-01-01T00:00:00", "--endtime=now", f"--jobs={','.join(ids)}",
        ]  # fmt: skip
        return arrays.parse_array_sacct(self._query(argv), sep.fs)

    def nodes(self) -> list[NodeInfo]:
        out = self._query(
            [
                "sinfo",
                "--all",
                "--Node",
                "--noheader",
                f"--Format={parse.long_format(parse.SINFO_FIELDS)}",
            ]
        )
        return parse.parse_sinfo(out)

    def partitions(self) -> list[PartitionInfo]:
        """``scontrol --all --oneliner show partition``: every partition, hidden ones too."""
        return parse.parse_partitions(self._query(["scontrol", "--all", "--oneliner", "show", "partition"]))

    def gpus_in_use(self) -> dict[str, int]:
        out = self._query(
            ["sinfo", "--all", "--Node", "--noheader", f"--Format={parse.long_format(parse.GRES_USED_FIELDS)}"]
        )
        return parse.parse_gres_used(out)

    def ping(self) -> bool:
        try:
            out = self._query(["scontrol", "ping"])
        except SlurmError:
            return False
        return " is UP" in out

    # -- job control ------------------------------------------------------

    def cancel(self, job_ids: Iterable[int]) -> None:
        self._scancel(_ids(job_ids))

    def cancel_tasks(self, tasks: Iterable[tuple[int, int]]) -> None:
        # By name, <array>_<index>: scancel refuses a task's own job id ("Invalid job id
        # specified", measured on 22.05) and still exits 0.
        self._scancel([f"{int(a)}_{int(i)}" for a, i in tasks])

    def _scancel(self, ids: list[str]) -> None:
        if not ids:
            return
        argv = ["scancel", *ids]
        try:
            result = self.runner.run(argv, timeout_s=self.query_timeout_s, env=self.query_env())
        except SlurmError as exc:
            if type(exc) is SlurmError and self._only_already_done(exc.stderr):
                log.debug("scancel: some jobs were already gone: %s", exc.stderr.strip())
                return
            raise
        if result.stderr.strip() and not self._only_already_done(result.stderr):
            log.warning("scancel reported: %s", result.stderr.strip())

    @staticmethod
    def _only_already_done(stderr: str) -> bool:
        lines = [ln.lower() for ln in stderr.splitlines() if ln.strip()]
        return bool(lines) and all(any(p in ln for p in _ALREADY_DONE) for ln in lines)

    def hold(self, job_ids: Iterable[int]) -> None:
        self._job_list_command("hold", job_ids)

    def release(self, job_ids: Iterable[int]) -> None:
        self._job_list_command("release", job_ids)

    def requeue(self, job_ids: Iterable[int]) -> None:
        self._job_list_command("requeue", job_ids)

    def requeue_hold(self, job_ids: Iterable[int]) -> None:
        self._job_list_command("requeuehold", job_ids)

    def _job_list_command(self, verb: str, job_ids: Iterable[int]) -> None:
        ids = _ids(job_ids)
        if ids:
            self._control(["scontrol", verb, ",".join(ids)])

    def start_now(self, job_ids: Iterable[int]) -> None:
        ids = _ids(job_ids)
        if ids:
            self._control(["scontrol", "update", f"JobId={','.join(ids)}", "StartTime=now"])

    def update(self, job_id: int, **fields: object) -> None:
        (jid,) = _ids([job_id])
        if not fields:
            return
        pairs = []
        for key, value in fields.items():
            slurm_key = UPDATE_FIELDS.get(key)
            if slurm_key is None:
                raise ValueError(
                    f"cannot update job field {key!r}; valid: {', '.join(sorted(UPDATE_FIELDS))}"
                )
            if key == "time_limit_s":
                text = str(time_limit_minutes(int(value)))  # type: ignore[call-overload]
            elif key == "gpus_per_node":
                text = f"gpu:{int(value)}"  # type: ignore[call-overload]
            else:
                text = str(value)
            if "\n" in text or "\0" in text:
                raise SpecError(f"{key} must be one line of text")
            pairs.append(f"{slurm_key}={text}")
        self._control(["scontrol", "update", f"JobId={jid}", *pairs])

    # -- nodes ------------------------------------------------------------

    def power_down(self, names: Iterable[str], force: bool = False) -> None:
        names = list(names)
        if names:
            state = "POWER_DOWN_FORCE" if force else "POWER_DOWN"
            self._control(["scontrol", "update", f"NodeName={compress(names)}", f"State={state}"])

    def power_up(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            self._control(["scontrol", "update", f"NodeName={compress(names)}", "State=POWER_UP"])


class _StartedSbatch(StartedSubmit):
    def __init__(self, argv: list[str], running: RunningCommand) -> None:
        self.argv, self.running = argv, running

    def finish(self, script: str) -> int:
        return _job_id(self.argv, self.running.finish(script))

    def abort(self) -> None:
        self.running.abort()


def _job_id(argv: list[str], result: CompletedRun) -> int:
    """The job id in sbatch --parsable's answer; an answer without one is Slurm's error."""
    try:
        return parse.parse_sbatch_parsable(result.stdout)
    except ValueError as exc:
        raise SlurmError(str(exc), argv=argv, returncode=0, stderr=result.stderr) from None
