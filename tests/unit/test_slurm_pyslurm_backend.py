"""The optional pyslurm backend: chosen only when pyslurm matches the running Slurm.

pyslurm cannot be installed against Slurm 22.05/24.11, so a stand-in module
plays pyslurm here; it has the attributes the pyslurm 23+ API documents.
"""

from __future__ import annotations

import sys
import types
from datetime import UTC, datetime
from typing import Any

import pytest

from broker.errors import SlurmError, SlurmUnavailable
from broker.slurm import available_backends, make_backend
from broker.slurm import pyslurm_backend as pb
from broker.states import AttemptState, NodeState

REAL_SINFO_VERSION = pb.sinfo_version


class FakeJob:
    def __init__(self, job_id: int, **kw: Any) -> None:
        self.id = job_id
        self.name = kw.get("name", f"gb-{job_id}")
        self.user_name = "alice"
        self.account = "vision"
        self.partition = "spot"
        self.state = kw.get("state", "RUNNING")
        self.state_reason = kw.get("reason", "None")
        self.allocated_nodes = kw.get("nodes", "spot[1-2]")
        self.requeue_count = kw.get("restarts", 0)
        self.comment = "gbk:1:0"
        self.submit_time = 1_790_000_000
        self.start_time = kw.get("start", 1_790_000_060)
        self.time_limit = kw.get("limit", 10)
        self.calls: list[str] = []

    def cancel(self) -> None:
        FAKE_LOG.append(f"cancel {self.id}")

    def hold(self) -> None:
        FAKE_LOG.append(f"hold {self.id}")

    def release(self) -> None:
        raise RuntimeError("Unable to contact slurm controller (connect failure)")


class FakeNode:
    def __init__(self, name: str, state: str) -> None:
        self.name = name
        self.state = state
        self.configured_gres = {"gpu": 4}
        self.partitions = ["spot", "urgent"]
        self.available_features = ["spot"]
        self.reason = None


FAKE_LOG: list[str] = []


def fake_pyslurm(slurm_version: tuple[int, int, int]) -> types.ModuleType:
    mod = types.ModuleType("pyslurm")
    jobs = {
        7: FakeJob(7),
        8: FakeJob(
            8, state="PENDING", reason="BeginTime", nodes=None, restarts=1, start=0, limit=None
        ),
        9: FakeJob(9, name="other", state="EXPLODED"),
    }
    mod.Jobs = types.SimpleNamespace(load=lambda: jobs)  # type: ignore[attr-defined]
    mod.Job = lambda job_id: jobs[job_id]  # type: ignore[attr-defined]
    nodes = {
        "spot1": FakeNode("spot1", "IDLE+CLOUD+POWERED_DOWN"),
        "spot2": FakeNode("spot2", "MIXED+CLOUD"),
    }
    mod.Nodes = types.SimpleNamespace(load=lambda: nodes)  # type: ignore[attr-defined]
    mod.slurm_version = lambda: slurm_version  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def with_pyslurm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def install(built_for: tuple[int, int, int], running: str | None) -> None:
        monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm(built_for))
        monkeypatch.setattr(pb, "sinfo_version", lambda runner=None: f"slurm {running}.1\n" if running else "")

    FAKE_LOG.clear()
    return install


def test_not_usable_when_it_does_not_import() -> None:
    assert "pyslurm" not in sys.modules
    assert pb.pyslurm_usable() is False


@pytest.mark.parametrize(
    ("built_for", "running", "usable"),
    [((25, 11, 0), "25.11", True), ((25, 11, 0), "22.05", False), ((24, 11, 3), "24.11", True),
     ((24, 5, 0), "24.11", False), ((25, 11, 0), None, False)],
)  # fmt: skip
def test_usable_only_when_the_slurm_release_matches(
    with_pyslurm, built_for, running, usable
) -> None:  # type: ignore[no-untyped-def]
    with_pyslurm(built_for, running)
    assert pb.pyslurm_usable() is usable
    assert ("pyslurm" in available_backends()) is usable
    assert make_backend().name == ("pyslurm" if usable else "cli")


def test_jobs_and_nodes_follow_the_contract(with_pyslurm) -> None:  # type: ignore[no-untyped-def]
    with_pyslurm((25, 11, 0), "25.11")
    backend = make_backend("pyslurm")
    jobs = {j.job_id: j for j in backend.jobs(name_prefix="gb-")}
    assert sorted(jobs) == [7, 8]
    assert jobs[7].state is AttemptState.RUNNING and jobs[7].nodes == ["spot1", "spot2"]
    assert jobs[7].start_time == datetime.fromtimestamp(1_790_000_060, tz=UTC)
    assert jobs[7].time_limit_s == 600 and jobs[7].reason == ""
    assert jobs[8].state is AttemptState.PENDING and jobs[8].restarts == 1 and jobs[8].nodes == []
    assert jobs[8].start_time is None and jobs[8].time_limit_s is None
    assert backend.jobs(job_ids=[9])[0].state is AttemptState.UNKNOWN
    nodes = {n.name: n for n in backend.nodes()}
    assert nodes["spot1"].state is NodeState.POWERED_DOWN and nodes["spot1"].gpus == 4
    assert nodes["spot2"].state is NodeState.ALLOCATED
    assert backend.calls.total == 3  # type: ignore[attr-defined]


def test_job_control_and_errors(with_pyslurm) -> None:  # type: ignore[no-untyped-def]
    with_pyslurm((25, 11, 0), "25.11")
    backend = make_backend("pyslurm")
    backend.cancel([7, 8])
    backend.hold([8])
    assert FAKE_LOG == ["cancel 7", "cancel 8", "hold 8"]
    with pytest.raises(SlurmUnavailable):
        backend.release([8])
    assert issubclass(SlurmUnavailable, SlurmError)


def test_array_tasks_are_cancelled_by_their_own_job_ids(with_pyslurm) -> None:  # type: ignore[no-untyped-def]
    with_pyslurm((25, 11, 0), "25.11")
    jobs = sys.modules["pyslurm"].Jobs.load()
    for own, task in ((20, 1), (21, 2)):
        jobs[own] = FakeJob(own)
        jobs[own].array_id, jobs[own].array_task_id = 19, task
    backend = make_backend("pyslurm")
    backend.cancel_tasks([(19, 2), (19, 5)])  # task 5 is not in the queue (it ended)
    backend.cancel_tasks([])
    assert FAKE_LOG == ["cancel 21"]


def test_a_start_that_may_submit_through_libslurm_asks_sinfo_for_its_version_once(with_pyslurm, monkeypatch):  # type: ignore[no-untyped-def]
    from broker.slurm.runner import CallCounter, CompletedRun

    asked: list[str] = []
    with_pyslurm((99, 11, 0), "99.11")
    monkeypatch.setattr(pb, "sinfo_version", REAL_SINFO_VERSION)  # through the runner, as in the daemon

    class Counting:
        counter = CallCounter()

        def run(self, argv, **kw):  # type: ignore[no-untyped-def]
            asked.append(" ".join(argv))
            return CompletedRun(argv=argv, stdout="slurm 99.11.0\n", stderr="", returncode=0, elapsed_s=0.0)

    backend = make_backend(runner=Counting(), submit_with="auto")  # no module built for 99.11: sbatch
    assert backend.name == "pyslurm" and backend.native is None
    assert asked.count("sinfo --version") == 1, asked
