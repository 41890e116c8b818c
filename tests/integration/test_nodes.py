"""The node manager on the real dev cluster, and the aws provider behind `gbroker node` on moto.

The dev cluster's hooks are switched to `gbroker node resume|suspend|resume-fail`
(``devcluster hooks gbroker``) for the module and switched back afterwards, so
every power-up and power-down in these tests goes Slurm -> hook -> daemon ->
local provider -> the cluster's agent. The node manager's idle time (8 s) is
well under Slurm's own SuspendTime (20 s), and every release it makes is an
event, so the releases checked here are provably gbroker's.

The cluster is shared: jobs are pinned to the nodes a test uses, and the checks
"no job on a node at its release" and "release within idle time plus a tick
after the last job" read sacct for all users.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer
from sqlalchemy import select

from broker.db.engine import make_engine
from broker.db.models import Event
from broker.amount import cost_micros, parse_money
from broker.nodes.providers.local import LocalProvider
from broker_fixtures import DEVCLUSTER, SRC, BrokerDaemon, power_down_idle, public_dir

pytestmark = pytest.mark.slurm

IDLE_S = 8
TICK_S = 2
SLACK_S = 2
"""Whole-second times (events and sacct) and a busy machine: allowed beyond idle + one tick."""
SWEEP_GRACE_S = 20
PRICES = {"spot": "3.60", "ondemand": "7.20"}
GBROKER = str(Path(sys.executable).parent / "gbroker")


# --------------------------------------------------------------------------- helpers


def _toml(work: Path, state_dir: Path, extra: str = "") -> Path:
    path = work / "gbroker.toml"
    path.write_text(
        f'db_url = "sqlite:///{work}/gbroker.db"\n'
        f'socket = "{work}/gbroker.sock"\n'
        f"tick_seconds = 5\n"
        f"node_idle_seconds = {IDLE_S}\n"
        f"node_tick_seconds = {TICK_S}\n"
        f"node_sweep_grace_seconds = {SWEEP_GRACE_S}\n"
        f'node_journal = "{work}/node-journal.jsonl"\n'
        f'node_provider = "local"\n'
        f'[nodes.spot]\ncapacity = "spot"\nprice_per_node_hour = "{PRICES["spot"]}"\n'
        f'[nodes.ondemand]\ncapacity = "ondemand"\nprice_per_node_hour = "{PRICES["ondemand"]}"\n'
        f'[providers.local]\nstate_dir = "{state_dir}"\n' + extra
    )
    return path


def _daemon(work: Path, cluster: Any, config: Path, extra_env: dict[str, str] | None = None) -> BrokerDaemon:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env.update(cluster.env)
    env.update({"GBROKER_CONFIG": str(config), "PYTHONPATH": str(SRC)}, **(extra_env or {}))
    return BrokerDaemon(workdir=work, socket=str(work / "gbroker.sock"), db_url=f"sqlite:///{work}/gbroker.db",
                        env=env, log_path=work / "daemon.log")


def node_events(db_url: str) -> list[dict[str, Any]]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(Event.kind, Event.data_json).where(Event.kind.like("node_%"))
                                .order_by(Event.id)).all()
    finally:
        engine.dispose()
    out = []
    for kind, data in rows:
        d = json.loads(data)
        d["kind"] = kind
        d["at"] = datetime.fromisoformat(d["at"])
        out.append(d)
    return out


def sacct_on_node(cluster: Any, node: str, since: datetime) -> list[tuple[int, datetime, datetime | None]]:
    """(job id, start, end) of every job of any user that ran on ``node`` since ``since``."""
    env = dict(cluster.env, TZ="UTC", SLURM_TIME_FORMAT="standard")
    out = subprocess.run(
        ["sacct", "-a", "-X", "-n", "-P", "--duplicates", "-N", node, "-S",
         since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"), "-E", "now", "-o", "JobIDRaw,Start,End"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        jid, start, end = line.split("|")
        if start in ("Unknown", "None", ""):
            continue
        s = datetime.fromisoformat(start).replace(tzinfo=UTC)
        e = None if end in ("Unknown", "None", "") else datetime.fromisoformat(end).replace(tzinfo=UTC)
        rows.append((int(jid), s, e))
    return rows


def _node_story(d: BrokerDaemon, cluster: Any, node: str, since: datetime) -> str:
    """What Slurm, the provider and the daemon's records say about a node (for a failure message)."""
    from broker.db.node_models import NodeSession

    engine = make_engine(d.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(NodeSession.id, NodeSession.source, NodeSession.provider,
                                       NodeSession.instance_id, NodeSession.resumed_at, NodeSession.suspended_at,
                                       NodeSession.end_reason).where(NodeSession.node == node)).all()
    finally:
        engine.dispose()
    events = [(str(e["at"]), e["kind"], e.get("source", ""), e.get("reason", ""))
              for e in node_events(d.db_url) if e.get("node") == node and e["at"] >= since]
    instances = [(i.instance_id, i.state.value) for i in LocalProvider(str(cluster.state_dir)).instances()
                 if i.node_name == node]
    return (f"slurm: {cluster.node_state(node)}\nsessions: {rows[-3:]}\nevents: {events}\n"
            f"provider instances: {instances}")


