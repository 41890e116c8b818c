"""Node release and the ledger by each pool's billing, on the real dev cluster with a real daemon.

The settings use a pool catalog: ``spot`` bills in 120 s increments with a
120 s minimum (an "hour" short enough for a test), ``ondemand`` per second.
Every power-up goes Slurm -> hook -> daemon -> local provider -> the cluster's
agent (``devcluster hooks gbroker``, as in test_nodes.py), so the daemon bills
exact sessions. Slurm's own SuspendTime is raised for the module (and put back
after), so every power-down here is provably gbroker's.

Prices make a node-second a whole number of micro-units (4 GPUs x $0.90 per
GPU-hour = $3.60 per node-hour = 1000 per second on spot; 2000 on on-demand),
so the ledger can be checked to the micro-unit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from broker.db.engine import make_engine
from broker.db.node_models import NodeSession
from broker_fixtures import DEVCLUSTER, SRC, BrokerDaemon, power_down_idle, public_dir, user_dir
from test_nodes import _daemon, node_events, sacct_on_node, wait_for

pytestmark = pytest.mark.slurm

INCREMENT_S = 75
"""Long enough for two short jobs and an idle stretch inside one increment."""
IDLE_S = 5
TICK_S = 2
MARGIN_S = min(max(2 * TICK_S, 30), INCREMENT_S // 10)
"""How long before the increment ends the node is released (broker/nodes/policy.py)."""
SLACK_S = 3
"""Whole-second clocks and a busy 2-core machine, beyond one tick."""
PER_NODE_SECOND = {"spot": 1000, "ondemand": 2000}  # micro-units: 4 GPUs x $0.90 / $1.80 per GPU-hour
SUSPEND_TIME_S = 3600
"""Slurm's own idle timer while the module runs: far beyond anything gbroker does here."""
SEMESTER = "billing-term"
SUBMITTED: list[int] = []
"""gbroker jobs of this module: cancelled at its end, so none is left waiting on the cluster."""


def _toml(work: Any, state_dir: Any) -> Any:
    path = work / "gbroker.toml"
    path.write_text(
        f'db_url = "sqlite:///{work}/gbroker.db"\n'
        f'socket = "{work}/gbroker.sock"\n'
        f"tick_seconds = {TICK_S}\n"
        f"node_idle_seconds = {IDLE_S}\n"
        f"node_tick_seconds = {TICK_S}\n"
        "node_sweep_grace_seconds = 60\n"
        f'node_journal = "{work}/node-journal.jsonl"\n'
        'node_provider = "local"\n'
        '[pools.spot]\npartition = "spot"\ncapacity = "spot"\ngpu_type = "l4"\nprice_per_gpu_hour = "0.90"\n'
        f"billing_increment_seconds = {INCREMENT_S}\nbilling_minimum_seconds = {INCREMENT_S}\n"
        f"idle_seconds = {IDLE_S}\n"
        '[pools.ondemand]\npartition = "ondemand"\ncapacity = "ondemand"\ngpu_type = "a100"\n'
        f'price_per_gpu_hour = "1.80"\nbilling = "second"\nidle_seconds = {IDLE_S}\n'
        f'[providers.local]\nstate_dir = "{state_dir}"\n'
    )
    return path


