"""Budgets and the ledger on the real dev cluster, with a real daemon and the CLI run as real users.

Prices are chosen so a GPU-second costs a whole number of micro-units
($3.60 per GPU-hour on spot = 1000, $7.20 on on-demand = 2000): the ledger
and the independent computation from `sacct --duplicates` must then agree
exactly, not just to the cent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker_fixtures import (  # noqa: F401  (fixture)
    SRC, BrokerDaemon, broker_daemon, nodes_up, power_down_idle, public_dir, user_dir,
)

pytestmark = pytest.mark.slurm

PRICE_PER_GPU_SECOND = {"spot": 1000, "ondemand": 2000}  # micro-units
SEMESTER = "test-term"


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def admin(d: BrokerDaemon, *args: str) -> Any:
    return ok(d.cli(*args, user="root"))


def setup_lab(d: BrokerDaemon, vision: str = "100", climate: str = "100") -> None:
    today = datetime.now(UTC).date()
    admin(d, "semester", "add", SEMESTER, "--start", str(today - timedelta(days=30)),
          "--end", str(today + timedelta(days=90)))
    admin(d, "group", "add", "vision", "--member", "alice", "--member", "bob")
    admin(d, "group", "add", "climate", "--member", "carol")
    csv_file = public_dir("gbroker-prices-") / "prices.csv"
    csv_file.write_text(
        "partition,capacity,price_per_gpu_hour,effective_from\n"
        f"spot,spot,3.60,{today - timedelta(days=30)}\n"
        f"ondemand,ondemand,7.20,{today - timedelta(days=30)}\n"
    )
    admin(d, "price", "import", str(csv_file))
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", vision)
    admin(d, "budget", "set", "climate", "--semester", SEMESTER, "--amount", climate)


def budget(d: BrokerDaemon, group: str, user: str = "root") -> dict[str, Any]:
    data = ok(d.cli("budget", "show", "--json", user=user)).json()
    return next(b for b in data["budgets"] if b["group"] == group)


def ledger(d: BrokerDaemon) -> list[dict[str, Any]]:
    return ok(d.cli("budget", "ledger", "--format", "json", user="root")).json()


def submit(d: BrokerDaemon, *args: str, user: str = "alice", cwd: Any = None) -> dict[str, Any]:
    return ok(d.cli("submit", "--json", *args, user=user, cwd=cwd)).json()


def sacct_runs(cluster: Any, slurm_ids: list[int]) -> list[dict[str, str]]:
    out = cluster.run(["sacct", "-X", "--duplicates", "-n", "-P", "-a", "-j", ",".join(map(str, slurm_ids)),
                       "--format=JobID,State,Partition,ElapsedRaw,AllocTRES,Start,End"]).stdout
    names = ["JobID", "State", "Partition", "ElapsedRaw", "AllocTRES", "Start", "End"]
    return [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]


def sacct_cost(rows: list[dict[str, str]]) -> int:
    """Independent of gbroker's code: GPUs x elapsed x price, straight from sacct's own rows."""
    total = 0
    for r in rows:
        m = re.search(r"gres/gpu=(\d+)", r["AllocTRES"])
        gpus = int(m.group(1)) if m else 0
        total += gpus * int(r["ElapsedRaw"] or 0) * PRICE_PER_GPU_SECOND[r["Partition"]]
    return total


def wait_for(what: str, pred: Any, timeout: float, d: BrokerDaemon, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{d.log_tail(40)}")
        time.sleep(interval)


def charged_runs(d: BrokerDaemon, slurm_ids: set[int]) -> set[tuple[int, int]]:
    return {(c["slurm_job_id"], c["run_index"]) for c in ledger(d) if c["slurm_job_id"] in slurm_ids}


def all_ended_runs_charged(d: BrokerDaemon, cluster: Any, slurm_ids: list[int]) -> bool:
    rows = sacct_runs(cluster, slurm_ids)
    if any(r["End"] in ("Unknown", "") for r in rows):
        return False
    want: dict[int, list[int]] = {}
    for r in rows:
        want.setdefault(int(r["JobID"]), []).append(int(r["ElapsedRaw"] or 0))
    expected = {(sid, i) for sid, el in want.items() for i, e in enumerate(el) if e > 0}
    return expected <= charged_runs(d, set(slurm_ids))


# -- 1. two groups, a reclaim, ledger == sacct ------------------------------------------------
@pytest.mark.contract  # a core end-to-end proof: runs on every Slurm release
def test_two_groups_with_a_reclaim_ledger_equals_sacct(broker_daemon, slurm_cluster):
    d = broker_daemon
    setup_lab(d)
    carol_dir = user_dir(public_dir("gbroker-carol-"), "carol")
    # Four GPUs: the whole node is ours, so reclaiming it touches no one else's GPU job.
    spot = submit(d, "--group", "vision", "--gpus", "4", "--time", "10m", "--name", "vis-reclaim",
                  "--", "sleep", "20")
    od = submit(d, "--group", "climate", "--no-interruptible", "--time", "5m", "--name", "cli-od",
                "--", "sleep", "8", user="carol", cwd=carol_dir)
    bob = submit(d, "--group", "vision", "--time", "5m", "--name", "vis-bob", "--", "sleep", "6", user="bob",
                 cwd=user_dir(public_dir("gbroker-bob-"), "bob"))
    job = d.wait_job(spot["id"], lambda j: j["state"] == "running", timeout=180)
    time.sleep(4)
    slurm_cluster.reclaim(job["attempts"][-1]["nodes"])
    sids: dict[str, set[int]] = {"vision": set(), "climate": set()}
    for j, user, group in ((spot, "alice", "vision"), (od, "carol", "climate"), (bob, "bob", "vision")):
        done = d.wait_job(j["id"], lambda x: x["state"] == "completed", timeout=300, user=user)
        sids[group] |= {a["slurm_job_id"] for a in done["attempts"] if a["slurm_job_id"]}
    ids = sorted(sids["vision"] | sids["climate"])
    wait_for("every run charged", lambda: all_ended_runs_charged(d, slurm_cluster, ids), 90, d)

    rows = sacct_runs(slurm_cluster, ids)
    reclaimed = [r for r in rows if int(r["JobID"]) in {a["slurm_job_id"] for a in d.show(spot["id"])["attempts"]}]
    # The reclaimed job ran at least twice: Slurm reports the lost run as NODE_FAIL (or FAILED when
    # the program died before the controller marked the node down; then gbroker retries it). A node
    # that fails to boot adds a NODE_FAIL run of its own: sacct counts boot time as elapsed.
    assert len(reclaimed) >= 2 and all(r["State"] in ("NODE_FAIL", "FAILED") for r in reclaimed[:-1]), reclaimed
    assert reclaimed[-1]["State"] == "COMPLETED", reclaimed
    lines = [c for c in ledger(d) if c["slurm_job_id"] in ids]
    assert sum(c["amount_micros"] for c in lines) == sacct_cost(rows) > 0
    # One charge per run (no price change here); reclaimed runs are tagged lost, the rest useful.
    runs = [(c["slurm_job_id"], c["run_index"]) for c in lines]
    assert len(runs) == len(set(runs)) == sum(1 for r in rows if int(r["ElapsedRaw"]) > 0)
    node_fail = {int(r["JobID"]) for r in rows if r["State"] == "NODE_FAIL"}
    assert {sid for sid, _ in runs if sid in node_fail} <= {c["slurm_job_id"] for c in lines if c["tag"] == "lost"}
    assert {c["slurm_job_id"] for c in lines if c["tag"] == "lost"} <= node_fail
    # Per group and to the cent in the report.
    report = ok(d.cli("report", "--semester", SEMESTER, "--by", "group", "--json", user="root")).json()
    by_group = {r["key"]: r for r in report["rows"]}
    for group in ("vision", "climate"):
        cost = sacct_cost([r for r in rows if int(r["JobID"]) in sids[group]])
        assert by_group[group]["spend_micros"] == cost
    assert by_group["climate"]["lost_micros"] == 0
    assert (by_group["vision"]["lost_micros"] > 0) == bool(node_fail)
    assert by_group["climate"]["saved_micros"] == 0 and by_group["vision"]["saved_micros"] > 0
    # Reservations are released once everything is charged; budgets show the spend.
    for group in ("vision", "climate"):
        st = wait_for(f"{group} reservations released", lambda g=group: (b := budget(d, g))["reserved_micros"] == 0
                      and b, 30, d)
        assert st["spent_micros"] == by_group[group]["spend_micros"]
    # Users see their own group only; the CSV and the plot work through the real CLI.
    mine = ok(d.cli("report", "--by", "user", "--json", user="carol", cwd=carol_dir)).json()
    assert [r["key"] for r in mine["rows"]] == ["carol"]
    csv_text = ok(d.cli("report", "--by", "partition", "--format", "csv", user="root")).out
    assert csv_text.splitlines()[0].startswith("semester,partition,spend,spend_micros")
    png = public_dir("gbroker-plot-") / "burn.png"
    png.parent.chmod(0o777)
    ok(d.cli("report", "--plot", str(png), user="alice"))
    assert png.read_bytes()[:4] == b"\x89PNG"


# -- 2. the hard stop ----------------------------------------------------------------------------
def _held_in_slurm(cluster: Any, slurm_id: int) -> bool:
    """Waiting in the queue, held: by ``scontrol hold``, or requeued held before it started."""
    return (cluster.job_field(str(slurm_id), "JobState") == "PENDING"
            and cluster.job_field(str(slurm_id), "Priority") == "0")


def test_group_at_its_budget_is_stopped_other_group_unaffected_raise_releases(broker_daemon, slurm_cluster):
    d = broker_daemon
    setup_lab(d)
    first = submit(d, "--group", "vision", "--time", "2m", "--", "sleep", "3")
    d.wait_job(first["id"], lambda j: j["state"] == "completed", timeout=180)
    spent = wait_for("the first job charged", lambda: budget(d, "vision")["spent_micros"], 60, d)
    # Both on-demand nodes for one job, so the next ones must wait in the queue.
    big = submit(d, "--group", "vision", "--partition", "ondemand", "--nodes", "2", "--gpus", "4", "--time", "2m",
                 "--", "sleep", "45")
    queued = [submit(d, "--group", "vision", "--partition", "ondemand", "--gpus", "4", "--time", "2m",
                     "--", "sleep", "3") for _ in range(2)]
    time.sleep(3)
    # The admin sets the budget to exactly what is spent: vision is at 100 %.
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", f"{spent / 1_000_000:.6f}")
    pending = [j for j in [big, *queued] if slurm_cluster.job_field(str(j["slurm_job_id"]), "JobState") == "PENDING"]
    assert len(pending) >= 2
    for j in pending:
        wait_for(f"Slurm job {j['slurm_job_id']} held", lambda j=j: _held_in_slurm(slurm_cluster, j["slurm_job_id"]),
                 30, d)
        d.wait_job(j["id"], lambda x: x["state"] == "held", timeout=30)
    r = d.cli("submit", "--group", "vision", "--time", "2m", "--", "sleep", "1", user="bob",
              cwd=user_dir(public_dir("gbroker-bob-"), "bob"))
    assert r.code == 5, r.err
    assert re.search(r"group vision has spent its budget .* \$0\.00 left of \$[\d.]+ in test-term; "
                     r"this job is estimated at \$0\.12 on spot, \$0\.24 on on-demand", r.err), r.err
    carol_dir = user_dir(public_dir("gbroker-carol-"), "carol")
    other = submit(d, "--group", "climate", "--time", "2m", "--", "sleep", "2", user="carol", cwd=carol_dir)
    d.wait_job(other["id"], lambda j: j["state"] == "completed", timeout=180, user="carol")
    for j in pending:
        assert _held_in_slurm(slurm_cluster, j["slurm_job_id"]), "released too early"
    # Raising the budget releases them; they run to the end.
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "100")
    for j in pending:
        wait_for(f"Slurm job {j['slurm_job_id']} released",
                 lambda j=j: not _held_in_slurm(slurm_cluster, j["slurm_job_id"]), 30, d)
    for j in [big, *queued]:
        d.wait_job(j["id"], lambda x: x["state"] == "completed", timeout=240)
    events = [e["kind"] for e in d.show(pending[-1]["id"])["events"]]
    assert "budget_hold" in events and "budget_release" in events


def test_a_budget_cut_holds_a_job_waiting_for_its_nodes_to_boot_and_one_in_the_queue_at_once(
        broker_daemon, slurm_cluster):
    """The report: a cut to $0.01 with two on-demand jobs waiting; both started seconds later.

    One job's node is booting (CONFIGURING: ``scontrol hold`` leaves it allocated and it
    starts once the node is up), the other waits in the queue behind it. Both are held
    before the cut's answer comes back, stay held after the node is up, never run, and
    the booting one's boot is not charged."""
    d = broker_daemon
    setup_lab(d)
    power_down_idle(slurm_cluster, "ondemand")
    for node in slurm_cluster.ondemand_nodes:
        slurm_cluster.slow_boot(node, 20)  # a cloud slow to provision: the job waits CONFIGURING
    try:
        booting = submit(d, "--group", "vision", "--partition", "ondemand", "--gpus", "4", "--time", "2m",
                         "--", "sleep", "3")
        sid = booting["slurm_job_id"]
        wait_for(f"Slurm job {sid} allocated, its node booting",
                 lambda: slurm_cluster.job_field(str(sid), "JobState") == "CONFIGURING", 30, d, interval=0.2)
        queued = submit(d, "--group", "vision", "--partition", "ondemand", "--nodes", "2", "--gpus", "4",
                        "--time", "2m", "--", "sleep", "3")
        cut = admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "0.01", "--json").json()
        assert cut["at_limit"] and cut["held_now"] == 2, cut
        for j in (booting, queued):  # at once: the cut's answer came after the holds
            assert _held_in_slurm(slurm_cluster, j["slurm_job_id"]), slurm_cluster.run(
                ["scontrol", "-o", "show", "job", str(j["slurm_job_id"])]).stdout
    finally:
        for node in slurm_cluster.ondemand_nodes:
            slurm_cluster.slow_boot(node, 0)
    for j in (booting, queued):
        d.wait_job(j["id"], lambda x: x["state"] == "held", timeout=30)
    # Both on-demand nodes come up and sit idle; neither job starts on them.
    names = ",".join(slurm_cluster.ondemand_nodes)
    slurm_cluster.run(["scontrol", "update", f"nodename={names}", "state=power_up"], check=False)

    def booted(node: str) -> bool:
        state = slurm_cluster.node_state(node)
        return "IDLE" in state and "POWERING_UP" not in state and "POWERED_DOWN" not in state

    wait_for("both on-demand nodes up and idle", lambda: all(booted(n) for n in slurm_cluster.ondemand_nodes),
             60, d, interval=0.5)
    d.wait_job(booting["id"], lambda x: x["attempts"] and x["attempts"][0]["state"] != "pending", timeout=30)
    for j in (booting, queued):
        assert _held_in_slurm(slurm_cluster, j["slurm_job_id"]), "started after the cut"
    first = d.show(booting["id"])["attempts"][0]
    assert first["state"] == "withdrawn", d.show(booting["id"])
    # Raising the budget releases both; they run to the end, and only their real runs are charged.
    admin(d, "budget", "set", "vision", "--semester", SEMESTER, "--amount", "100")
    for j in (booting, queued):
        d.wait_job(j["id"], lambda x: x["state"] == "completed", timeout=240)
    ids = [booting["slurm_job_id"], queued["slurm_job_id"]]
    rows = sacct_runs(slurm_cluster, ids)
    requeued = [r for r in rows if r["State"] == "REQUEUED" and r["JobID"] == str(sid)]
    assert requeued, rows  # accounting's run of the boot that was stopped
    ran = [r for r in rows if r["State"] == "COMPLETED"]
    assert len(ran) == 2, rows
    def charged() -> int:
        return sum(c["amount_micros"] for c in ledger(d) if c["slurm_job_id"] in ids)

    # Both real runs charged, to the micro-unit, and nothing for the boot that was stopped.
    wait_for("both runs charged", lambda: budget(d, "vision")["reserved_micros"] == 0 and charged(), 90, d)
    assert charged() == sacct_cost(ran) > 0, (charged(), rows)


