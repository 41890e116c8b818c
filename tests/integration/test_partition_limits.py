"""Partition limits on the real dev cluster: placement and --dry-run read them, and a job that
waits in Slurm for a limit says so in words.

Slurm (EnforcePartLimits unset, as on the dev cluster) accepts a job above its partition's
MaxTime and leaves it pending for ever with reason PartitionTimeLimit; gbroker said only
"pending". Here spot gets MaxTime=60 (one hour) as root with ``scontrol update``: a 2-hour job's
dry run and submission go to on-demand, naming the skipped pool, and the same job forced onto
spot is refused naming the limit. Then a job waiting on on-demand (the partition DOWN) has
on-demand's MaxTime lowered under it: ``status`` and ``show`` give Slurm's reason in words.
Every partition is put back as the dev cluster has it (MaxTime=INFINITE, State=UP).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from broker_fixtures import BrokerDaemon, broker_daemon  # noqa: F401  (the fixture)

TWO_HOURS = ("--group", "vision", "--time", "2h", "--", "sleep", "5")


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\n{r.out}\n{r.err}"
    return r


def set_partition(cluster: Any, name: str, **fields: str) -> None:
    pairs = [f"{k}={v}" for k, v in fields.items()]
    cluster.run(["scontrol", "update", f"PartitionName={name}", *pairs])


@pytest.fixture
def limited(slurm_cluster: Any) -> Iterator[Any]:
    """spot with MaxTime=60 (minutes); afterwards spot and ondemand as the dev cluster has them, and
    nothing of gbroker's left queued."""
    set_partition(slurm_cluster, "spot", MaxTime="60")
    try:
        yield slurm_cluster
    finally:
        for name in ("spot", "ondemand"):
            set_partition(slurm_cluster, name, MaxTime="INFINITE", State="UP")
        queued = slurm_cluster.run(["squeue", "-h", "-o", "%i %j"], check=False).stdout.splitlines()
        ours = [line.split()[0] for line in queued if line.split()[1:2] and line.split()[1].startswith("gb-")]
        if ours:
            slurm_cluster.run(["scancel", *ours], check=False)


def test_a_job_above_a_partitions_max_time_is_placed_where_it_can_run_or_refused(
        limited: Any, broker_daemon: BrokerDaemon) -> None:
    d = broker_daemon
    dry = ok(d.cli("submit", "--dry-run", *TWO_HOURS))
    assert dry.out.startswith("Would submit sleep to ondemand [ondemand]"), dry.out
    assert "skipped   spot: partition spot allows at most 1:00:00 (MaxTime), the job asks for 2:00:00" in dry.out
    plan = ok(d.cli("submit", "--dry-run", "--json", *TWO_HOURS)).json()
    assert plan["partition"] == "ondemand" and set(plan["partition_limits"]) == {"spot"}
    # An hour is within spot's limit: placed there, as before.
    assert ok(d.cli("submit", "--dry-run", "--json", "--group", "vision", "--time", "1h", "--", "true")).json()[
        "partition"] == "spot"
    job = ok(d.cli("submit", "--json", *TWO_HOURS)).json()
    assert job["partition"] == "ondemand"
    assert limited.job_field(str(job["slurm_job_id"]), "Partition") == "ondemand"
    # The user's own partition is not moved: refused, naming the limit and what to do, nothing stored.
    for args in (("submit", "--dry-run", "--partition", "spot", *TWO_HOURS),
                 ("submit", "--partition", "spot", *TWO_HOURS)):
        r = d.cli(*args)
        assert r.code == 2 and "partition spot allows at most 1:00:00 (MaxTime), the job asks for 2:00:00" in r.err, r
        assert "--time 1h or less" in r.err, r.err
    assert [j["id"] for j in ok(d.cli("history", "--json")).json()] == [job["id"]]


def test_a_job_waiting_on_a_lowered_limit_says_so_in_status_and_show(
        limited: Any, broker_daemon: BrokerDaemon) -> None:
    d = broker_daemon
    # On-demand down: a job placed there is queued and waits (Slurm: PartitionDown).
    set_partition(limited, "ondemand", State="DOWN")
    job = ok(d.cli("submit", "--json", *TWO_HOURS)).json()
    assert job["partition"] == "ondemand", job
    down = d.wait_job(job["id"], lambda j: "(Slurm: PartitionDown)" in j["reason"], timeout=120)
    assert down["state"] == "pending" and down["reason"].startswith("waiting: partition ondemand is down"), down
    # Its limit lowered under it and the partition back up: Slurm will never start it there.
    set_partition(limited, "ondemand", MaxTime="60", State="UP")
    sid = str(job["slurm_job_id"])
    limited.wait_for(lambda: limited.job_field(sid, "Reason") == "PartitionTimeLimit", timeout=180)
    words = "waiting: the job's time limit (2:00:00) is above partition ondemand's MaxTime"
    shown = d.wait_job(job["id"], lambda j: j["reason"].startswith(words), timeout=60)
    assert shown["state"] == "pending" and shown["reason"].endswith(
        "it will not start there: cancel it and submit with a shorter --time (Slurm: PartitionTimeLimit)"), shown
    show = ok(d.cli("show", str(job["id"]))).out
    assert f"pending  — {words}" in show, show
    status = ok(d.cli("status")).out
    assert f"job {job['id']} pending: {words}" in status, status
    assert limited.job_field(sid, "JobState") == "PENDING"