def sbatch(cluster: Any, *args: str, user: str = "alice") -> int:
    p = cluster.as_user(user, ["sbatch", "--parsable", "-A", "vision", "--chdir=/tmp", "-o", "/dev/null", *args])
    return int(p.stdout.strip().split(";")[0])


def wait_for(pred: Any, timeout: float, what: str, daemon: BrokerDaemon | None = None, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                                 f"{daemon.log_tail(40) if daemon else ''}")
        time.sleep(interval)


def job_state(cluster: Any, job: int) -> str:
    return cluster.job_field(str(job), "JobState")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def node_daemon(slurm_cluster: Any) -> Iterator[BrokerDaemon]:
    """A daemon with the local provider; the cluster's hooks call `gbroker node ...` meanwhile."""
    work = public_dir("gbroker-nodes-")
    config = _toml(work, slurm_cluster.state_dir)
    d = _daemon(work, slurm_cluster, config)
    d.start()
    switch = subprocess.run([str(DEVCLUSTER), "hooks", "gbroker", GBROKER, "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert switch.returncode == 0, switch.stderr
    try:
        yield d
    finally:
        back = subprocess.run([str(DEVCLUSTER), "hooks", "agent"], capture_output=True, text=True, timeout=30)
        d.stop()
        assert back.returncode == 0 and '"agent"' in back.stdout, back.stdout + back.stderr
        hook = (slurm_cluster.state_dir / "hooks" / "resume").read_text()
        assert "cloud resume" in hook and "gbroker" not in hook.split("exec", 1)[1]
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- dev cluster


def test_burst_ends_every_node_released_in_idle_plus_a_tick_but_not_while_a_fitting_job_waits(
    node_daemon: BrokerDaemon, slurm_cluster: Any
) -> None:
    d = node_daemon
    # From powered-down nodes, so the burst's power-ups go through the hook and this
    # daemon bills their sessions (an earlier test of this lane may have left them up).
    power_down_idle(slurm_cluster, "spot")
    t0 = datetime.now(UTC).replace(microsecond=0)
    # The burst: three short jobs on spot3, one job filling spot4 a little longer, and a
    # two-node job that needs both, so it waits (Resources) while spot3 sits idle for longer
    # than gbroker's idle time. (Shorter than Slurm's own SuspendTime of 20 s: that global
    # timer does not look at pending jobs, which is why gbroker's release should be in charge.)
    short = [sbatch(slurm_cluster, "-p", "spot", "-w", "spot3", "--gres=gpu:1", "--wrap", "sleep 4")
             for _ in range(3)]
    long = sbatch(slurm_cluster, "-p", "spot", "-w", "spot4", "--exclusive", "--gres=gpu:4", "--wrap", "sleep 17")
    both = sbatch(slurm_cluster, "-p", "spot", "-N", "2", "-w", "spot3,spot4", "--gres=gpu:1", "--wrap", "sleep 3")
    try:
        wait_for(lambda: job_state(slurm_cluster, both) in ("COMPLETED", ""), 240, "the burst to finish", d)
        # Both nodes are released by gbroker (an event), then Slurm powers them down through the hook.
        released = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(
            {e["node"]: e for e in node_events(d.db_url)
             if e["kind"] == "node_release" and e["at"] >= t0 and e["node"] in ("spot3", "spot4")}),
            IDLE_S + 3 * TICK_S + 20, "gbroker to release spot3 and spot4", d)
        wait_for(lambda: all("POWERED_DOWN" in slurm_cluster.node_state(n) or "POWERING_DOWN" in
                             slurm_cluster.node_state(n) for n in ("spot3", "spot4")), 60,
                 "spot3 and spot4 to power down", d)
    finally:
        slurm_cluster.run(["scancel", *map(str, short + [long, both])], check=False)

    for node, ev in released.items():
        jobs = sacct_on_node(slurm_cluster, node, t0 - timedelta(minutes=5))
        # Never a job on the node when it was released (any user's).
        on = [j for j, s, e in jobs if s <= ev["at"] and (e is None or e > ev["at"])]
        assert on == [], f"{node} released at {ev['at']} with job(s) {on} on it"
        last_end = max(e for _, _, e in jobs if e is not None and e <= ev["at"])
        waited = (ev["at"] - last_end).total_seconds()
        assert IDLE_S - 1 <= waited <= IDLE_S + TICK_S + SLACK_S, (node, waited, ev, jobs)
        assert "no pending job fits it" in ev["reason"]
        assert waited < 20, "Slurm's own SuspendTime would have released it: not provably gbroker's"
    # spot3 idled longer than the idle time while the two-node job waited, and stayed up for it.
    spot3 = {j: (s, e) for j, s, e in sacct_on_node(slurm_cluster, "spot3", t0)}
    short_end = max(spot3[j][1] for j in short)
    both_start = spot3[both][0]
    gap = (both_start - short_end).total_seconds()
    assert gap >= IDLE_S + TICK_S, f"spot3 idled only {gap}s before the waiting job ran: the check proves nothing"
    evs = [e for e in node_events(d.db_url) if e["at"] >= t0 - timedelta(seconds=1)]
    # Between the burst's first job on spot3 and the waiting job's start. (A session left up by an
    # earlier test may end just after t0: Slurm powers the node down and up again for the burst.)
    burst_start = min(spot3[j][0] for j in short)
    early = [e for e in evs if e.get("node") == "spot3" and e["kind"] in ("node_release", "node_suspend")
             and burst_start <= e["at"] <= both_start]
    assert early == [], early
    for node in ("spot3", "spot4"):
        resumes = [e for e in evs if e["kind"] == "node_resume" and e["node"] == node]
        # At most one session per power-up (none when an earlier test left the node up). Its first
        # record may come from the hook or from the tick that saw Slurm mark the node powering up a
        # moment before the hook ran (a busy machine).
        assert len(resumes) <= 1 and all(r["source"] in ("hook", "observed") for r in resumes), (
            [(e["kind"], str(e["at"]), e.get("reason", "")) for e in evs if e.get("node") == node])
    # The suspend went through the hook and closed the billed session.
    wait_for(lambda: {e["node"] for e in node_events(d.db_url) if e["kind"] == "node_suspend"
                      and e["at"] >= t0} >= {"spot3", "spot4"}, 30, "node_suspend events", d)


def test_resume_twice_boots_once_and_an_unused_node_is_released(node_daemon: BrokerDaemon,
                                                                  slurm_cluster: Any) -> None:
    d = node_daemon
    node = "od1"
    agent_log = slurm_cluster.state_dir / "log" / "agent.out"
    offset = agent_log.stat().st_size
    t0 = datetime.now(UTC).replace(microsecond=0)
    wait_for(lambda: "POWERED_DOWN" in slurm_cluster.node_state(node), 60, f"{node} to be powered down", d)
    slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=POWER_UP"])  # Slurm calls ResumeProgram
    # The hook's own record: its resume, or its claim of a power-up a tick saw first (a busy machine).
    wait_for(lambda: any(e.get("node") == node and e["at"] >= t0 and (
                         (e["kind"] == "node_resume" and e.get("source") == "hook") or e["kind"] == "node_resume_claimed")
                         for e in node_events(d.db_url)), 30, "the resume hook", d)
    again = d.cli("node", "resume", node, "--json", user="root")  # Slurm may call it twice
    assert again.code == 0, again.err
    assert again.json()["repeated"] == [node] and again.json()["via"] == "daemon"
    wait_for(lambda: "IDLE" in slurm_cluster.node_state(node) and "POWER" not in slurm_cluster.node_state(node),
             60, f"{node} to register", d)
    wait_for(lambda: any(e["kind"] == "node_release" and e["node"] == node and e["at"] >= t0
                         for e in node_events(d.db_url)), IDLE_S + 4 * TICK_S + 10, f"{node} released", d)
    boots = [ln for ln in agent_log.read_text()[offset:].splitlines() if f"booted {node}:" in ln]
    assert len(boots) == 1, boots
    evs = [e for e in node_events(d.db_url) if e.get("node") == node and e["at"] >= t0]
    kinds = [e["kind"] for e in evs]
    assert kinds.count("node_resume") == 1 and kinds.count("node_resume_repeat") == 1, kinds
    resume = next(e for e in evs if e["kind"] == "node_resume")
    assert resume["capacity"] == "ondemand" and resume["price_micros"] == parse_money(PRICES["ondemand"])
    wait_for(lambda: "POWERED_DOWN" in slurm_cluster.node_state(node), 60, f"{node} powered down", d)


def test_a_node_whose_instance_vanishes_under_it_is_marked_down(node_daemon: BrokerDaemon,
                                                                  slurm_cluster: Any) -> None:
    d = node_daemon
    node = "od2"
    # Start from a powered-down node, so this power-up goes through the hook and the provider
    # (an earlier test may have left it up; the manager releases it after its idle time).
    wait_for(lambda: "POWERED_DOWN" in slurm_cluster.node_state(node), 180, f"{node} powered down first", d)
    t0 = datetime.now(UTC).replace(microsecond=0)
    job = sbatch(slurm_cluster, "-p", "ondemand", "-w", node, "--no-requeue", "--gres=gpu:1", "--wrap", "sleep 300")
    try:
        wait_for(lambda: job_state(slurm_cluster, str(job)) == "RUNNING", 120, "the job to run", d)
        # The cloud loses the instance; Slurm still believes the node is up (until SlurmdTimeout).
        LocalProvider(str(slurm_cluster.state_dir)).suspend([node])
        try:
            wait_for(lambda: "DOWN" in slurm_cluster.node_state(node), SWEEP_GRACE_S + 4 * TICK_S + 60,
                     f"{node} marked down by the sweep", d)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_node_story(d, slurm_cluster, node, t0)}") from None
        reason = slurm_cluster.run(["scontrol", "-o", "show", "node", node]).stdout
        assert "Reason=gbroker: no instance behind the node" in reason
        marks = [e for e in node_events(d.db_url) if e["kind"] == "node_marked_down" and e["at"] >= t0]
        assert [e["node"] for e in marks] == [node]
        wait_for(lambda: job_state(slurm_cluster, str(job)) in ("NODE_FAIL", "FAILED", ""), 60,
                 "the job to end with its node", d)
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=POWER_DOWN_FORCE"], check=False)
    wait_for(lambda: "POWERED_DOWN" in slurm_cluster.node_state(node), 60, f"{node} back in the pool", d)