# -- 3. twenty at once ----------------------------------------------------------------------------
def test_twenty_concurrent_submissions_against_a_budget_that_fits_five(broker_daemon, slurm_cluster):
    d = broker_daemon
    # 1 GPU x 1 minute on spot = $0.06; $0.30 fits five.
    setup_lab(d, vision="0.30")
    bob_dir = user_dir(public_dir("gbroker-bob-"), "bob")

    def one(i: int) -> Any:
        user, cwd = ("alice", None) if i % 2 else ("bob", bob_dir)
        return d.cli("submit", "--json", "--group", "vision", "--time", "1m", "--name", f"burst{i}",
                     "--", "sleep", "5", user=user, cwd=cwd, timeout=120)

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    admitted = [r.json() for r in results if r.code == 0]
    refused = [r for r in results if r.code != 0]
    assert len(admitted) == 5, [r.err for r in refused][:3]
    assert all(r.code == 5 and "left of $0.30" in r.err for r in refused), [r.err for r in refused]
    checks = 0
    ids = [j["slurm_job_id"] for j in admitted]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        st = budget(d, "vision")
        checks += 1
        assert st["spent_micros"] + st["reserved_micros"] <= st["amount_micros"], st
        states = {j["id"]: j["state"] for j in ok(d.cli("history", "--all", "--json", user="root")).json()}
        done = all(states[j["id"]] == "completed" for j in admitted)
        if done and st["reserved_micros"] == 0:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"jobs did not finish and settle: {budget(d, 'vision')}\n{d.log_tail()}")
    assert checks >= 5
    st = budget(d, "vision")
    # A run that failed for its own reasons is retried under a new Slurm job id:
    # every attempt of the admitted jobs is in the bill.
    all_ids = sorted({a["slurm_job_id"] for j in admitted for a in d.show(j["id"], user="root")["attempts"]
                      if a["slurm_job_id"]})
    assert set(ids) <= set(all_ids)
    assert st["spent_micros"] == sacct_cost(sacct_runs(slurm_cluster, all_ids)) > 0


