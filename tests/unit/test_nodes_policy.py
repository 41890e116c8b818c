"""The release decision, table-driven: nodes + pending jobs + rules + now -> release / keep / wake."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.nodes.policy import (
    NodeView,
    PartitionRule,
    PendingJob,
    Power,
    constraint_met,
    job_can_start,
    plan_release,
)

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
RULES = {"spot": PartitionRule("spot", idle_s=60), "ondemand": PartitionRule("ondemand", idle_s=300)}


def idle(name: str, secs: float, parts: tuple[str, ...] = ("spot",), **kw: object) -> NodeView:
    return NodeView(name, parts, Power.ON, busy=False, gpus=4, features=("spot",),
                    idle_since=NOW - timedelta(seconds=secs), **kw)  # type: ignore[arg-type]


def busy(name: str, parts: tuple[str, ...] = ("spot",)) -> NodeView:
    return NodeView(name, parts, Power.ON, busy=True, gpus=4, features=("spot",))


def job(jid: int, parts: tuple[str, ...] = ("spot",), **kw: object) -> PendingJob:
    return PendingJob(jid, parts, **kw)  # type: ignore[arg-type]


CASES = [
    # (id, nodes, pending, rules, released, kept-with-fragment)
    ("idle past its time goes", [idle("s1", 61)], [], RULES, ["s1"], {}),
    ("exactly at the idle time goes", [idle("s1", 60)], [], RULES, ["s1"], {}),
    ("idle not long enough stays", [idle("s1", 59)], [], RULES, [], {"s1": "idle 59s of 60s"}),
    ("a node with a job never goes", [busy("s1")], [], RULES, [], {"s1": "running a job"}),
    ("busy flag wins over an old idle_since",
     [NodeView("s1", ("spot",), Power.ON, busy=True, idle_since=NOW - timedelta(hours=5))], [], RULES, [],
     {"s1": "job"}),
    ("partition idle times differ", [idle("s1", 100), idle("o1", 100, ("ondemand",))], [], RULES, ["s1"],
     {"o1": "of 300s"}),
    ("a node in two managed partitions uses the longest time",
     [idle("s1", 100, ("spot", "ondemand"))], [], RULES, [], {"s1": "of 300s"}),
    ("unmanaged partitions are not touched", [idle("x1", 9999, ("gpu-other",))], [], RULES, [], {}),
    ("an unmanaged extra partition does not change the rule", [idle("s1", 61, ("spot", "urgent"))], [], RULES,
     ["s1"], {}),
    ("powered down, booting, stopping: nothing to do",
     [NodeView("a", ("spot",), Power.OFF, False), NodeView("b", ("spot",), Power.BOOTING, False),
      NodeView("c", ("spot",), Power.STOPPING, False)], [], RULES, [], {"b": "powering up"}),
    ("down or drained nodes are left to the admin", [idle("s1", 999, usable=False)], [], RULES, [],
     {"s1": "admin"}),
    ("unknown idle start is never released",
     [NodeView("s1", ("spot",), Power.ON, busy=False, idle_since=None)], [], RULES, [], {"s1": "not known"}),
    ("a pending job that fits keeps the node", [idle("s1", 999)], [job(7, gpus_per_node=2)], RULES, [],
     {"s1": "pending job 7"}),
    ("a job in another partition of the node keeps it", [idle("s1", 999, ("spot", "urgent"))],
     [job(7, ("urgent",))], RULES, [], {"s1": "pending job 7"}),
    ("a multi-partition job (spot,ondemand) keeps it", [idle("s1", 999)], [job(7, ("ondemand", "spot"))], RULES,
     [], {"s1": "pending job 7"}),
    ("a job in another partition does not", [idle("s1", 999)], [job(7, ("ondemand",))], RULES, ["s1"], {}),
    ("a job wanting more GPUs than the node has does not", [idle("s1", 999)], [job(7, gpus_per_node=8)], RULES,
     ["s1"], {}),
    ("a job wanting a feature the node lacks does not", [idle("s1", 999)], [job(7, constraint="ondemand")],
     RULES, ["s1"], {}),
    ("a job pinned to another node does not", [idle("s1", 999)], [job(7, required_nodes=("s2",))], RULES,
     ["s1"], {}),
    ("a job pinned to this node does", [idle("s1", 999)], [job(7, required_nodes=("s1", "s2"))], RULES, [],
     {"s1": "pending job 7"}),
    ("a held job keeps nothing", [idle("s1", 999)], [job(7, reason="JobHeldUser")], RULES, ["s1"], {}),
    ("a job waiting for its begin time keeps nothing", [idle("s1", 999)], [job(7, reason="BeginTime")], RULES,
     ["s1"], {}),
    ("a job over its group's limit keeps nothing", [idle("s1", 999)],
     [job(7, reason="AssocGrpGRES")], RULES, ["s1"], {}),
    ("a job waiting for a dependency keeps nothing", [idle("s1", 999)], [job(7, reason="Dependency")], RULES,
     ["s1"], {}),
    ("a job waiting for a node that is booting keeps the idle one",
     [idle("s1", 999), NodeView("s2", ("spot",), Power.BOOTING, False)],
     [job(7, nodes=2, required_nodes=("s1", "s2"), reason="ReqNodeNotAvail, UnavailableNodes:s2",
          unavailable=("s2",))], RULES, [], {"s1": "pending job 7"}),
    ("a job waiting for a down node keeps nothing",
     [idle("s1", 999), NodeView("s2", ("spot",), Power.ON, False, usable=False)],
     [job(7, nodes=2, required_nodes=("s1", "s2"), reason="ReqNodeNotAvail, UnavailableNodes:s2",
          unavailable=("s2",))], RULES, ["s1"], {}),
    ("a job waiting for a node we know nothing of keeps nothing", [idle("s1", 999)],
     [job(7, reason="ReqNodeNotAvail, UnavailableNodes:x9", unavailable=("x9",))], RULES, ["s1"], {}),
    ("one one-node job holds one node, the others go",
     [idle("s1", 300), idle("s2", 200), idle("s3", 100)], [job(7, reason="Resources")], RULES, ["s2", "s3"],
     {"s1": "pending job 7"}),
    ("a two-node job holds two", [idle("s1", 300), idle("s2", 200), idle("s3", 100)], [job(7, nodes=2)], RULES,
     ["s3"], {"s1": "job 7", "s2": "job 7"}),
    ("two jobs hold two", [idle("s1", 300), idle("s2", 200)], [job(7), job(8)], RULES, [],
     {"s1": "job 7", "s2": "job 8"}),
    ("warm minimum keeps the most recently idle",
     [idle("s1", 300), idle("s2", 200), idle("s3", 100)], [],
     {"spot": PartitionRule("spot", 60, warm_min=1)}, ["s1", "s2"], {"s3": "warm minimum of spot"}),
    ("busy nodes count towards the warm minimum", [busy("s1"), idle("s2", 999)], [],
     {"spot": PartitionRule("spot", 60, warm_min=1)}, ["s2"], {}),
    ("warm minimum 0 releases everything", [idle("s1", 61), idle("s2", 61)], [],
     {"spot": PartitionRule("spot", 60, warm_min=0)}, ["s1", "s2"], {}),
]


@pytest.mark.parametrize("nodes,pending,rules,released,kept", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_release_decision(nodes, pending, rules, released, kept) -> None:
    plan = plan_release(nodes, pending, rules, NOW)
    assert plan.release == released
    for name, fragment in kept.items():
        assert fragment in plan.kept[name], plan.kept
    assert not set(plan.release) & set(plan.kept)
    for n in nodes:  # the one rule that must hold whatever else changes
        if n.busy:
            assert n.name not in plan.release
    assert plan.power_up == []


def test_release_order_is_longest_idle_first_and_reasons_are_given() -> None:
    plan = plan_release([idle("b", 100), idle("a", 500), idle("c", 70)], [], RULES, NOW)
    assert plan.release == ["a", "b", "c"]
    assert "idle 500s >= 60s" in plan.reasons["a"]


def test_warm_minimum_wakes_powered_down_nodes() -> None:
    nodes = [busy("s1"), NodeView("s2", ("spot",), Power.OFF, False), NodeView("s3", ("spot",), Power.OFF, False),
             NodeView("s4", ("spot",), Power.OFF, False, usable=False)]
    plan = plan_release(nodes, [], {"spot": PartitionRule("spot", 60, warm_min=3)}, NOW)
    assert plan.power_up == ["s2", "s3"]  # never a down node
    assert plan.release == []


def test_booting_nodes_count_towards_the_warm_minimum() -> None:
    nodes = [NodeView("s1", ("spot",), Power.BOOTING, False), NodeView("s2", ("spot",), Power.OFF, False)]
    plan = plan_release(nodes, [], {"spot": PartitionRule("spot", 60, warm_min=1)}, NOW)
    assert plan.power_up == []


@pytest.mark.parametrize(
    "constraint,features,ok",
    [("", (), True), ("spot", ("spot",), True), ("ondemand", ("spot",), False), ("a&b", ("a", "b"), True),
     ("a&b", ("a",), False), ("a|b", ("b",), True), ("a,b", ("a",), False), ("[a*2]", (), True)],
)
def test_constraints(constraint: str, features: tuple[str, ...], ok: bool) -> None:
    assert constraint_met(constraint, features) is ok


@pytest.mark.parametrize("reason,ok", [("", True), ("None", True), ("Resources", True), ("Priority", True),
                                       ("JobHeldAdmin", False), ("DependencyNeverSatisfied", False),
                                       ("QOSMaxGRESPerUser", False), ("ReqNodeNotAvail, Reserved for maintenance", False)])
def test_which_pending_jobs_count(reason: str, ok: bool) -> None:
    assert job_can_start(PendingJob(1, ("spot",), reason=reason)) is ok
