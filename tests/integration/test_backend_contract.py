"""The Slurm backend contract, against the real dev cluster, for every backend usable here.

Each test submits its own jobs (names start with a unique prefix), waits on
the real controller and cancels what it left behind. No mocks: sbatch,
squeue, sacct, sinfo and scontrol run for real (as root and as alice).
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.errors import SlurmError, SlurmUnavailable
from broker.slurm import available_backends, make_backend
from broker.slurm.backend import Backend, SacctRow, SlurmJob, SubmitRequest
from broker.slurm.runner import DEFAULT_BIN_DIR, Runner
from broker.slurm.script import render_batch_script
from broker.states import AttemptState, NodeState

pytestmark = [pytest.mark.slurm, pytest.mark.contract]
"""`contract`: runs on every Slurm release the dev cluster offers (contrib/dev/test -m contract --slurm 24.11)."""

T = TypeVar("T")


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 180, every: float = 1.0
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@pytest.fixture(params=available_backends())
def backend(request: pytest.FixtureRequest, slurm_cluster: Any) -> Backend:
    # gbroker's own setting: another release's cluster names its commands' directory there.
    bin_dir = os.environ.get("GBROKER_SLURM_BIN_DIR") or DEFAULT_BIN_DIR
    return make_backend(request.param, runner=Runner(bin_dir=bin_dir))


def program_output(path: Path) -> str:
    """A job's output without the lines gbroker's batch script adds (attempt starts, signals)."""
    return "".join(ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith("=== gbroker:"))


class Jobs:
    """Submits test jobs and cancels whatever is left at the end of the test."""

    def __init__(self, backend: Backend, root: Path) -> None:
        self.backend = backend
        self.root = root
        self.prefix = f"gbct-{uuid.uuid4().hex[:8]}-"
        self.ids: list[int] = []

    def workdir(self, user: str) -> Path:
        d = self.root / user
        d.mkdir(parents=True, exist_ok=True)
        pw = pwd.getpwnam(user)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        return d

    def request(
        self, tag: str, command: list[str], *, user: str | None = None, **kw: Any
    ) -> SubmitRequest:
        owner = user or "root"
        wd = self.workdir(owner)
        fields: dict[str, Any] = {
            "script": render_batch_script(
                job_id=f"ct-{tag}", attempt=0, checkpoint_dir=str(wd / "ck"), command=command
            ),
            "partition": "spot",
            "job_name": self.prefix + tag,
            "comment": f"gbk:{self.prefix}{tag}:0",
            "account": "vision",
            "user": user,
            "workdir": str(wd),
            "nodes": 1,
            "gpus_per_node": 1,
            "time_limit_s": 600,
            "output": str(wd / f"{tag}-%j.out"),
        }
        fields.update(kw)
        return SubmitRequest(**fields)

    def submit(self, tag: str, command: list[str], **kw: Any) -> int:
        job_id = self.backend.submit(self.request(tag, command, **kw))
        self.ids.append(job_id)
        return job_id

    def one(self, job_id: int) -> SlurmJob | None:
        found = self.backend.jobs(job_ids=[job_id])
        return found[0] if found else None

    def wait_state(self, job_id: int, *states: AttemptState, timeout: float = 180) -> SlurmJob:
        def probe() -> SlurmJob | None:
            job = self.one(job_id)
            return job if job is not None and job.state in states else None

        return wait_for(f"job {job_id} in {[s.value for s in states]}", probe, timeout)

    def history_rows(self, job_id: int, n: int, timeout: float = 90) -> list[SacctRow]:
        since = datetime.now(UTC) - timedelta(hours=1)

        def settled(r: SacctRow) -> bool:
            # slurmdbd may first store a job that starts and ends within a second
            # with the placeholder name "allocation"; wait for the real record.
            return r.end is not None and r.name != "allocation"

        def probe() -> list[SacctRow] | None:
            rows = [
                r for r in self.backend.history(job_ids=[job_id], since=since) if r.job_id == job_id
            ]
            return rows if len(rows) >= n and all(settled(r) for r in rows[:n]) else None

        return wait_for(f"{n} finished accounting rows of job {job_id}", probe, timeout)

    def cleanup(self) -> None:
        if self.ids:
            try:
                self.backend.cancel(self.ids)
            except SlurmError:
                pass  # the controller may be what the test broke; nothing left to undo then


@pytest.fixture
def jobs(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    root = Path(f"/tmp/gbroker-contract-{uuid.uuid4().hex[:8]}")
    root.mkdir(mode=0o755)
    j = Jobs(backend, root)
    try:
        yield j
    finally:
        j.cleanup()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- reads


def test_ping(backend: Backend) -> None:
    assert backend.ping() is True


def test_nodes_show_the_lab_with_four_gpus_each(backend: Backend) -> None:
    nodes = {n.name: n for n in backend.nodes()}
    assert {"spot1", "spot2", "spot3", "spot4", "od1", "od2"} <= set(nodes)
    for name in ("spot1", "spot2", "spot3", "spot4"):
        assert "spot" in nodes[name].partitions
        assert nodes[name].gpus == 4
    for name in ("od1", "od2"):
        assert nodes[name].partitions == ["ondemand"]
        assert nodes[name].gpus == 4
    assert all(n.state is not NodeState.UNKNOWN for n in nodes.values()), nodes


def test_every_read_is_one_slurm_call(backend: Backend) -> None:
    counter = backend.calls  # type: ignore[attr-defined]
    counter.reset()
    backend.jobs()
    backend.jobs(job_ids=[1, 2, 3], name_prefix="gb")
    backend.history(since=datetime.now(UTC) - timedelta(hours=1))
    backend.nodes()
    assert counter.total == 4


# ------------------------------------------------------------------------- submit


def test_submit_as_root_round_trips_through_squeue_and_sacct(jobs: Jobs) -> None:
    job_id = jobs.submit("root", ["sh", "-c", "echo CUDA=$CUDA_VISIBLE_DEVICES; exit 0"])
    job = jobs.one(job_id)
    assert job is not None
    assert job.name == jobs.prefix + "root"
    assert job.user == "root" and job.account == "vision" and job.partition == "spot"
    assert job.comment == f"gbk:{jobs.prefix}root:0"
    assert job.time_limit_s == 600
    assert job.submit_time is not None and job.submit_time.tzinfo is not None
    assert [j.job_id for j in jobs.backend.jobs(name_prefix=jobs.prefix)] == [job_id]

    (row,) = jobs.history_rows(job_id, 1)
    assert row.state is AttemptState.COMPLETED and row.exit_code == 0
    assert row.user == "root" and row.name == jobs.prefix + "root"
    assert row.alloc_gpus == 1
    assert len(row.nodelist) == 1 and row.nodelist[0].startswith("spot")
    assert row.start is not None and row.end is not None and row.end >= row.start
    out = program_output(next(jobs.workdir("root").glob(f"root-{job_id}.out")))
    assert out.startswith("CUDA=") and out.strip() != "CUDA="


def test_submit_as_alice_makes_the_job_hers(jobs: Jobs) -> None:
    job_id = jobs.submit("alice", ["sh", "-c", "id -un; echo $HOME"], user="alice")
    job = jobs.one(job_id)
    assert job is not None and job.user == "alice" and job.account == "vision"
    (row,) = jobs.history_rows(job_id, 1)
    assert row.user == "alice" and row.state is AttemptState.COMPLETED
    out = program_output(jobs.workdir("alice") / f"alice-{job_id}.out").split()
    assert out[0] == "alice"
    assert (jobs.workdir("alice") / f"alice-{job_id}.out").stat().st_uid == pwd.getpwnam(
        "alice"
    ).pw_uid


def test_command_line_options_beat_sbatch_lines_in_the_script(jobs: Jobs) -> None:
    req = jobs.request("directives", ["true"], hold=True)
    hostile = req.script.replace(
        "#!/bin/bash\n",
        "#!/bin/bash\n#SBATCH --partition=ondemand\n#SBATCH --account=climate\n#SBATCH --comment=x\n",
        1,
    )
    job_id = jobs.backend.submit(replace(req, script=hostile))
    jobs.ids.append(job_id)
    job = jobs.one(job_id)
    assert job is not None
    assert (job.partition, job.account, job.comment) == ("spot", "vision", req.comment)


def test_user_job_script_runs_as_alice_and_its_directives_are_inert(jobs: Jobs) -> None:
    wd = jobs.workdir("alice")
    text = '#!/bin/bash\n#SBATCH --partition=ondemand\necho "ran $GBROKER_JOB_ID as $(id -un)"\n'
    req = jobs.request("usertext", ["true"], user="alice")
    script = render_batch_script(
        job_id="ct-usertext", attempt=0, checkpoint_dir=str(wd / "ck"), script_text=text
    )
    job_id = jobs.backend.submit(replace(req, script=script))
    jobs.ids.append(job_id)
    (row,) = jobs.history_rows(job_id, 1)
    assert row.state is AttemptState.COMPLETED and row.partition == "spot"
    assert program_output(wd / f"usertext-{job_id}.out") == "ran ct-usertext as alice\n"


def test_missing_partition_is_refused_with_slurms_message(jobs: Jobs) -> None:
    with pytest.raises(SlurmError) as info:
        jobs.submit("nopart", ["true"], partition="no-such-partition")
    err = info.value
    assert type(err) is SlurmError  # Slurm answered "no"; it is not "unavailable"
    assert "invalid partition" in str(err).lower()
    assert err.argv[0] == "sbatch" and err.returncode == 1
    assert "Invalid partition name specified" in err.stderr


# ------------------------------------------- names that print separators (docs/SECURITY.md)


def test_a_name_and_a_comment_cannot_print_records_for_someone_elses_job(jobs: Jobs, slurm_cluster: Any) -> None:
    """Slurm keeps a job's name and comment byte for byte, control characters and newlines
    included, and squeue and sacct print them raw. alice names her own job so that, printed
    with the bare separators, it reads as bob's job: a forged queue record and a forged
    accounting row (the ledger's input). Neither is read as bob's."""
    from broker.slurm import parse

    bob = jobs.submit("bob", ["sleep", "300"], user="bob", hold=True)
    bob_name, bob_key = jobs.prefix + "bob", f"gbk:{jobs.prefix}bob:0"
    queued = [str(bob), bob_name, "bob", "vision", "spot", "RUNNING", "None", "spot1", "0",
              "2026-12-01T10:00:00", "2026-12-01T10:00:05", "1:00:00", bob_key, str(bob), "N/A"]
    accounted = [str(bob), bob_name, "bob", "vision", "spot", "COMPLETED", "spot1", "2026-12-01T10:00:00",
                 "2026-12-01T10:00:05", "2026-12-01T11:00:05", "999999", "cpu=1,gres/gpu=4", "0:0", bob_key]
    queue_forgery = jobs.prefix + "x" + parse.RS + "\n" + parse.FS.join(queued) + parse.RS + "\ny"
    account_forgery = jobs.prefix + "y\n" + parse.FS.join(accounted) + "\nz"
    assert len(account_forgery.encode()) < 255  # slurmdbd keeps the first 255 bytes of a name
    evil_comment = "c" + parse.FS + "d" + parse.RS + "\ne"
    wd = jobs.workdir("alice")

    def sbatch_as_alice(name: str) -> int:
        out = slurm_cluster.as_user("alice", ["sbatch", "--parsable", "-p", "spot", "-A", "vision", "-t", "5",
                                              "--hold", f"--job-name={name}", f"--comment={evil_comment}",
                                              "-D", str(wd), "-o", str(wd / "evil.out"), "--wrap", "true"])
        jobs.ids.append(int(out.stdout.strip().split(";")[0]))
        return jobs.ids[-1]

    a1, a2 = sbatch_as_alice(queue_forgery), sbatch_as_alice(account_forgery)
    # The premise: Slurm prints her names whole, separators and newlines as she wrote them.
    raw = slurm_cluster.run(["squeue", "-h", "-j", f"{a1},{a2}", "-O", "Name:0,Comment:0"]).stdout
    assert queue_forgery in raw and account_forgery in raw and evil_comment in raw

    listed = [j for j in jobs.backend.jobs() if j.job_id in (bob, a1, a2)]
    assert sorted((j.job_id, j.user, j.name) for j in listed) == [
        (bob, "bob", bob_name), (a1, "alice", queue_forgery), (a2, "alice", account_forgery)]
    assert [j.comment for j in listed if j.user == "alice"] == [evil_comment] * 2

    jobs.backend.cancel([a1, a2, bob])

    def ended() -> list[SacctRow] | None:
        rows = jobs.backend.history(job_ids=[bob, a1, a2], since=datetime.now(UTC) - timedelta(hours=1))
        # slurmdbd may first hold a cancelled job under the placeholder name "allocation".
        return rows if len(rows) == 3 and all(r.end is not None and r.name != "allocation" for r in rows) else None

    rows = wait_for("the three jobs in accounting", ended, 90)
    assert sorted((r.job_id, r.user, r.elapsed_s) for r in rows) == [(bob, "bob", 0), (a1, "alice", 0), (a2, "alice", 0)]
    assert [r.name for r in sorted(rows, key=lambda r: r.job_id)] == [bob_name, queue_forgery, account_forgery]


# --------------------------------------------------------------------- job control


def test_hold_and_release(jobs: Jobs) -> None:
    job_id = jobs.submit("hold", ["true"], hold=True)
    assert jobs.wait_state(job_id, AttemptState.PENDING).reason == "JobHeldUser"
    jobs.backend.hold([job_id])  # as root: an admin hold on top
    assert jobs.one(job_id).reason == "JobHeldAdmin"  # type: ignore[union-attr]
    jobs.backend.release([job_id])
    job = jobs.one(job_id)
    assert job is not None and job.reason not in ("JobHeldUser", "JobHeldAdmin")
    (row,) = jobs.history_rows(job_id, 1)
    assert row.state is AttemptState.COMPLETED


def test_update_partition_while_pending(jobs: Jobs) -> None:
    job_id = jobs.submit("move", ["true"], hold=True)
    jobs.backend.update(job_id, partition="ondemand", time_limit_s=1200)
    job = jobs.one(job_id)
    assert job is not None and job.partition == "ondemand" and job.time_limit_s == 1200
    jobs.backend.release([job_id])
    (row,) = jobs.history_rows(job_id, 1)
    assert row.partition == "ondemand" and row.nodelist[0].startswith("od")


def test_cancel(jobs: Jobs) -> None:
    a = jobs.submit("cancel-a", ["true"], hold=True)
    b = jobs.submit("cancel-b", ["true"], hold=True)
    counter = jobs.backend.calls  # type: ignore[attr-defined]
    before = counter.total
    jobs.backend.cancel([a, b])
    assert counter.total == before + 1  # one scancel for the whole list
    states = {j.job_id: j.state for j in jobs.backend.jobs(job_ids=[a, b])}
    assert states == {a: AttemptState.CANCELLED, b: AttemptState.CANCELLED}
    jobs.backend.cancel([a])  # cancelling again is harmless


def test_requeue_then_start_now_skips_the_begin_time_delay(jobs: Jobs) -> None:
    job_id = jobs.submit("requeue", ["sh", "-c", "echo started; sleep 300"])
    jobs.wait_state(job_id, AttemptState.RUNNING)
    out = jobs.workdir("root") / f"requeue-{job_id}.out"
    wait_for("the program to start", lambda: out.exists() and "started" in out.read_text(), 60)
    jobs.backend.requeue([job_id])

    def pending_again() -> SlurmJob | None:
        job = jobs.one(job_id)
        return job if job and job.state is AttemptState.PENDING and job.restarts == 1 else None

    pending = wait_for("the requeued job to be pending", pending_again, 60)
    assert pending.reason == "BeginTime"
    assert pending.start_time is not None
    assert pending.start_time > datetime.now(UTC) + timedelta(seconds=60)

    jobs.backend.start_now([job_id])
    started = time.monotonic()
    job = jobs.wait_state(job_id, AttemptState.RUNNING, timeout=100)
    assert job.restarts == 1
    assert time.monotonic() - started < 100  # well inside the 2-minute delay... plus a boot
    rows = jobs.history_rows(job_id, 1)
    assert rows[0].state_raw == "REQUEUED" and rows[0].state is AttemptState.PREEMPTED
    assert rows[0].restarts == 0


# ------------------------------------------------------------------- unavailability


@pytest.fixture
def dead_controller(slurm_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the cluster's slurm.conf whose controller and slurmdbd ports nobody listens on."""
    conf_dir = tmp_path / "deadconf"
    conf_dir.mkdir()
    lines = []
    for line in Path(slurm_cluster.slurm_conf).read_text().splitlines():
        if line.startswith("SlurmctldPort="):
            line = "SlurmctldPort=16997"
        elif line.startswith("AccountingStoragePort="):
            line = "AccountingStoragePort=16996"
        lines.append(line)
    (conf_dir / "slurm.conf").write_text("\n".join(lines) + "\n")
    gres = Path(slurm_cluster.slurm_conf).with_name("gres.conf")
    if gres.exists():
        shutil.copy(gres, conf_dir / "gres.conf")
    monkeypatch.setenv("SLURM_CONF", str(conf_dir / "slurm.conf"))
    return conf_dir / "slurm.conf"


def test_controller_down_is_unavailable_not_an_error(
    backend: Backend, dead_controller: Path, tmp_path: Path
) -> None:
    assert backend.ping() is False
    with pytest.raises(SlurmUnavailable):
        backend.jobs()
    with pytest.raises(SlurmUnavailable):
        backend.history(since=datetime.now(UTC) - timedelta(hours=1))
    with pytest.raises(SlurmUnavailable):
        backend.hold([999999])
    req = SubmitRequest(
        script="#!/bin/bash\ntrue\n", partition="spot", job_name="gbct-dead", comment="x",
        account=None, user=None, workdir=str(tmp_path), nodes=1, gpus_per_node=0, time_limit_s=60,
    )  # fmt: skip
    with pytest.raises(SlurmUnavailable) as info:
        backend.submit(req)
    assert (
        info.value.argv[0] == "sbatch" and "Unable to contact slurm controller" in info.value.stderr
    )