def _gbroker_exe(work: Any) -> str:
    """The hooks' gbroker: this checkout's code (not whatever an installed entry point points at)."""
    exe = work / "gbroker"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={SRC} exec {sys.executable} -m broker "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def _devcluster_up(suspend_time: int | None) -> None:
    """`devcluster up` with Slurm's SuspendTime at ``suspend_time`` (None: as the environment has it, the
    cluster's usual); a changed slurm.conf restarts the controller, nodes and jobs keep running."""
    env = dict(os.environ)
    if suspend_time is not None:
        env["GBROKER_DEVCLUSTER_SUSPEND_TIME"] = str(suspend_time)
    p = subprocess.run([str(DEVCLUSTER), "up"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


@pytest.fixture(scope="module")
def billing_daemon(slurm_cluster: Any) -> Iterator[BrokerDaemon]:
    work = public_dir("gbroker-billing-")
    config = _toml(work, slurm_cluster.state_dir)
    _devcluster_up(SUSPEND_TIME_S)
    d = _daemon(work, slurm_cluster, config)
    d.workdir = user_dir(work / "jobs", "alice")
    d.start()
    switch = subprocess.run([str(DEVCLUSTER), "hooks", "gbroker", _gbroker_exe(work), "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert switch.returncode == 0, switch.stderr
    today = datetime.now(UTC).date()
    ok(d.cli("semester", "add", SEMESTER, "--start", str(today - timedelta(days=30)),
             "--end", str(today + timedelta(days=90)), user="root"))
    ok(d.cli("group", "add", "vision", "--member", "alice", "--member", "bob", user="root"))
    try:
        yield d
    finally:
        for job_id in SUBMITTED:
            d.cli("cancel", str(job_id), user="alice")
        back = subprocess.run([str(DEVCLUSTER), "hooks", "agent"], capture_output=True, text=True, timeout=30)
        d.stop()
        _devcluster_up(None)
        assert back.returncode == 0, back.stdout + back.stderr
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


def submit(d: BrokerDaemon, partition: str, seconds: int) -> int:
    """A gbroker job on ``partition`` using a whole node (4 GPUs), so its line is node time too."""
    r = ok(d.cli("submit", "--json", "--group", "vision", "--gpus", "4", "--time", "5m", "--partition", partition,
                 "--name", f"bill-{partition}", "--", "sleep", str(seconds), user="alice"))
    SUBMITTED.append(int(r.json()["id"]))
    return SUBMITTED[-1]


def finished(d: BrokerDaemon, job_id: int, timeout: float = 180) -> dict[str, Any]:
    return d.wait_job(job_id, lambda j: j["state"] in ("completed", "failed", "cancelled"), timeout=timeout)


def slurm_id(job: dict[str, Any]) -> int:
    return int(job["attempts"][-1]["slurm_job_id"])


def node_of(cluster: Any, sid: int) -> str:
    rows = cluster.sacct_attempts(str(sid), "JobID,State,NodeList")
    return rows[-1]["NodeList"]


def session_of(d: BrokerDaemon, node: str, since: datetime) -> Any:
    engine = make_engine(d.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(NodeSession).where(NodeSession.node == node,
                                                          NodeSession.resumed_at >= since - timedelta(seconds=2))
                                .order_by(NodeSession.id)).all()
    finally:
        engine.dispose()
    return rows[-1] if rows else None


def ledger_lines(d: BrokerDaemon) -> list[dict[str, Any]]:
    return ok(d.cli("budget", "ledger", "--format", "json", user="root")).json()


def events_of(d: BrokerDaemon, node: str, kind: str, since: datetime) -> list[dict[str, Any]]:
    return [e for e in node_events(d.db_url) if e["kind"] == kind and e.get("node") == node and e["at"] >= since]


def _story(d: BrokerDaemon, node: str, since: datetime) -> str:
    evs = [(str(e["at"]), e["kind"], e.get("reason", "")) for e in node_events(d.db_url)
           if e.get("node") == node and e["at"] >= since]
    return f"events of {node}: {evs}\n{d.log_tail(30)}"


# --------------------------------------------------------------------------- tests


def test_an_idle_node_of_an_incremental_pool_is_kept_for_its_paid_time_then_released_and_billed_once(
    billing_daemon: BrokerDaemon, slurm_cluster: Any
) -> None:
    d = billing_daemon
    power_down_idle(slurm_cluster, "spot")
    t0 = datetime.now(UTC).replace(microsecond=0)
    first = finished(d, submit(d, "spot", 6))
    sid_a = slurm_id(first)
    node = node_of(slurm_cluster, sid_a)
    sess = wait_for(lambda: session_of(d, node, t0), 30, f"a session for {node}", d)
    # Past its idle time, the node stays up: its increment is paid.
    end_a = max(e for _, _, e in sacct_on_node(slurm_cluster, node, t0) if e is not None)
    time.sleep(max(0.0, (end_a + timedelta(seconds=IDLE_S + 3 * TICK_S) - datetime.now(UTC)).total_seconds()))
    assert events_of(d, node, "node_release", t0) == [], _story(d, node, t0)
    kept = ok(d.cli("node", "list", "--json", user="root")).json()
    note = next(r["note"] for r in kept if r["node"] == node)
    assert "paid for" in note, kept
    # A new job goes to the idle, paid node, not to a powered-down one (Slurm's choice, checked here).
    second = finished(d, submit(d, "spot", 3))
    assert node_of(slurm_cluster, slurm_id(second)) == node
    others = [e for e in node_events(d.db_url) if e["kind"] == "node_resume" and e["at"] >= t0
              and e.get("partition") == "spot" and e["node"] != node]
    assert others == [], others
    # Released just before the increment ends, not at once.
    (release,) = wait_for(lambda: events_of(d, node, "node_release", t0), INCREMENT_S + 60,
                          f"{node} released", d)
    up_at_release = (release["at"] - sess.resumed_at).total_seconds()
    # Both times are stored in whole seconds: the difference can read 1 s short of the real one.
    assert INCREMENT_S - MARGIN_S - 1 <= up_at_release <= INCREMENT_S - MARGIN_S + TICK_S + SLACK_S, (
        up_at_release, _story(d, node, t0))
    assert "paid time ends in" in release["reason"]
    (suspend,) = wait_for(lambda: events_of(d, node, "node_suspend", t0), 60, f"{node} suspended", d)
    closed = session_of(d, node, t0)
    up_s = int((closed.suspended_at - closed.resumed_at).total_seconds())
    assert up_s < INCREMENT_S, f"the suspend landed after the paid increment: {up_s}s"
    # The ledger: idle lines + the busy stretch + one rounding line = exactly one increment of node time.
    lines = wait_for(lambda: (lambda ls: ls if any(ln["tag"] == "rounding" and ln["node"] == node for ln in ls)
                              else None)(ledger_lines(d)), 30, "the rounding line", d)
    mine = [ln for ln in lines if ln["node"] == node and ln["period_start"] >= closed.resumed_at.strftime(
        "%Y-%m-%dT%H:%M:%SZ")]
    idle = [ln for ln in mine if ln["tag"] == "idle"]
    (rounding,) = [ln for ln in mine if ln["tag"] == "rounding"]
    assert sum(ln["seconds"] for ln in idle) == closed.idle_s
    assert closed.idle_s + closed.busy_s == up_s
    assert rounding["seconds"] == INCREMENT_S - up_s
    assert closed.idle_s + closed.busy_s + rounding["seconds"] == INCREMENT_S
    per_s = PER_NODE_SECOND["spot"]
    assert sum(ln["amount_micros"] for ln in idle) + rounding["amount_micros"] == per_s * (
        closed.idle_s + rounding["seconds"])
    assert {(ln["pool"], ln["gpu_type"], ln["capacity"]) for ln in mine} == {("spot", "l4", "spot")}
    # The job lines: sacct's seconds x 4 GPUs at the pool's price, the same node-time as the busy stretch
    # to within the node tick (busy and idle are seen by the tick; sacct has the job's own times).
    jobs = [ln for ln in lines if ln["slurm_job_id"] in (sid_a, slurm_id(second))]
    assert {(ln["pool"], ln["gpu_type"], ln["capacity"], ln["gpus"]) for ln in jobs} == {("spot", "l4", "spot", 4)}
    job_s = sum(ln["seconds"] for ln in jobs)
    assert sum(ln["amount_micros"] for ln in jobs) == per_s * job_s
    assert abs(job_s - closed.busy_s) <= 2 * (TICK_S + SLACK_S), (job_s, closed.busy_s)
    print(f"spot {node}: up {up_s}s (busy {closed.busy_s}s, idle {closed.idle_s}s), released at "
          f"{up_at_release:.0f}s, rounding {rounding['seconds']}s, job lines {job_s}s; "
          f"node time billed {closed.idle_s + closed.busy_s + rounding['seconds']}s")


def test_a_node_of_a_per_second_pool_is_released_after_its_idle_time_and_charged_to_the_second(
    billing_daemon: BrokerDaemon, slurm_cluster: Any
) -> None:
    d = billing_daemon
    power_down_idle(slurm_cluster, "ondemand")
    t0 = datetime.now(UTC).replace(microsecond=0)
    job = finished(d, submit(d, "ondemand", 5))
    node = node_of(slurm_cluster, slurm_id(job))
    (release,) = wait_for(lambda: events_of(d, node, "node_release", t0), 60, f"{node} released", d)
    end = max(e for _, _, e in sacct_on_node(slurm_cluster, node, t0) if e is not None)
    waited = (release["at"] - end).total_seconds()
    assert IDLE_S - 1 <= waited <= IDLE_S + TICK_S + SLACK_S, (waited, _story(d, node, t0))
    wait_for(lambda: events_of(d, node, "node_suspend", t0), 60, f"{node} suspended", d)
    closed = session_of(d, node, t0)
    up_s = int((closed.suspended_at - closed.resumed_at).total_seconds())
    assert up_s < INCREMENT_S  # it did not wait for any paid time
    lines = wait_for(lambda: (lambda ls: ls if sum(ln["seconds"] for ln in ls if ln["node"] == node
                                                   and ln["tag"] == "idle"
                                                   and ln["period_start"] >= closed.resumed_at.strftime(
                                                       "%Y-%m-%dT%H:%M:%SZ")) == closed.idle_s else None)(
        ledger_lines(d)), 30, "the idle lines", d)
    mine = [ln for ln in lines if ln["node"] == node and ln["period_start"] >= closed.resumed_at.strftime(
        "%Y-%m-%dT%H:%M:%SZ")]
    assert [ln for ln in mine if ln["tag"] == "rounding"] == []  # per second: nothing beyond the real length
    assert sum(ln["amount_micros"] for ln in mine) == PER_NODE_SECOND["ondemand"] * closed.idle_s
    assert {(ln["pool"], ln["capacity"]) for ln in mine} == {("ondemand", "ondemand")}


def test_the_report_by_pool_and_by_gpu_adds_up_to_the_total(billing_daemon: BrokerDaemon) -> None:
    d = billing_daemon
    reports = {by: ok(d.cli("report", "--semester", SEMESTER, "--by", by, "--json", user="root")).json()
               for by in ("group", "pool", "gpu")}
    totals = {by: r["total"]["spend_micros"] for by, r in reports.items()}
    assert len(set(totals.values())) == 1 and totals["pool"] > 0, totals
    for by, r in reports.items():
        assert sum(row["spend_micros"] for row in r["rows"]) == r["total"]["spend_micros"], by
    pools = {row["key"] for row in reports["pool"]["rows"]}
    assert {"spot", "ondemand", "(idle nodes)", "(billing rounding)"} <= pools, pools
    assert "l4" in {row["key"] for row in reports["gpu"]["rows"]}
    text = ok(d.cli("report", "--semester", SEMESTER, "--by", "pool", user="root")).out
    assert "(billing rounding)" in text and "POOL" in text
