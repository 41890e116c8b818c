"""The two Slurm calls the node manager needs beyond the Backend contract.

- What each pending job needs of a node (GPUs per node, node count, features,
  required nodes): ``Backend.jobs()`` does not carry those, so one extra
  ``squeue --states=PENDING`` per tick reads them.
- Marking nodes DOWN or DRAIN with a reason (sweep, spot interruption, failed
  resume): the Backend has only power up/down.

Both go through the backend's runner, the one door to Slurm (argv list,
timeout, SlurmError/SlurmUnavailable). A backend without a runner (pyslurm)
gets the module runner. Candidates for the Backend contract itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from broker.nodes.policy import PendingJob
from broker.slurm import parse
from broker.slurm.backend import SlurmJob
from broker.slurm.hostlist import compress, expand
from broker.slurm.runner import Runner, clean_env

PENDING_FIELDS = ("JobID", "Partition", "Reason", "ReqNodes", "NumNodes", "tres-per-node", "Feature")
_GPUS = re.compile(r"gpu(?:[:/][A-Za-z0-9_.-]+)*?[:=](\d+)$")
_NO_VALUE = frozenset({"", "n/a", "(null)", "none", "null"})


def gpus_per_node(tres_per_node: str) -> int:
    """'gres:gpu:2' (22.05), 'gres/gpu:2' (24.11), 'gres:gpu:a100:2' -> 2; nothing -> 0."""
    for part in tres_per_node.split(","):
        m = _GPUS.search(part.strip())
        if m:
            return int(m.group(1))
    return 0


def unavailable_nodes(reason: str) -> tuple[str, ...]:
    """'ReqNodeNotAvail, UnavailableNodes:spot[3-4]' -> ('spot3', 'spot4')."""
    m = re.search(r"UnavailableNodes:(\S+)", reason)
    if not m:
        return ()
    try:
        return tuple(expand(m.group(1).rstrip(",")))
    except ValueError:
        return ()


def parse_pending(stdout: str, sep: parse.Separators = parse.PLAIN) -> list[PendingJob]:
    """Output of ``squeue -h -O <parse.long_format(PENDING_FIELDS, sep)>``."""
    out: list[PendingJob] = []
    for record in stdout.split(sep.rs):
        record = record.strip("\n")
        if not record.strip():
            continue
        f = record.split(sep.fs)
        if len(f) != len(PENDING_FIELDS):
            continue
        jid, part, reason, req, num, tres, feat = (x.strip() for x in f)
        try:
            job_id = int(jid)
        except ValueError:
            continue  # array parents print 123_[1-5]; their tasks show up on their own
        try:
            nodes = int(num.split("-")[0]) if num else 1
        except ValueError:
            nodes = 1
        try:
            required = tuple(expand(req)) if req.lower() not in _NO_VALUE else ()
        except ValueError:
            required = ()
        reason = "" if reason.lower() in _NO_VALUE else reason
        out.append(
            PendingJob(
                job_id=job_id,
                partitions=tuple(p for p in part.split(",") if p),
                nodes=max(1, nodes),
                gpus_per_node=gpus_per_node(tres) if tres.lower() not in _NO_VALUE else 0,
                constraint="" if feat.lower() in _NO_VALUE else feat,
                required_nodes=required,
                reason=reason,
                unavailable=unavailable_nodes(reason),
            )
        )
    return out


class NodeSlurm:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.runner = getattr(backend, "runner", None) or Runner()

    def _env(self) -> dict[str, str] | None:
        query_env = getattr(self.backend, "query_env", None)
        return query_env() if callable(query_env) else None

    def pending_jobs(self, jobs: Iterable[SlurmJob] | None = None) -> list[PendingJob]:
        """Pending jobs with their needs (one squeue call)."""
        sep = parse.Separators.fresh()  # as Backend.jobs(): see broker.slurm.parse
        env = {**(self._env() or clean_env()), parse.SQUEUE_FORMAT_ENV: parse.long_format(PENDING_FIELDS, sep)}
        out = self.runner.run(["squeue", "--all", "--noheader", "--states=PENDING"], env=env).stdout
        return parse_pending(out, sep)

    def set_state(self, names: list[str], state: str, reason: str) -> None:
        """``scontrol update NodeName=... State=DOWN|DRAIN Reason=...`` (one call)."""
        if state not in ("DOWN", "DRAIN"):
            raise ValueError(f"refusing node state {state!r}")
        if names:
            self.runner.run(
                ["scontrol", "update", f"NodeName={compress(sorted(names))}", f"State={state}", f"Reason={reason}"],
                env=self._env(),
            )