# -- 4. admin rights are the daemon's call ----------------------------------------------------------
RAW_CALL = """
import json, sys
from broker.client import RemoteError, call
try:
    print(json.dumps({"ok": call(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))}))
except RemoteError as e:
    print(json.dumps({"kind": e.kind, "message": e.message, "exit": e.exit_code}))
"""


def test_non_admin_is_refused_by_the_daemon_not_only_the_cli(broker_daemon, slurm_cluster):
    import pwd

    d = broker_daemon
    setup_lab(d)
    alice = pwd.getpwnam("alice")
    attempts = {
        "budget_set": {"group": "vision", "semester": SEMESTER, "amount": "1000000"},
        "price_set": {"partition": "spot", "capacity": "spot", "price": "0.01", "effective": "now"},
        "quota_set": {"group": "vision", "max_gpus": 1000},
        "group_members": {"name": "climate", "add": ["alice"]},
        "semester_add": {"name": "mine", "start": "2030-01-01", "end": "2030-06-30"},
    }
    for op, args in attempts.items():
        p = subprocess.run([sys.executable, "-c", RAW_CALL, d.socket, op, json.dumps(args)],
                           user=alice.pw_uid, group=alice.pw_gid, extra_groups=[], capture_output=True, text=True,
                           env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=60)
        answer = json.loads(p.stdout)
        assert answer.get("kind") == "PermissionDenied" and answer["exit"] == 4, (op, answer, p.stderr)
        assert "alice" in answer["message"] and "admins" in answer["message"]
    assert budget(d, "vision")["amount_micros"] == 100_000_000
    assert "alice" not in ok(d.cli("group", "list", "--json", user="root")).out.split('"climate"')[1].split("]")[0]
    prices = ok(d.cli("price", "list", "--json", user="root")).json()
    assert {p["price"] for p in prices} == {"$3.60", "$7.20"}
    r = d.cli("budget", "set", "vision", "--semester", SEMESTER, "--amount", "5")
    assert r.code == 4 and "for gbroker admins" in r.err