def test_report_shows_idle_node_hours_and_cost_that_the_events_imply(node_daemon: BrokerDaemon) -> None:
    d = node_daemon
    until = datetime.now(UTC).replace(microsecond=0)
    r = d.cli("node", "report", "--until", until.isoformat(), "--json", user="alice")
    assert r.code == 0, r.err
    report = {row["partition"]: row for row in r.json()["partitions"]}
    # Re-derive from the event log alone: each session's stretches between resume,
    # busy/idle changes and suspend, cut at `until`.
    stretches: dict[int, list[tuple[datetime, str]]] = {}
    part: dict[int, str] = {}
    price: dict[int, int] = {}
    ends: dict[int, datetime] = {}
    for e in node_events(d.db_url):
        sid = e.get("session")
        if e["kind"] == "node_resume":
            stretches[sid] = [(e["at"], "idle")]
            part[sid], price[sid] = e["partition"], e["price_micros"]
        elif e["kind"] in ("node_busy", "node_idle") and sid in stretches:
            stretches[sid].append((e["at"], e["kind"][5:]))
        elif e["kind"] == "node_suspend" and sid in stretches:
            ends[sid] = e["at"]
    want: dict[str, dict[str, int]] = {}
    by_price: dict[tuple[str, int], list[int]] = {}
    for sid, marks in stretches.items():
        end = min(ends.get(sid, until), until)
        for (a, state), nxt in zip(marks, marks[1:] + [(end, "")], strict=True):
            secs = max(0, int((min(nxt[0], end) - a).total_seconds()))
            w = want.setdefault(part[sid], {"idle_s": 0, "busy_s": 0})
            w[f"{state}_s"] += secs
            acc = by_price.setdefault((part[sid], price[sid]), [0, 0])
            acc[0] += secs
            acc[1] += secs if state == "idle" else 0
    assert want, "no node sessions recorded"
    assert {"spot", "ondemand"} <= set(want)
    for p, w in want.items():
        row = report[p]
        assert (row["idle_s"], row["busy_s"]) == (w["idle_s"], w["busy_s"]), (p, row, w)
        idle_cost = sum(cost_micros(pr, acc[1]) for (pp, pr), acc in by_price.items() if pp == p)
        assert row["idle_cost_micros"] == idle_cost > 0
        assert row["idle_hours"] == f"{w['idle_s'] / 3600:.3f}"
    assert report["spot"]["busy_s"] > 0  # the burst ran there
    text = d.cli("node", "report", "--until", until.isoformat(), user="alice")
    assert text.code == 0 and "IDLE NODE-H" in text.out and "spot" in text.out
    listing = d.cli("node", "list", "--json", user="bob")
    assert listing.code == 0, listing.err
    rows = {r["node"]: r for r in listing.json()}
    assert {"spot1", "spot2", "spot3", "spot4", "od1", "od2"} <= set(rows)
    assert rows["spot3"]["capacity"] == "spot" and rows["od1"]["capacity"] == "ondemand"
    assert all(r["power"] in ("off", "booting", "on", "stopping") for r in rows.values())
    denied = d.cli("node", "suspend", "spot3", user="bob")
    assert denied.code != 0 and "admin" in denied.err


