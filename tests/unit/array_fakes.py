"""A fake Slurm that also runs job arrays (``--array``), on top of the ledger tests' FakeSlurm.

Every task has a Slurm id of its own from the start (Slurm splits them off as
they start; the difference does not matter to gbroker, which names tasks by
array and index). squeue lists each task on its own row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from broker.pieces import parse_pieces
from broker.errors import SlurmError
from broker.slurm.backend import ArrayRow, SlurmJob, SubmitRequest
from broker.jobs.submit import submit
from ledger_fakes import FakeJob, FakeRun, FakeSlurm, World, caller, setup_lab


class FakeArraySlurm(FakeSlurm):
    def __init__(self, clock) -> None:  # type: ignore[no-untyped-def]
        super().__init__(clock)
        self.arrays: dict[int, dict[int, int]] = {}
        """array id -> task index -> the task's own Slurm id."""
        self.task_of: dict[int, tuple[int, int]] = {}
        self.requests: list[SubmitRequest] = []

    def submit(self, req: SubmitRequest) -> int:
        self.requests.append(req)
        if req.array is None:
            return super().submit(req)
        self._count("sbatch")
        now = self.clock.now()
        self.next_id += 1
        array_id = self.next_id
        self.arrays[array_id] = {}
        for i, index in enumerate(parse_pieces(req.array).indices):
            raw = array_id if i == 0 else self.next_id + 1
            if i:
                self.next_id += 1
            self.jobs_by_id[raw] = FakeJob(raw, req.job_name, req.comment, req.user or "root", req.account or "",
                                           req.partition, req.nodes * req.gpus_per_node, 3600,
                                           runs=[FakeRun(submit=now, partition=req.partition)], requeue=req.requeue)
            self.arrays[array_id][index] = raw
            self.task_of[raw] = (array_id, index)
        return array_id

    def task(self, array_id: int, index: int) -> int:
        return self.arrays[array_id][index]

    def jobs(self, job_ids: Iterable[int] | None = None, name_prefix: str | None = None) -> list[SlurmJob]:
        out = []
        for j in super().jobs(job_ids=None, name_prefix=name_prefix):
            if j.job_id in self.task_of:
                array_id, index = self.task_of[j.job_id]
                j = SlurmJob(**{**j.__dict__, "array_job_id": array_id, "array_task": index})
            out.append(j)
        if job_ids is not None:
            wanted = set(job_ids)
            out = [j for j in out if j.job_id in wanted or j.array_job_id in wanted]
        return out

    def array_history(self, array_ids: Iterable[int]) -> list[ArrayRow]:
        self._count("sacct")
        out = []
        for array_id in array_ids:
            tasks = self.arrays.get(array_id, {})
            raw = {r: i for i, r in tasks.items()}
            self.calls["sacct"] -= 1  # the one call above counts, not the history() below
            for row in self.history(job_ids=list(raw)):
                out.append(ArrayRow(array_id=array_id, task=raw[row.job_id], row=row))
        return out

    def cancel(self, job_ids: Iterable[int]) -> None:
        ids = []
        for jid in job_ids:
            ids.extend(self.arrays[jid].values() if jid in self.arrays else [jid])
        super().cancel(ids)

    def cancel_tasks(self, tasks: Iterable[tuple[int, int]]) -> None:
        super().cancel([self.arrays[a][i] for a, i in tasks if i in self.arrays.get(a, {})])

    def hold(self, job_ids: Iterable[int]) -> None:
        """``scontrol hold ARRAY`` holds the array's waiting tasks; its running ones go on (exit 0)."""
        plain = [j for j in job_ids if j not in self.arrays]
        finished = []
        for array_id in [j for j in job_ids if j in self.arrays]:
            self._count("hold")
            for index, raw in self.arrays[array_id].items():
                j = self.jobs_by_id[raw]
                if not j.done and j.current.state_raw == "PENDING":
                    j.held = True
                elif j.done:
                    finished.append(f"{array_id}_{index}")
        if plain:
            super().hold(plain)
        if finished:  # as Slurm 22.05: the others are held, and the exit code says an ended task was not
            raise SlurmError("hold refused", argv=["scontrol", "hold"], returncode=1,
                             stderr=f"{finished[0]}: Job has already finished\n")

    def release(self, job_ids: Iterable[int]) -> None:
        ids: list[int] = []
        for jid in job_ids:
            ids.extend(self.arrays[jid].values() if jid in self.arrays else [jid])
        super().release(ids)

    def ended(self) -> list[tuple[int, int, datetime | None]]:
        return [(jid, i, r.end) for jid, i, r, _ in self.ended_runs()]


def array_world(db_url: str) -> World:
    """The ledger tests' world with this fake as its Slurm, and the lab's groups and budget."""
    w = World(db_url)
    w.slurm = FakeArraySlurm(w.clock)
    w.svc.backend = w.slurm
    setup_lab(w.svc, vision_budget="1000")
    return w


def submit_array(w: World, **kw: Any) -> dict[str, Any]:
    """alice submits a render array (the fields in ``kw`` added or replaced)."""
    data = {"name": "frames", "kind": "render", "group": "vision", "time_limit": "10m", "gpus_per_node": 2,
            "command": ["python3", "render.py"], "workdir": "/tmp", "checkpoint": {"style": "pieces"}, **kw}
    return submit(w.svc, caller("alice"), data)
