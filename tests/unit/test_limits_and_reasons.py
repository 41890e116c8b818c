"""Partition limits in placement, and Slurm's pending reason in words.

The limit check and the reason table are pure; placement, the dry run, the
reconcile tick's reason and a deadline move are on the service layer with a
real database and the fake Slurm (tests/integration/test_partition_limits.py
proves the same on the real dev cluster).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import SlurmUnavailable, SpecError
from broker.jobs.handlers import show_job
from broker.pools import limits_hint, partition_refuses
from broker.pools.limits import slurm_duration
from broker.slurm.parse import parse_partitions
from broker.slurm.partitions import PartitionCache, PartitionInfo
from broker.slurm.reasons import REASONS, pending_in_words
from ledger_fakes import ROOT, World, caller, job_spec, setup_lab

# What `scontrol --all --oneliner show partition` printed on the dev cluster (Slurm 22.05.8) after
# `scontrol update PartitionName=ondemand MaxTime=60 MaxNodes=1 MinNodes=1` (cut to the fields of the
# first line and one whole line).
RECORDED = (
    "PartitionName=ondemand AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=1 MaxTime=01:00:00 "
    "MinNodes=1 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=od[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO "
    "ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=8 TotalNodes=2 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=8,mem=8000M,node=2,billing=8,gres/gpu=8,gres/gpu:l4=8\n"
    "PartitionName=spot AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 State=UP\n"
    "PartitionName=long MaxTime=2-00:00:00 MaxNodes=4 MinNodes=0 State=INACTIVE\n"
)


# -- reading the limits --------------------------------------------------------------------------
def test_scontrol_partitions_are_read_with_their_limits() -> None:
    got = {p.name: p for p in parse_partitions(RECORDED)}
    assert got["ondemand"] == PartitionInfo("ondemand", max_time_s=3600, max_nodes=1, min_nodes=1, state="UP")
    assert got["spot"] == PartitionInfo("spot", max_time_s=None, max_nodes=None, min_nodes=0, state="UP")
    assert got["long"] == PartitionInfo("long", max_time_s=2 * 86400, max_nodes=4, min_nodes=0, state="INACTIVE")


def test_a_partition_whose_limit_does_not_read_is_left_out() -> None:
    assert parse_partitions("PartitionName=odd MaxNodes=many\nPartitionName=ok MaxTime=30\n") == [
        PartitionInfo("ok", max_time_s=1800)]


class Reads:
    def __init__(self, *answers: object) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self) -> list[PartitionInfo]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]


def test_the_cache_reads_once_per_refresh_and_keeps_the_last_limits_when_slurm_is_down() -> None:
    now = [0.0]
    one, two = PartitionInfo("od", max_time_s=3600), PartitionInfo("od", max_time_s=7200)
    reads = Reads([one], SlurmUnavailable("down"), [two])
    cache = PartitionCache(reads, refresh_s=30, clock=lambda: now[0])
    assert cache.known() == {}
    for _ in range(50):  # a burst of submissions: one read
        assert cache.get() == {"od": one}
    assert reads.calls == 1
    now[0] = 31
    assert cache.get() == {"od": one} and reads.calls == 2  # down: the last limits stay in force
    now[0] = 33
    assert cache.get() == {"od": one} and reads.calls == 2  # not asked again at once
    now[0] = 37
    assert cache.get() == {"od": two} and reads.calls == 3 and cache.known() == {"od": two}


def test_a_read_that_hangs_holds_up_only_the_thread_that_reads() -> None:
    """A controller that hangs keeps the one reading thread (to its query timeout); every other
    submission goes on at once with the limits last read."""
    import threading

    now = [0.0]
    one, two = PartitionInfo("od", max_time_s=3600), PartitionInfo("od", max_time_s=7200)
    entered, go = threading.Event(), threading.Event()
    answers = [[one], [two]]

    def read() -> list[PartitionInfo]:
        if len(answers) == 1:  # the second read hangs until let go
            entered.set()
            assert go.wait(10)
        return answers.pop(0)

    cache = PartitionCache(read, refresh_s=30, clock=lambda: now[0])
    assert cache.get() == {"od": one}
    now[0] = 31
    reader = threading.Thread(target=cache.get)
    reader.start()
    assert entered.wait(10)
    others = [cache.get() for _ in range(20)]  # while the read hangs: no wait, the last limits
    assert others == [{"od": one}] * 20
    go.set()
    reader.join(10)
    assert cache.get() == {"od": two} == cache.known()


# -- the check --------------------------------------------------------------------------------------
OD_1H = PartitionInfo("ondemand", max_time_s=3600, max_nodes=2, min_nodes=0)


@pytest.mark.parametrize(("limits", "time_s", "nodes", "said"), [
    (None, 10**6, 99, None),
    (OD_1H, 3600, 2, None),
    (OD_1H, 3541, 1, None),  # 59m01s goes to Slurm as 60 minutes: within
    (OD_1H, 3601, 1, "partition ondemand allows at most 1:00:00 (MaxTime), the job asks for 1:01:00"),
    (OD_1H, 7200, 1, "partition ondemand allows at most 1:00:00 (MaxTime), the job asks for 2:00:00"),
    (OD_1H, 60, 3, "partition ondemand allows at most 2 node(s) per job (MaxNodes), the job asks for 3"),
    (PartitionInfo("big", min_nodes=2), 60, 1,
     "partition big needs at least 2 nodes per job (MinNodes), the job asks for 1"),
    (PartitionInfo("old", state="INACTIVE"), 60, 1, "partition old is INACTIVE in Slurm and takes no new jobs"),
    (PartitionInfo("down", state="DOWN"), 60, 1, None),  # queued, and it waits (its reason says so)
])
def test_a_partition_refuses_a_job_outside_its_limits(limits: PartitionInfo | None, time_s: int, nodes: int,
                                                      said: str | None) -> None:
    assert partition_refuses(limits, time_s, nodes) == said


def test_the_hint_names_the_longest_time_and_most_nodes_any_partition_allows() -> None:
    two = [OD_1H, PartitionInfo("spot", max_time_s=5400, max_nodes=1)]
    assert limits_hint(two, 7200, 1).startswith("ask for --time 1h30m or less (split longer work")
    assert limits_hint(two, 60, 3).startswith("ask for --nodes 2 or fewer")
    # One partition without a limit: no length would do it, an admin has to look.
    assert limits_hint([OD_1H, PartitionInfo("x")], 7200, 1).startswith("ask an admin to raise")
    assert slurm_duration(90061) == "1-01:01:01" and slurm_duration(1800) == "30:00"


# -- Slurm's pending reason in words ---------------------------------------------------------------
def test_a_pending_reason_reads_in_words_with_slurms_code_kept() -> None:
    said = pending_in_words("PartitionTimeLimit", partition="ondemand", job_id=27, time_limit_s=7200, limits=OD_1H)
    assert said == ("waiting: the job's time limit (2:00:00) is above partition ondemand's MaxTime (1:00:00); "
                    "it will not start there: cancel it and submit with a shorter --time (Slurm: PartitionTimeLimit)")
    assert pending_in_words("Resources", partition="spot", job_id=3, time_limit_s=60) == (
        "waiting for free nodes or GPUs in spot (Slurm: Resources)")
    assert pending_in_words("ReqNodeNotAvail, UnavailableNodes:od1", partition="od", job_id=3,
                            time_limit_s=60).endswith("(Slurm: ReqNodeNotAvail, UnavailableNodes:od1)")
    assert pending_in_words("JobHeldUser", partition="od", job_id=27, time_limit_s=60) == (
        "held in Slurm by its owner (`scontrol release 27` lets it start) (Slurm: JobHeldUser)")
    assert pending_in_words("SomethingNew", partition="od", job_id=1, time_limit_s=60) == "SomethingNew"
    assert pending_in_words("", partition="od", job_id=1, time_limit_s=60) == ""


@pytest.mark.parametrize("code", sorted(REASONS))
def test_every_code_in_the_table_fills_in(code: str) -> None:
    said = pending_in_words(code, partition="p", job_id=1, time_limit_s=None)
    assert said.endswith(f"(Slurm: {code})") and "{" not in said


# -- placement, the dry run and the tick, on the service layer -----------------------------------------
@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def limit(world: World, **max_time_s: int) -> None:
    """The fake cluster's partitions with these MaxTimes, read at placement's next look (the cache the
    backend made on first use is dropped: its 30 s run on the real clock, not the world's)."""
    world.slurm.partitions = lambda: [PartitionInfo(name, max_time_s=s) for name, s in max_time_s.items()]  # type: ignore[method-assign]
    world.slurm.__dict__.pop("_partitions", None)


def test_a_job_above_spots_max_time_is_placed_on_ondemand_and_the_dry_run_says_why(world: World) -> None:
    from broker.jobs.submit import plan

    limit(world, spot=3600)
    dry = plan(world.svc, caller(), job_spec(time="2h"))
    assert (dry["pool"], dry["partition_limits"]) == (
        "ondemand", {"spot": "partition spot allows at most 1:00:00 (MaxTime), the job asks for 2:00:00"})
    out = world.submit(time="2h")
    assert out["capacity"] == "ondemand" and world.slurm.jobs_by_id[out["slurm_job_id"]].partition == "ondemand"
    assert world.submit(time="1h")["capacity"] == "spot"  # within the limit: placed as before


def test_a_job_no_partition_takes_is_refused_naming_the_limit_and_nothing_is_stored(world: World) -> None:
    from broker.jobs.submit import plan

    limit(world, spot=3600, ondemand=3600)
    for attempt in (lambda: plan(world.svc, caller(), job_spec(time="2h")), lambda: world.submit(time="2h")):
        with pytest.raises(SpecError) as err:
            attempt()
        assert "ondemand: partition ondemand allows at most 1:00:00 (MaxTime)" in err.value.message
        assert err.value.hint is not None and err.value.hint.startswith("ask for --time 1h or less")
    with pytest.raises(SpecError, match="partition spot allows at most 1:00:00"):
        world.submit(time="2h", partition="spot")  # the user's own partition: refused, not moved
    assert world.slurm.jobs_by_id == {}


def test_a_job_pending_on_a_lowered_limit_shows_slurms_reason_in_words(world: World) -> None:
    out = world.submit(time="2h")
    assert out["capacity"] == "spot"
    limit(world, spot=3600)
    reads: list[int] = []
    world.slurm.partitions = lambda: reads.append(1) or [PartitionInfo("spot", max_time_s=3600)]  # type: ignore[method-assign,func-returns-value]
    world.slurm.jobs_by_id[out["slurm_job_id"]].reason = "PartitionTimeLimit"
    world.svc.backend.partition_limits()  # what placement read last
    world.tick()
    assert reads == [1]  # the tick's words cost no Slurm call
    job = show_job(world.svc, ROOT, out["id"])
    assert job["state"] == "pending" and job["reason"] == (
        "waiting: the job's time limit (2:00:00) is above partition spot's MaxTime (1:00:00); it will not start "
        "there: cancel it and submit with a shorter --time (Slurm: PartitionTimeLimit)"), job["reason"]


def test_a_deadline_job_is_not_moved_to_an_ondemand_partition_that_would_never_start_it(world: World) -> None:
    import policies

    world.svc.policy = policies.from_name("greedy")
    out = world.submit(time="2h", deadline_in_s=2 * 3600 + 6 * 60)
    assert out["capacity"] == "spot"
    limit(world, ondemand=3600)
    for _ in range(20):  # the safety net would send it to on-demand well within this
        world.advance(15)
        world.tick()
    assert world.slurm.jobs_by_id[out["slurm_job_id"]].partition == "spot"


def test_a_job_held_at_its_groups_budget_keeps_gbrokers_reason_over_slurms_hold(world: World) -> None:
    from broker.states import BUDGET_HELD

    out = world.submit(gpus=1)
    world.tick()
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.01"})
    for _ in range(3):  # Slurm says JobHeldAdmin at every tick after the hold
        world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert world.slurm.jobs_by_id[out["slurm_job_id"]].held
    assert (job["state"], job["reason"]) == ("held", BUDGET_HELD), job["reason"]