# --------------------------------------------------------------------------- aws on moto

REGION = "us-east-1"
AWS_CLUSTER = "gbroker-nodes-test"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}


@pytest.fixture
def aws_daemon(slurm_cluster: Any, moto_url: str) -> Iterator[tuple[BrokerDaemon, Any]]:
    """A daemon whose provider is aws on the moto server. It never releases (huge idle time)
    and ticks only when asked (`gbroker node tick`), so the test decides when the sweep runs."""
    req = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    work = public_dir("gbroker-aws-")
    config = _toml(work, slurm_cluster.state_dir).read_text()
    config = config.replace('node_provider = "local"', 'node_provider = "aws"')
    config = config.replace(f"node_idle_seconds = {IDLE_S}", "node_idle_seconds = 1000000")
    config = config.replace(f"node_tick_seconds = {TICK_S}", "node_tick_seconds = 3600")
    config = config.replace(f"node_sweep_grace_seconds = {SWEEP_GRACE_S}", "node_sweep_grace_seconds = 0")
    config += (f'[providers.aws]\nregion = "{REGION}"\ncluster_name = "{AWS_CLUSTER}"\n'
               f'ami = "ami-0a1b2c3d4e5f60718"\nendpoint_url = "{moto_url}"\nmax_attempts = 1\n'
               'instance_types = { spot = "g5.xlarge", ondemand = "g5.2xlarge" }\n')
    (work / "gbroker.toml").write_text(config)
    d = _daemon(work, slurm_cluster, work / "gbroker.toml", AWS_ENV)
    d.env.update(AWS_ENV)
    d.start()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    try:
        yield d, ec2
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)


