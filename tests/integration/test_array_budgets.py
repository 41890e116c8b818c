"""Budgets reach arrays on the real dev cluster: at the group's limit the array's waiting tasks are
held in Slurm (``scontrol hold`` of its Slurm array), at 100 % with ``cancel`` its running tasks are
cancelled, and raising the budget releases the held ones, which then run."""

from __future__ import annotations

import time
from typing import Any

import pytest

from broker_fixtures import BrokerDaemon, broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)
from test_array_jobs import SEMESTER, arrays_of, ok, setup_money, submit, task_runs, wait

pytestmark = pytest.mark.slurm


def admin(d: BrokerDaemon, *args: str) -> Any:
    return ok(d.cli(*args, user="root"))


def spent(d: BrokerDaemon) -> int:
    data = admin(d, "budget", "show", "--json").json()
    return int(next(b for b in data["budgets"] if b["group"] == "vision")["spent_micros"])


def queue(cluster: Any, array_id: int) -> dict[str, tuple[str, str]]:
    """ArrayTaskID -> (state, reason) of the array's rows in squeue (waiting tasks share one row)."""
    out = cluster.run(["squeue", "-h", "-r", "-j", str(array_id), "-o", "%K|%T|%r"], check=False).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {k: (st, reason) for k, st, reason in rows}


def test_an_array_at_its_groups_budget_is_held_its_running_tasks_cancelled_and_released(broker_daemon,
                                                                                         slurm_cluster):
    d = broker_daemon
    setup_money(d)
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "100")
    base = user_dir(public_dir("gbroker-array-budget-"), "alice")
    # Two at a time on one spot node: piece 1 ends at once (money is spent), 2 and 3 would run a
    # minute, 4-6 wait behind them.
    job = submit(d, "--gpus", "1", "--time", "5m", "--name", "budget-array", "--array", "1-6%2", "--",
                 "sh", "-c", 'case "$GBROKER_PIECE" in 2|3) sleep 60;; *) sleep 1;; esac', cwd=base)

    def two_running() -> dict[str, Any] | None:
        j = d.show(job["id"])
        state = {p["piece"]: p["state"] for p in j["array"]["pieces"]}
        return j if state[1] == "done" and state[2] == state[3] == "running" else None

    j = wait("piece 1 done, pieces 2 and 3 running", two_running, 180, d)
    (array_id,) = arrays_of(j)
    wait("piece 1 charged", lambda: spent(d) > 0, 60, d)
    # The admin sets the budget to less than is spent, and cancels running jobs at 100 %.
    t0 = time.monotonic()
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "0.000001",
          "--at-limit-running", "cancel")

    def held_and_cancelled() -> dict[str, Any] | None:
        q = queue(slurm_cluster, array_id)
        j = d.show(job["id"])
        state = {p["piece"]: p["state"] for p in j["array"]["pieces"]}
        waiting = {k for k, (st, reason) in q.items() if st == "PENDING" and reason == "JobHeldAdmin"}
        done = state[2] == state[3] == "cancelled" and j["state"] == "held"
        return j if done and {"4", "5", "6"} <= waiting else None

    try:
        j = wait("the waiting tasks held, the running ones cancelled", held_and_cancelled, 30, d, interval=0.5)
    except AssertionError:
        j = d.show(job["id"])
        log = "\n".join(ln for ln in d.log_tail(3000).splitlines() if "cancel" in ln.lower() or "budget" in ln)
        raise AssertionError(f"{j['state']} {j['reason']}\n{j['events']}\n{queue(slurm_cluster, array_id)}\n"
                             f"{log[-6000:]}") from None
    acted_s = time.monotonic() - t0
    assert j["reason"].startswith("held by gbroker: the group is at its budget"), j["reason"]
    kinds = [e["kind"] for e in j["events"]]
    assert kinds.count("budget_hold") == 1 and kinds.count("budget_cancel") == 1, kinds
    runs = {r["JobID"]: r["State"] for r in task_runs(slurm_cluster, [array_id])}
    assert runs[f"{array_id}_1"] == "COMPLETED", runs
    assert runs[f"{array_id}_2"].startswith("CANCELLED") and runs[f"{array_id}_3"].startswith("CANCELLED"), runs
    # Held: nothing starts, though the node is free now.
    time.sleep(3)
    assert all(st == "PENDING" for st, _ in queue(slurm_cluster, array_id).values())
    assert {p["piece"]: p["state"] for p in d.show(job["id"])["array"]["pieces"]}.keys() >= {4, 5, 6}
    # Money is back: released in Slurm; the held pieces run and the array ends.
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "100")
    end = d.wait_job(job["id"], lambda x: x["state"] in ("completed", "failed", "cancelled"), timeout=90)
    by_piece = {p["piece"]: p["state"] for p in end["array"]["pieces"]}
    assert by_piece == {1: "done", 2: "cancelled", 3: "cancelled", 4: "done", 5: "done", 6: "done"}, by_piece
    assert end["state"] == "cancelled" and end["pieces"]["line"].startswith("4/6 done"), end["reason"]
    assert [e["kind"] for e in end["events"]].count("budget_release") == 1
    print(f"held and cancelled {acted_s:.1f}s after the budget was set")