# -- 4b. a dry run --------------------------------------------------------------------------------
def test_a_dry_run_asks_slurm_as_the_user_says_the_cost_and_queues_nothing(broker_daemon, slurm_cluster):
    d = broker_daemon
    setup_lab(d, vision="0.30")

    def alices_queue() -> list[str]:
        return sorted(slurm_cluster.run(["squeue", "-h", "-u", "alice", "-o", "%i %j"]).stdout.split("\n"))

    before = alices_queue()
    r = ok(d.cli("submit", "--dry-run", "--group", "vision", "--time", "1m", "--", "sleep", "1"))
    assert r.out.startswith("Would submit sleep to spot [spot]: nothing stored or queued"), r.out
    assert "$0.06 on spot, $0.12 on on-demand (at most: 1 GPU(s) x 1m00s" in r.out, r.out
    assert "$0.24 of $0.30 in test-term would be left" in r.out and "accepted (sbatch --test-only as alice)" in r.out
    plan = ok(d.cli("submit", "--dry-run", "--json", "--group", "vision", "--time", "1m", "--", "sleep", "1")).json()
    assert plan["user"] == "alice" and plan["estimate_micros"] == 60_000 and plan["budget"]["reserved_micros"] == 0
    # Refused exactly as the submission is: by Slurm (accounts alice has no association with, asked
    # as alice), by the budget ($2.40 against $0.30), by the group's quota (2 GPUs at once).
    admin(d, "quota", "set", "vision", "--gpus", "2")
    for args, code, said in (
        (("--group", "nosuchacct", "--time", "1m"), 2, "Slurm refuses this job: allocation failure: Invalid account"),
        (("--group", "visoin", "--time", "1m"), 2, "(--group visoin)\n  hint: did you mean --group vision? your "
                                                   "groups: vision; `sacctmgr show assoc user=alice"),
        (("--group", "climate", "--time", "1m"), 2, "Slurm refuses this job: allocation failure: Invalid account"),
        (("--group", "vision", "--gpus", "2", "--time", "10m"), 5, "this job is estimated at $1.20 on spot"),
        (("--group", "vision", "--gpus", "3", "--time", "1m"), 5, "quota is 2 GPUs at once"),
    ):
        dry = d.cli("submit", "--dry-run", *args, "--", "sleep", "1")
        real = d.cli("submit", *args, "--", "sleep", "1")
        assert (dry.code, dry.err) == (real.code, real.err) and dry.code == code and said in dry.err, (args, dry, real)
    assert ok(d.cli("history", "--json")).json() == [] and budget(d, "vision")["reserved_micros"] == 0
    assert alices_queue() == before