def _instances(ec2: Any) -> list[dict[str, Any]]:
    out = []
    for res in ec2.describe_instances()["Reservations"]:
        out.extend(res["Instances"])
    return out


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def test_aws_nodes_resume_tagged_by_market_suspend_terminates_and_orphans_are_swept(aws_daemon: Any) -> None:
    d, ec2 = aws_daemon
    r = d.cli("node", "resume", "spot1,od1", "--json", user="root")
    assert r.code == 0, r.err + d.log_tail()
    assert r.json()["via"] == "daemon" and set(r.json()["resumed"]) == {"spot1", "od1"}
    again = d.cli("node", "resume", "spot1", "--json", user="root")
    assert again.code == 0 and again.json()["repeated"] == ["spot1"]
    live = [i for i in _instances(ec2) if i["State"]["Name"] in ("pending", "running")]
    by_node = {_tags(i)["gbroker:node"]: i for i in live}
    assert sorted(by_node) == ["od1", "spot1"] and len(live) == 2  # resumed twice, launched once
    for name, inst in by_node.items():
        tags = _tags(inst)
        assert tags["gbroker:cluster"] == AWS_CLUSTER and tags["gbroker:node"] == name
    assert by_node["spot1"].get("InstanceLifecycle") == "spot" and _tags(by_node["spot1"])["gbroker:capacity"] == "spot"
    assert "InstanceLifecycle" not in by_node["od1"] and _tags(by_node["od1"])["gbroker:capacity"] == "ondemand"
    assert by_node["spot1"]["InstanceType"] == "g5.xlarge" and by_node["od1"]["InstanceType"] == "g5.2xlarge"

    s = d.cli("node", "suspend", "spot1,od1", "--json", user="root")
    assert s.code == 0, s.err
    states = {_tags(i)["gbroker:node"]: i["State"]["Name"] for i in _instances(ec2)}
    assert set(states.values()) <= {"shutting-down", "terminated"}, states

    # Left behind by someone (a crashed resume, a hand launch): tagged as ours, but no node
    # Slurm holds up stands for it. Another cluster's instance with the same node tag stays.
    def launch(cluster: str, node: str) -> str:
        return str(ec2.run_instances(
            ImageId="ami-0a1b2c3d4e5f60718", InstanceType="t3.micro", MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "gbroker:cluster", "Value": cluster}, {"Key": "gbroker:node", "Value": node}]}],
        )["Instances"][0]["InstanceId"])

    stray, foreign = launch(AWS_CLUSTER, "ghost9"), launch("someone-else", "ghost9")
    t = d.cli("node", "tick", "--json", user="root")
    assert t.code == 0, t.err
    assert t.json()["terminated"] == [stray], t.json()
    state = {i["InstanceId"]: i["State"]["Name"] for i in _instances(ec2)}
    assert state[stray] in ("shutting-down", "terminated") and state[foreign] == "running"
    evs = [e for e in node_events(d.db_url) if e["kind"] == "node_orphan_terminated"]
    assert [(e["instance_id"], e["node"]) for e in evs] == [(stray, "ghost9")]
    assert "not up in Slurm" in evs[0]["reason"]
    again = d.cli("node", "tick", "--json", user="root")  # a second sweep plans nothing new
    assert again.code == 0 and again.json()["terminated"] == []
    # Billing: two sessions opened by the hook and closed by the suspend, at the partitions' prices.
    evs = node_events(d.db_url)
    resumes = {e["node"]: e for e in evs if e["kind"] == "node_resume"}
    assert resumes["spot1"]["provider"] == "aws" and resumes["spot1"]["capacity"] == "spot"
    assert {e["node"] for e in evs if e["kind"] == "node_suspend"} >= {"spot1", "od1"}


