"""The node manager with a fake Slurm and a fake provider: sessions, release, hooks, journal, sweep.

Real parts: SQLite through the real models and migrations, the real release
decision, the real journal file. Fakes: Slurm (node and job lists, the runner
for squeue/scontrol) and the cloud (an in-memory provider).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from broker.clock import FakeClock
from broker.config import NodePartition, Settings
from broker.db.models import Event
from broker.db.node_models import NodeSession, NodeUsage
from broker.amount import cost_micros
from broker.nodes.providers import hooks
from broker.nodes.providers.base import (
    Capacity,
    Instance,
    InstanceState,
    NodeRequest,
    Provider,
    ProviderError,
    ResumeIncomplete,
)
from broker.money import nodecost
from broker.wiring import build_services
from broker.nodes.slurm import gpus_per_node, parse_pending
from broker.nodes.manager import NodeManager
from broker.slurm import parse
from broker.slurm.backend import Backend, NodeInfo, SlurmJob
from broker.slurm.runner import CallCounter, CompletedRun
from broker.slurm.statemap import job_state, parse_node_state

T0 = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
PRICE = "3.60"  # per node-hour: 1000 micro-units a second, easy to check


# --------------------------------------------------------------------------- fakes


class FakeRunner:
    def __init__(self) -> None:
        self.counter = CallCounter()
        self.calls: list[list[str]] = []
        self.pending_out = ""

    def run(self, argv: list[str], *, timeout_s: float | None = None, env: Any = None, user: str | None = None,
            input: str | None = None) -> CompletedRun:
        self.calls.append(list(argv))
        # Canned output is written with the bare separators; squeue would use the ones asked for.
        out = parse.separators_of(argv, env).respell(self.pending_out) if argv[0] == "squeue" else ""
        return CompletedRun(list(argv), out, "", 0, 0.0)


class FakeSlurm(Backend):
    name = "fake"

    def __init__(self) -> None:
        self.runner = FakeRunner()
        self.node_states: dict[str, str] = {}
        self.partitions: dict[str, list[str]] = {}
        self.running: dict[int, tuple[str, str]] = {}  # job id -> (node, user)
        self.powered_down: list[list[str]] = []
        self.powered_up: list[list[str]] = []
        self.requeued: list[int] = []

    def add(self, name: str, state: str, partitions: Iterable[str] = ("spot",)) -> None:
        self.node_states[name] = state
        self.partitions[name] = list(partitions)

    def nodes(self) -> list[NodeInfo]:
        out = []
        for name, raw in self.node_states.items():
            p = parse_node_state(raw)
            out.append(NodeInfo(name, raw, p.state, self.partitions[name], ["spot"], 4, "", p.flags))
        return out

    def jobs(self, job_ids: Any = None, name_prefix: Any = None) -> list[SlurmJob]:
        return [
            SlurmJob(jid, "j", user, "vision", "spot", "RUNNING", job_state("RUNNING"), "", [node], 0, "", None, None,
                     None)
            for jid, (node, user) in self.running.items()
        ]

    def power_down(self, names: Iterable[str], force: bool = False) -> None:
        assert not force, "the node manager never forces a power down"
        names = list(names)
        self.powered_down.append(names)
        for n in names:
            self.node_states[n] = "IDLE+CLOUD+POWERING_DOWN"

    def power_up(self, names: Iterable[str]) -> None:
        self.powered_up.append(list(names))

    def requeue(self, job_ids: Iterable[int]) -> None:
        self.requeued += list(job_ids)

    def submit(self, req: Any) -> int: raise NotImplementedError
    def history(self, job_ids: Any = None, since: Any = None) -> list[Any]: return []
    def cancel(self, job_ids: Any) -> None: pass
    def hold(self, job_ids: Any) -> None: pass
    def release(self, job_ids: Any) -> None: pass
    def start_now(self, job_ids: Any) -> None: pass
    def update(self, job_id: int, **fields: object) -> None: pass
    def ping(self) -> bool: return True

    def scontrol_states(self) -> list[list[str]]:
        return [c for c in self.runner.calls if c[:2] == ["scontrol", "update"]]


class FakeCloud(Provider):
    name = "fake"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.items: dict[str, Instance] = {}
        self.launches: list[NodeRequest] = []
        self.interrupted: list[str] = []
        self.fail: dict[str, str] = {}
        self.terminated: list[str] = []

    def resume(self, nodes: list[NodeRequest]) -> list[Instance]:
        out, failures = [], {}
        for req in nodes:
            alive = [i for i in self.items.values() if i.node_name == req.name and i.alive]
            if alive:
                out.append(alive[0])
                continue
            if req.name in self.fail:
                failures[req.name] = ProviderError(self.fail[req.name], hint="try later")
                continue
            self.launches.append(req)
            inst = Instance(f"i-{len(self.launches)}", req.name, req.capacity, InstanceState.PENDING, self.clock.now())
            self.items[inst.instance_id] = inst
            out.append(inst)
        if failures:
            raise ResumeIncomplete(out, failures)
        return out

    def suspend(self, names: list[str]) -> None:
        for iid, i in list(self.items.items()):
            if i.node_name in names:
                self.items[iid] = Instance(iid, i.node_name, i.capacity, InstanceState.TERMINATED, i.launched_at)

    def terminate(self, instance_ids: list[str]) -> None:
        self.terminated += instance_ids
        for iid in instance_ids:
            i = self.items[iid]
            self.items[iid] = Instance(iid, i.node_name, i.capacity, InstanceState.TERMINATED, i.launched_at)

    def instances(self) -> list[Instance]:
        return list(self.items.values())

    def interruptions(self) -> list[str]:
        return list(self.interrupted)

    def orphan(self, node: str, age_s: float) -> str:
        iid = f"i-orphan-{len(self.items)}"
        self.items[iid] = Instance(iid, node, Capacity.SPOT, InstanceState.RUNNING,
                                   self.clock.now() - timedelta(seconds=age_s))
        return iid


@pytest.fixture
def env(tmp_path: Path) -> Any:
    clock = FakeClock(T0)
    slurm = FakeSlurm()
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'g.db'}", socket=str(tmp_path / "none.sock"), node_idle_seconds=60,
        node_tick_seconds=10, node_provider="fake", node_sweep_grace_seconds=300,
        node_journal=str(tmp_path / "journal.jsonl"),
        node_partitions=(NodePartition("spot", price_per_node_hour=PRICE, capacity="spot"),
                         NodePartition("ondemand", idle_seconds=600, price_per_node_hour="7.20")),
    )  # fmt: skip
    svc = build_services(settings, backend=slurm, clock=clock, policy=object())
    svc.migrate()
    cloud = FakeCloud(clock)
    m = NodeManager(svc)
    m._provider = cloud

    class Env:
        pass

    e = Env()
    e.svc, e.clock, e.slurm, e.cloud, e.m = svc, clock, slurm, cloud, m  # type: ignore[attr-defined]
    return e


def events(svc: Any, kind: str | None = None) -> list[dict[str, Any]]:
    with svc.sessions() as s:
        q = select(Event).where(Event.kind.like("node_%")).order_by(Event.id)
        rows = [(e.kind, json.loads(e.data_json), e.message) for e in s.execute(q).scalars()]
    return [dict(d, kind=k, message=msg) for k, d, msg in rows if kind is None or k == kind]


def sessions(svc: Any) -> list[NodeSession]:
    with svc.sessions() as s:
        rows = list(s.execute(select(NodeSession).order_by(NodeSession.id)).scalars())
        s.expunge_all()
        return rows


def step(e: Any, seconds: float) -> Any:
    e.clock.advance(seconds)
    return e.m.tick()


# --------------------------------------------------------------------------- release


def test_idle_node_is_released_after_its_idle_time_and_not_before(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD")
    env.m.tick()  # first sight: an observed session opens, idle from now
    assert step(env, 50).released == []
    assert step(env, 10).released == ["spot1"]
    assert env.slurm.powered_down == [["spot1"]]
    rel = events(env.svc, "node_release")
    assert len(rel) == 1 and rel[0]["node"] == "spot1" and "idle 60s >= 60s" in rel[0]["reason"]
    # Slurm now shows it powering down: the tick closes the observed session and releases nothing again.
    assert step(env, 10).released == []
    (sess,) = sessions(env.svc)
    assert sess.suspended_at == T0 + timedelta(seconds=70) and sess.idle_s == 70 and sess.busy_s == 0


def test_a_node_with_a_job_is_never_released(env: Any) -> None:
    env.slurm.add("spot1", "MIXED+CLOUD")
    env.slurm.running[41] = ("spot1", "bob")
    for _ in range(30):
        assert step(env, 60).released == []
    assert env.slurm.powered_down == []
    (row,) = env.m.status()
    assert row["users"] == ["bob"] and row["jobs"] == [41]


def test_a_waiting_job_that_fits_keeps_the_node(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD")
    fs, rs = "\x1f", "\x1e"
    env.slurm.runner.pending_out = fs.join(["77", "spot", "Resources", "spot1", "1", "gres:gpu:2", "(null)"]) + rs + "\n"
    env.m.tick()
    assert step(env, 600).released == []
    assert "pending job 77" in env.m.last.kept["spot1"]
    env.slurm.runner.pending_out = ""
    assert step(env, 10).released == ["spot1"]


def test_idle_time_restarts_after_a_busy_stretch(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD")
    env.m.tick()
    step(env, 50)
    env.slurm.running[5] = ("spot1", "alice")
    env.slurm.node_states["spot1"] = "ALLOCATED+CLOUD"
    step(env, 100)
    del env.slurm.running[5]
    env.slurm.node_states["spot1"] = "IDLE+CLOUD"
    assert step(env, 10).released == []  # idle again since now
    assert step(env, 50).released == []
    assert step(env, 10).released == ["spot1"]


def test_warm_minimum_is_kept_and_powered_up(env: Any) -> None:
    env.svc.settings = env.m.settings = Settings(
        **{**env.svc.settings.__dict__, "node_partitions": (NodePartition("spot", warm_min=1, price_per_node_hour=PRICE),)})
    env.slurm.add("spot1", "IDLE+CLOUD+POWERED_DOWN")
    env.slurm.add("spot2", "IDLE+CLOUD+POWERED_DOWN")
    assert env.m.tick().powered_up == ["spot1"]
    env.slurm.node_states["spot1"] = "IDLE+CLOUD"
    step(env, 10)
    assert step(env, 3600).released == [] and env.m.last.kept["spot1"].startswith("warm minimum")
    assert env.slurm.powered_up == [["spot1"]]


# --------------------------------------------------------------------------- hooks and billing


def test_resume_twice_boots_once_and_bills_busy_and_idle_exactly(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD+POWERED_DOWN")
    first = env.m.resume(["spot1"], "k1aaaaaaaa")
    env.clock.advance(2)
    second = env.m.resume(["spot1"], "k2bbbbbbbb")
    assert len(env.cloud.launches) == 1
    assert first["resumed"] == second["resumed"] == {"spot1": "i-1"}
    assert second["repeated"] == ["spot1"]
    assert env.cloud.launches[0].generation == "k1aaaaaaaa:spot1"
    assert env.cloud.launches[0].capacity is Capacity.SPOT and env.cloud.launches[0].partition == "spot"
    # Booted; a job runs from +10 s to +70 s; Slurm suspends it at +100 s.
    env.slurm.node_states["spot1"] = "ALLOCATED+CLOUD"
    env.slurm.running[9] = ("spot1", "alice")
    step(env, 8)  # +10
    del env.slurm.running[9]
    env.slurm.node_states["spot1"] = "IDLE+CLOUD"
    step(env, 60)  # +70
    env.clock.advance(30)  # +100
    env.m.suspend(["spot1"], "k3cccccccc")
    (sess,) = sessions(env.svc)
    assert (sess.source, sess.provider, sess.instance_id) == ("hook", "fake", "i-1")
    assert (sess.busy_s, sess.idle_s) == (60, 40)
    assert sess.cost_micros == cost_micros(3_600_000, 100) == 100_000
    assert sess.idle_cost_micros == 40_000 and sess.users == "alice"
    assert env.cloud.items["i-1"].state is InstanceState.TERMINATED
    kinds = [e["kind"] for e in events(env.svc)]
    assert kinds == ["node_resume", "node_resume_repeat", "node_busy", "node_idle", "node_suspend"]
    with env.svc.sessions() as s:
        (row,) = nodecost.node_cost(s, None, env.clock.now())
    assert (row.node_s, row.busy_s, row.idle_s, row.idle_cost_micros, row.cost_micros) == (100, 60, 40, 40_000, 100_000)
    # A window cuts the stretches: +50 .. +90 is 20 s busy and 20 s idle.
    with env.svc.sessions() as s:
        (row,) = nodecost.node_cost(s, T0 + timedelta(seconds=50), T0 + timedelta(seconds=90))
    assert (row.busy_s, row.idle_s, row.idle_cost_micros) == (20, 20, 20_000)


def test_a_hook_arriving_after_the_tick_saw_the_power_up_takes_the_session_over(env: Any) -> None:
    """Busy machine: Slurm marks the node powering up, a tick sees it, then the hook runs."""
    env.slurm.add("spot1", "IDLE+CLOUD+POWERING_UP")
    step(env, 1)
    (sess,) = sessions(env.svc)
    assert (sess.source, sess.provider) == ("observed", "")
    out = env.m.resume(["spot1"], "khookaaaaa")
    assert out["repeated"] == [] and out["resumed"] == {"spot1": "i-1"}
    again = env.m.resume(["spot1"], "khookbbbbb")  # Slurm may call it twice: that one is a repeat
    assert again["repeated"] == ["spot1"] and len(env.cloud.launches) == 1
    (sess,) = sessions(env.svc)
    assert (sess.source, sess.provider, sess.instance_id) == ("hook", "fake", "i-1")
    assert sess.resumed_at == T0 + timedelta(seconds=1)  # billed from when it was first seen
    kinds = [e["kind"] for e in events(env.svc)]
    assert kinds.count("node_resume") == 1 and kinds.count("node_resume_repeat") == 1
    assert "node_resume_claimed" in kinds
    # Ours now: when the instance vanishes under the up node, the sweep marks it down.
    env.slurm.node_states["spot1"] = "IDLE+CLOUD"
    env.cloud.items.clear()
    report = step(env, 301)
    assert report.marked_down == ["spot1"]


def test_a_failed_resume_stops_billing_and_marks_the_node_down(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD+POWERED_DOWN")
    env.slurm.add("spot2", "IDLE+CLOUD+POWERED_DOWN")
    env.cloud.fail["spot2"] = "InsufficientInstanceCapacity"
    out = env.m.resume(["spot1", "spot2"], "kfailfail1")
    assert out["failed"] == {"spot2": "InsufficientInstanceCapacity"}
    assert [c for c in env.slurm.scontrol_states() if "State=DOWN" in c] == [
        ["scontrol", "update", "NodeName=spot2", "State=DOWN", "Reason=gbroker: resume failed"]]
    by_node = {x.node: x for x in sessions(env.svc)}
    assert by_node["spot1"].suspended_at is None
    assert by_node["spot2"].suspended_at is not None and by_node["spot2"].cost_micros == 0
    assert [e["node"] for e in events(env.svc, "node_resume_failed")] == ["spot2"]


def test_resume_fail_hook_terminates_and_closes(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD+POWERING_UP")
    env.m.resume(["spot1"], "kresfail01")
    env.clock.advance(90)
    env.m.resume_failed(["spot1"], "kresfail02")
    (sess,) = sessions(env.svc)
    assert sess.end_reason == "resume failed (ResumeTimeout)" and sess.idle_s == 90
    assert env.cloud.items["i-1"].state is InstanceState.TERMINATED


# --------------------------------------------------------------------------- journal


def test_journal_is_ingested_once_with_exact_times(env: Any) -> None:
    path = env.svc.settings.node_journal
    node = {"name": "spot3", "partition": "spot", "capacity": "spot", "gpus": 4, "instance_id": "i-9", "error": None}
    r1 = hooks.journal_record("resume", T0 - timedelta(seconds=300), [node])
    r2 = hooks.journal_record("suspend", T0 - timedelta(seconds=100), [{"name": "spot3"}])
    hooks.append_journal(path, r1)
    hooks.append_journal(path, r2)
    assert env.m.ingest_journal() == 2
    assert not Path(path).exists()
    (sess,) = sessions(env.svc)
    assert (sess.source, sess.instance_id) == ("journal", "i-9")
    assert sess.resumed_at == T0 - timedelta(seconds=300) and sess.suspended_at == T0 - timedelta(seconds=100)
    assert sess.idle_s == 200 and sess.idle_cost_micros == 200_000
    # The same lines again (a crash after the commit, before the file was removed): nothing changes.
    hooks.append_journal(path, r1)
    hooks.append_journal(path, r2)
    Path(path).rename(path + hooks.INGESTING_SUFFIX)
    hooks.append_journal(path, r1)  # and one more copy in a fresh journal
    assert env.m.ingest_journal() == 0
    assert env.m.ingest_journal() == 0
    assert len(sessions(env.svc)) == 1
    assert len(events(env.svc, "node_resume")) == 1 and len(events(env.svc, "node_suspend")) == 1


def test_a_journal_resume_backdates_a_session_the_tick_opened(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD")
    env.m.tick()  # observed at T0
    node = {"name": "spot1", "partition": "spot", "capacity": "spot", "gpus": 4, "instance_id": "i-7", "error": None}
    hooks.append_journal(env.svc.settings.node_journal,
                         hooks.journal_record("resume", T0 - timedelta(seconds=30), [node]))
    step(env, 10)
    (sess,) = sessions(env.svc)
    assert sess.resumed_at == T0 - timedelta(seconds=30) and sess.source == "journal" and sess.instance_id == "i-7"
    assert sess.provider == "fake"  # the provider answers for it now (the sweep judges it)
    with env.svc.sessions() as s:
        first = s.execute(select(NodeUsage).order_by(NodeUsage.id)).scalars().first()
        assert first is not None and first.started_at == T0 - timedelta(seconds=30)


def test_a_journal_resume_later_than_the_tick_still_makes_the_session_the_providers(env: Any) -> None:
    """The hook could not reach the daemon and journaled; a tick had seen the node first."""
    env.slurm.add("spot1", "IDLE+CLOUD")
    env.m.tick()  # observed at T0
    node = {"name": "spot1", "partition": "spot", "capacity": "spot", "gpus": 4, "instance_id": "i-8", "error": None}
    hooks.append_journal(env.svc.settings.node_journal,
                         hooks.journal_record("resume", T0 + timedelta(seconds=5), [node]))
    step(env, 10)
    (sess,) = sessions(env.svc)
    assert (sess.resumed_at, sess.source, sess.provider, sess.instance_id) == (T0, "journal", "fake", "i-8")
    # No instance behind it at the provider: the sweep marks it down after the grace.
    report = step(env, 300)
    assert report.marked_down == ["spot1"]


def test_bad_journal_lines_are_kept_aside(env: Any, tmp_path: Path) -> None:
    path = Path(env.svc.settings.node_journal)
    path.write_text('{"broken": \nnot json\n')
    assert env.m.ingest_journal() == 0
    assert "not json" in path.with_name(path.name + ".bad").read_text()


def test_cli_hook_with_the_daemon_down_calls_the_provider_and_journals(env: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`gbroker node resume|suspend` with no daemon: the local provider's spool gets the requests,
    the journal gets the events, and the daemon's next tick bills them."""
    from broker.cli.main import cli
    from broker.nodes import power

    state = tmp_path / "devcluster"
    (state / "cloud").mkdir(parents=True)
    conf = tmp_path / "g.toml"
    journal = tmp_path / "hook-journal.jsonl"
    conf.write_text(f'node_provider = "local"\nnode_journal = "{journal}"\n'
                    f'[providers.local]\nstate_dir = "{state}"\n')
    monkeypatch.setattr(power, "read_facts",
                        lambda backend, names, warn: {n: hooks.NodeFacts(("spot", "urgent"), 4) for n in names})
    runner = CliRunner()
    r = runner.invoke(cli, ["--socket", str(tmp_path / "no.sock"), "--config", str(conf), "node", "resume", "spot[1-2]"])
    assert r.exit_code == 0, r.output
    assert "spot1: local-spot1-" in r.output and "(journal)" in r.output
    spool = sorted(p.name.split(".", 1)[1] for p in (state / "cloud" / "requests").iterdir())
    assert spool == ["resume.spot1", "resume.spot2"]
    r = runner.invoke(cli, ["--socket", str(tmp_path / "no.sock"), "--config", str(conf), "node", "suspend", "spot1"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x["action"] for x in lines] == ["resume", "suspend"]
    assert lines[0]["nodes"][0]["partition"] == "spot" and lines[0]["nodes"][0]["capacity"] == "spot"
    env.svc.settings = env.m.settings = Settings(**{**env.svc.settings.__dict__, "node_journal": str(journal)})
    assert env.m.ingest_journal() == 3
    by_node = {x.node: x for x in sessions(env.svc)}
    assert by_node["spot1"].suspended_at is not None and by_node["spot2"].suspended_at is None


def test_unattended_resume_journals_each_outcome_and_marks_the_failed_down(env: Any) -> None:
    """The steps a hook takes with the daemon down are the daemon's own (broker.nodes.power)."""
    from broker.nodes import power

    env.slurm.add("spot1", "IDLE+CLOUD+POWERED_DOWN")
    env.slurm.add("spot2", "IDLE+CLOUD+POWERED_DOWN")
    env.cloud.fail["spot2"] = "no spot capacity"
    warned: list[Any] = []
    out = power.resume_unattended(env.svc.settings, env.cloud, env.slurm, ["spot1", "spot2"], "kunattended", T0,
                                  facts_warn=warned.append, down_warn=lambda names, exc: warned.append(names))
    assert out == {"resumed": {"spot1": "i-1"}, "failed": {"spot2": "no spot capacity"}} and warned == []
    assert env.slurm.scontrol_states() == [
        ["scontrol", "update", "NodeName=spot2", "State=DOWN", "Reason=gbroker: resume failed"]]
    (rec,) = [json.loads(x) for x in Path(env.svc.settings.node_journal).read_text().splitlines()]
    assert rec["id"] == "kunattended" and rec["action"] == "resume"
    assert rec["nodes"] == [
        {"name": "spot1", "partition": "spot", "capacity": "spot", "gpus": 4, "instance_id": "i-1", "error": None},
        {"name": "spot2", "partition": "spot", "capacity": "spot", "gpus": 4, "instance_id": None,
         "error": "no spot capacity"},
    ]
    assert env.m.ingest_journal() == 2  # spot1's session, spot2's failure
    assert [x.node for x in sessions(env.svc)] == ["spot1"]


def test_power_steps_report_what_slurm_refused(env: Any) -> None:
    from broker.errors import SlurmError
    from broker.nodes import power
    from broker.nodes.slurm import NodeSlurm

    class Refusing(FakeSlurm):
        def nodes(self) -> list[NodeInfo]:
            raise SlurmError("sinfo: no answer", argv=["sinfo"])

    class RefusingRunner(FakeRunner):
        def run(self, argv: list[str], **kw: Any) -> CompletedRun:
            raise SlurmError("scontrol: no", argv=argv)

    warned: list[Any] = []
    assert power.read_facts(Refusing(), ["spot1"], warned.append) == {}
    assert [str(w) for w in warned] == ["sinfo: no answer"]
    slurm = FakeSlurm()
    slurm.runner = RefusingRunner()
    power.fail_nodes(NodeSlurm(slurm), ["spot1", "spot2"], lambda names, exc: warned.append((names, exc.message)))
    assert warned[1] == (["spot1", "spot2"], "scontrol: no")
    env.cloud.fail["spot3"] = "quota"
    assert power.launch(env.cloud, [NodeRequest("spot3", "spot", Capacity.SPOT)]) == ([], {"spot3": "quota"})


# --------------------------------------------------------------------------- provider side


def test_spot_interruption_drains_requeues_and_powers_down_once(env: Any) -> None:
    env.slurm.add("spot1", "MIXED+CLOUD")
    env.slurm.running[12] = ("spot1", "alice")
    env.m.resume(["spot1"], "kinterrup1")
    env.cloud.interrupted = ["spot1"]
    assert step(env, 10).interrupted == ["spot1"]
    assert ["scontrol", "update", "NodeName=spot1", "State=DRAIN", "Reason=gbroker: spot interruption"] in \
        env.slurm.scontrol_states()
    assert env.slurm.requeued == [12] and env.slurm.powered_down == [["spot1"]]
    env.slurm.node_states["spot1"] = "MIXED+CLOUD"  # still finishing
    assert step(env, 10).interrupted == []
    assert env.slurm.requeued == [12]
    assert len(events(env.svc, "node_interrupted")) == 1


def test_sweep_terminates_orphans_after_the_grace_and_marks_instanceless_nodes_down(env: Any) -> None:
    env.slurm.add("spot1", "IDLE+CLOUD+POWERED_DOWN")
    env.slurm.add("spot2", "ALLOCATED+CLOUD")
    env.slurm.add("spot3", "ALLOCATED+CLOUD")
    env.slurm.running[1] = ("spot2", "bob")
    env.slurm.running[2] = ("spot3", "carol")
    young = env.cloud.orphan("spot1", age_s=100)
    old = env.cloud.orphan("spot1", age_s=400)
    untagged = env.cloud.orphan("", age_s=400)
    env.m.resume(["spot2"], "ksweep0001")  # resumed by us; its instance will vanish
    env.cloud.items = {k: v for k, v in env.cloud.items.items() if v.node_name != "spot2"}
    report = step(env, 10)
    assert sorted(report.terminated) == sorted([old, untagged])
    assert young not in env.cloud.terminated
    assert report.marked_down == []  # spot2 is younger than the grace; spot3 was never ours
    report = step(env, 300)
    assert report.marked_down == ["spot2"]
    assert ["scontrol", "update", "NodeName=spot2", "State=DOWN", "Reason=gbroker: no instance behind the node"] \
        in env.slurm.scontrol_states()
    assert young in report.terminated
    kinds = [e["kind"] for e in events(env.svc)]
    assert kinds.count("node_orphan_terminated") == 3 and kinds.count("node_marked_down") == 1
    spot2 = [x for x in sessions(env.svc) if x.node == "spot2" and x.provider == "fake"]
    assert spot2 and spot2[0].suspended_at is not None


def test_a_silent_node_whose_instance_vanished_is_marked_down_but_not_one_slurm_holds_down(env: Any) -> None:
    """Slurm flags a node whose slurmd vanished NOT_RESPONDING long before it sets it DOWN."""
    for name in ("spot1", "spot2"):
        env.slurm.add(name, "ALLOCATED+CLOUD")
        env.m.resume([name], f"ksilent{name}")
    env.cloud.items.clear()
    env.slurm.node_states["spot1"] = "IDLE+CLOUD+COMPLETING+NOT_RESPONDING"
    env.slurm.node_states["spot2"] = "DOWN+CLOUD+NOT_RESPONDING"  # Slurm's own verdict already
    report = step(env, 301)
    assert report.marked_down == ["spot1"]


# --------------------------------------------------------------------------- parsing


def test_pending_job_needs_are_read_from_squeue() -> None:
    fs, rs = "\x1f", "\x1e"
    out = (fs.join(["29", "spot,ondemand", "JobHeldUser", "spot3", "1", "gres:gpu:2", "spot"]) + rs + "\n"
           + fs.join(["30", "spot", "Resources", "", "2", "gres/gpu:1", "(null)"]) + rs + "\n"
           + fs.join(["31_[1-3]", "spot", "None", "", "1", "N/A", ""]) + rs + "\n"
           + fs.join(["32", "spot", "ReqNodeNotAvail, UnavailableNodes:spot[3-4]", "spot[3-4]", "2", "N/A", ""])
           + rs + "\n")
    jobs = parse_pending(out)
    assert [(j.job_id, j.partitions, j.required_nodes, j.nodes, j.gpus_per_node, j.constraint, j.reason)
            for j in jobs] == [
        (29, ("spot", "ondemand"), ("spot3",), 1, 2, "spot", "JobHeldUser"),
        (30, ("spot",), (), 2, 1, "", "Resources"),
        (32, ("spot",), ("spot3", "spot4"), 2, 0, "", "ReqNodeNotAvail, UnavailableNodes:spot[3-4]"),
    ]
    assert jobs[2].unavailable == ("spot3", "spot4")
    assert gpus_per_node("gres:gpu:a100:3") == 3 and gpus_per_node("") == 0


def test_settings_read_nodes_and_providers_tables(tmp_path: Path) -> None:
    from broker.config import load_settings
    from broker.errors import ConfigError

    f = tmp_path / "g.toml"
    f.write_text('node_provider = "aws"\nnode_idle_seconds = 120\n'
                 '[nodes.spot]\nidle_seconds = 30\nwarm_min = 1\nprice_per_node_hour = "2.40"\n'
                 '[nodes.ondemand]\ncapacity = "ondemand"\ninstance_type = "g5.2xlarge"\n'
                 '[providers.aws]\nregion = "eu-west-1"\ncluster_name = "lab"\n'
                 'instance_types = { spot = "g5.xlarge" }\n')
    s = load_settings(f, env={"GBROKER_NODE_TICK_SECONDS": "5"})
    assert s.node_tick_seconds == 5.0 and s.node_idle_seconds_for("spot") == 30
    assert s.node_idle_seconds_for("ondemand") == 120 and s.node_capacity("spot") == "spot"
    assert s.managed_node_partitions()["spot"].warm_min == 1
    assert s.provider_settings()["instance_types"] == {"spot": "g5.xlarge"}
    hash(s)  # still usable as a value
    f.write_text('[nodes.spot]\nidle_secs = 30\n')
    with pytest.raises(ConfigError, match="idle_secs"):
        load_settings(f, env={})
    f.write_text('[nodes.spot]\nprice_per_node_hour = 2.4\n')
    with pytest.raises(ConfigError, match="nodes.spot"):
        load_settings(f, env={})
    assert isinstance(NodeManager, type)


def test_the_tick_keeps_an_idle_node_for_its_paid_hour_and_never_releases_owned_nodes(env: Any) -> None:
    from dataclasses import replace

    from broker.pools.catalog import parse_pools

    env.svc.settings = env.m.settings = replace(env.svc.settings, node_partitions=(), pools=parse_pools({
        "spot": {"partition": "spot", "capacity": "spot", "billing": "hour", "idle_seconds": 60,
                 "price_per_node_hour": PRICE},
        "lab": {"partition": "ondemand", "capacity": "owned", "idle_seconds": 60},
    }, "test"))
    env.slurm.add("spot1", "IDLE+CLOUD")
    env.slurm.add("od1", "IDLE+CLOUD", partitions=["ondemand"])
    env.m.tick()  # both seen up: sessions open now, idle from now
    released = []
    for _ in range(int(3600 / 10) + 30):
        released += [(n, env.clock.now() - T0) for n in step(env, 10).released]
        if released:
            break
    # The node tick is 10 s, so the window is 30 s (at least 30 s, two ticks are 20 s).
    assert released == [("spot1", timedelta(seconds=3600 - 30))], released
    assert "power_down = false" in env.m.last.kept["od1"]
    (rel,) = events(env.svc, "node_release")
    assert "paid time ends in 30s" in rel["reason"]


def test_a_node_booting_for_its_job_is_billed_idle_until_the_job_runs() -> None:
    """sacct's run time starts once the node is up, so the boot is node time no job line charges."""
    from broker.nodes.manager import running_job

    def info(raw: str) -> NodeInfo:
        p = parse_node_state(raw)
        return NodeInfo("spot1", raw, p.state, ["spot"], ["spot"], 4, "", p.flags)

    def job(state: str) -> SlurmJob:
        return SlurmJob(7, "j", "bob", "vision", "spot", state, job_state(state), "", ["spot1"], 0, "", None, None,
                        None)

    assert not running_job(info("ALLOCATED+CLOUD+POWERING_UP"), [job("CONFIGURING")])
    assert not running_job(info("ALLOCATED+CLOUD"), [job("CONFIGURING")])  # up, the job not started yet
    assert running_job(info("ALLOCATED+CLOUD"), [job("RUNNING")])
    assert running_job(info("MIXED+CLOUD"), [job("CONFIGURING"), job("RUNNING")])
    assert running_job(info("ALLOCATED+CLOUD"), [])  # allocated by Slurm, squeue not caught up
    assert not running_job(info("IDLE+CLOUD"), [])