# -- 5. a price change in the middle of a running job ------------------------------------------------
def test_price_change_mid_job_is_charged_in_two_parts(broker_daemon, slurm_cluster):
    d = broker_daemon
    setup_lab(d)
    job = submit(d, "--group", "vision", "--gpus", "2", "--time", "2m", "--", "sleep", "20")
    d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
    admin(d, "price", "set", "spot", "--capacity", "spot", "--price", "10.80", "--from", "+6s")
    d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=120)
    sid = job["slurm_job_id"]
    wait_for("the run charged", lambda: all_ended_runs_charged(d, slurm_cluster, [sid]), 60, d)
    (row,) = sacct_runs(slurm_cluster, [sid])
    lines = [c for c in ledger(d) if c["slurm_job_id"] == sid]
    assert [(c["price_micros"], c["run_index"]) for c in lines] == [(3_600_000, 0), (10_800_000, 0)], lines
    assert sum(c["seconds"] for c in lines) == int(row["ElapsedRaw"])
    change = datetime.fromisoformat(lines[1]["period_start"])
    start = datetime.fromisoformat(row["Start"]).replace(tzinfo=datetime.now().astimezone().tzinfo)
    assert lines[0]["seconds"] == int((change - start).total_seconds()) > 0
    assert [c["amount_micros"] for c in lines] == [2 * 1000 * lines[0]["seconds"], 2 * 3000 * lines[1]["seconds"]]