def test_aws_hooks_work_while_the_daemon_is_down_and_the_journal_bills_them(aws_daemon: Any) -> None:
    d, ec2 = aws_daemon
    d.stop()
    r = d.cli("node", "resume", "od2", "--json", user="root")
    assert r.code == 0, r.err
    assert r.json()["via"] == "journal"
    (inst,) = [i for i in _instances(ec2) if _tags(i).get("gbroker:node") == "od2"]
    journal = d.workdir / "node-journal.jsonl"
    assert json.loads(journal.read_text().splitlines()[0])["nodes"][0]["instance_id"] == inst["InstanceId"]
    d.start()
    # The next hook call (or tick) ingests the journal first, then suspends through the provider.
    s = d.cli("node", "suspend", "od2", "--json", user="root")
    assert s.code == 0 and s.json()["via"] == "daemon" and s.json()["closed"] == ["od2"], s.out + s.err
    evs = [e for e in node_events(d.db_url) if e.get("node") == "od2"]
    assert [e["kind"] for e in evs][:1] == ["node_resume"] and evs[0]["source"] == "journal"
    assert evs[0]["instance_id"] == inst["InstanceId"]
    assert any(e["kind"] == "node_suspend" for e in evs)
    assert not journal.exists()
    states = {i["InstanceId"]: i["State"]["Name"] for i in _instances(ec2)}
    assert states[inst["InstanceId"]] in ("shutting-down", "terminated")
