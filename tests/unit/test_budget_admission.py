"""Admission, quotas, the hard stop, alerts and admin rights, on the service layer with a fake Slurm."""

from __future__ import annotations

import json
import tempfile
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.errors import AdmissionRefused, PermissionDenied, SpecError
from broker.ops import outbox
from ledger_fakes import ROOT, World, caller, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def test_refusal_names_what_is_left_and_both_estimates(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "12000"})
    world.submit(gpus=8, time="400h")  # $11,520.00 on spot reserved
    with pytest.raises(AdmissionRefused) as err:
        world.submit(gpus=2, time="100h")
    assert err.value.message == (
        "group vision: $480.00 left of $12,000.00 in 2026-fall; "
        "this job is estimated at $720.00 on spot, $1,440.00 on on-demand"
    )
    assert "$11,520.00 is reserved" in (err.value.hint or "")
    world.submit(gpus=1, time="100h")  # $360.00 fits


def test_non_interruptible_job_shows_on_demand_and_suggests_nothing_cheaper(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "1"})
    with pytest.raises(AdmissionRefused) as err:
        world.submit(time="10m", interruptible=False)
    assert err.value.message.endswith("estimated at $1.20 on on-demand")
    assert "spot" not in (err.value.hint or "")


def test_job_of_a_group_without_budget_is_admitted_with_its_estimate(world: World) -> None:
    world.ops()["group_add"](ROOT, {"name": "physics", "members": ["dave"]})
    r = world.submit(user="dave", group="physics")
    assert r["state"] == "pending"
    world.submit(user="erin", group="unmanaged")  # an account gbroker does not manage at all


def test_a_non_member_cannot_charge_a_group(world: World) -> None:
    with pytest.raises(PermissionDenied, match="carol is not a member of group vision"):
        world.submit(user="carol", group="vision")


def test_twenty_submissions_at_once_against_a_budget_that_fits_five(world: World) -> None:
    # 1 GPU x 10 min at $3.60/h = $0.60 each; $3.00 fits exactly five.
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "3.00"})
    barrier = threading.Barrier(20)
    admitted: list[int] = []
    refused: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        try:
            r = world.submit(time="10m")
            with lock:
                admitted.append(r["id"])
        except AdmissionRefused as exc:
            with lock:
                refused.append(exc.message)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(admitted) == 5 and len(refused) == 15
    st = world.status()
    assert st["committed_micros"] == st["amount_micros"] == 3_000_000
    # Run them all; after every step reserved + charged stays within the budget.
    ids = [j.job_id for j in world.slurm.jobs_by_id.values()]
    for step in range(6):
        for sid in ids:
            world.slurm.start(sid)
        world.advance(60)
        if step == 3:
            for sid in ids[:3]:
                world.slurm.finish(sid)
        world.tick()
        st = world.status()
        assert st["spent_micros"] + st["reserved_micros"] <= st["amount_micros"], st
    for sid in ids:
        world.slurm.finish(sid)
    world.tick()
    st = world.status()
    assert st["reserved_micros"] == 0
    assert st["spent_micros"] == 3 * 240_000 + 2 * 360_000


def test_quota_counts_queued_and_running_gpus(world: World) -> None:
    world.ops()["quota_set"](ROOT, {"group": "vision", "max_gpus": 6, "max_ondemand_gpus": 2})
    world.submit(gpus=4)
    with pytest.raises(AdmissionRefused, match="quota is 6 GPUs at once; 4 are queued or running and this job needs 4"):
        world.submit(gpus=4)
    world.ops()["quota_set"](ROOT, {"group": "vision", "max_gpus": 16})  # the on-demand limit stays
    world.submit(gpus=1, interruptible=False)
    with pytest.raises(AdmissionRefused, match="quota is 2 on-demand GPUs"):
        world.submit(gpus=2, interruptible=False)
    world.ops()["quota_set"](ROOT, {"group": "vision", "max_gpus": None, "max_ondemand_gpus": None})
    world.submit(gpus=8)


ADMIN_OPS: dict[str, dict[str, Any]] = {
    "semester_add": {"name": "2027-spring", "start": "2027-02-01", "end": "2027-06-30"},
    "group_add": {"name": "x", "members": ["alice"]},
    "group_members": {"name": "vision", "add": ["alice"]},
    "quota_set": {"group": "vision", "max_gpus": 1000},
    "price_set": {"partition": "spot", "capacity": "spot", "price": "0.01", "effective": "now"},
    "price_import": {"csv_text": "partition,capacity,price_per_gpu_hour,effective_from\nspot,spot,0.01,now\n"},
    "budget_set": {"group": "vision", "semester": "2026-fall", "amount": "1000000"},
}


@pytest.mark.parametrize("op", sorted(ADMIN_OPS))
def test_admin_operations_are_refused_to_non_admins_by_the_daemon(world: World, op: str) -> None:
    before = world.ops()["budget_list"](ROOT, {})
    with pytest.raises(PermissionDenied, match="for gbroker admins; user alice"):
        world.ops()[op](caller("alice"), ADMIN_OPS[op])
    assert world.ops()["budget_list"](ROOT, {}) == before
    world.ops()[op](ROOT, ADMIN_OPS[op])  # and they work for an admin


def test_users_see_their_own_groups_admins_all(world: World) -> None:
    names = lambda who: [b["group"] for b in world.ops()["budget_list"](who, {})["budgets"]]  # noqa: E731
    assert names(caller("alice")) == ["vision"]
    assert names(caller("carol")) == ["climate"]
    assert names(caller("mallory")) == []
    assert names(ROOT) == ["climate", "vision"]


def _held(world: World) -> set[int]:
    return {j.job_id for j in world.slurm.jobs_by_id.values() if j.held}


def test_hard_stop_holds_pending_jobs_and_raising_the_budget_releases_them(world: World) -> None:
    a, b = world.submit()["slurm_job_id"], world.submit()["slurm_job_id"]
    c = world.submit(user="carol", group="climate")["slurm_job_id"]
    world.tick()
    world.slurm.start(a)
    world.advance(100)
    world.slurm.finish(a)
    world.tick()
    assert world.status()["spent_micros"] == 100_000
    # The admin cuts the budget to what is spent: vision is at 100 %.
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.10"})
    world.tick()
    assert _held(world) == {b}
    world.tick()
    assert world.slurm.calls["hold"] == 1  # held once, not every tick
    assert not world.slurm.start(b)
    with pytest.raises(AdmissionRefused, match=r"group vision has spent its budget \(\$0\.10 of \$0\.10"):
        world.submit()
    world.submit(user="carol", group="climate")  # the other group is unaffected
    assert world.slurm.start(c)
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "5"})
    world.tick()
    assert _held(world) == set()
    assert world.slurm.start(b)
    world.submit()


def test_an_admin_hold_is_not_released_by_gbroker(world: World) -> None:
    b = world.submit()["slurm_job_id"]
    world.tick()
    world.slurm.hold([b])  # an admin's own hold
    world.tick()
    assert _held(world) == {b}


def test_at_limit_running_jobs_finish_or_are_cancelled(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "cancel_running": True})
    a, b = world.submit()["slurm_job_id"], world.submit()["slurm_job_id"]
    world.tick()
    world.slurm.start(a)
    world.slurm.start(b)
    world.advance(50)
    world.slurm.finish(a)
    world.tick()
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.05"})
    world.tick()
    assert world.slurm.jobs_by_id[b].current.state_raw.startswith("CANCELLED")


def test_thresholds_alert_once_each_with_log_and_hook(world: World, caplog: pytest.LogCaptureFixture) -> None:
    # The hook runs as the hook user (nobody), so it lives where nobody may run it and write.
    place = Path(tempfile.mkdtemp(prefix="gb-alert-"))
    place.chmod(0o777)
    out = place / "alerts.jsonl"
    hook = place / "hook.sh"
    hook.write_text(f"#!/bin/sh\necho \"$GBROKER_ALERT_THRESHOLD $GBROKER_ALERT_GROUP\" >> {out}\ncat >> {out}\n"
                    f"echo >> {out}\n")
    hook.chmod(0o755)
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "1.00",
                                     "thresholds": "50,80,100", "alert_command": [str(hook)]})
    sid = world.submit(time="10m")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.advance(540)  # $0.54: crosses 50 %
    world.slurm.finish(sid)
    with caplog.at_level("WARNING"):
        world.tick()
    assert "crossed 50% of its 2026-fall budget: spent $0.54 of $1.00" in caplog.text
    world.tick()
    sid = world.submit(time="5m")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.advance(300)
    world.slurm.finish(sid)
    world.tick()
    world.tick()
    outbox.tick(world.svc)  # the alerts' hooks go through the notification outbox
    fired = _wait_for_lines(out, 2)
    assert [ln.split()[0] for ln in fired] == ["50", "80"]  # 84 %: 80 once, 50 not again, 100 not yet
    assert fired[0] == "50 vision" and fired[1] == "80 vision"
    details = [json.loads(ln) for ln in out.read_text().splitlines() if ln.startswith("{")]
    assert [(d["threshold_pct"], d["spent"], d["amount"]) for d in details] == [(50, "$0.54", "$1.00"),
                                                                                (80, "$0.84", "$1.00")]


def _wait_for_lines(path: Path, n: int, timeout: float = 10.0) -> list[str]:
    """Hooks run in a background thread: wait for their output."""
    import time

    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("{")]
        if len(lines) >= n and sum(ln.startswith("{") for ln in text.splitlines()) >= n:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # a third alert, if one were (wrongly) fired, would show up now
    text = path.read_text()
    return [ln for ln in text.splitlines() if ln and not ln.startswith("{")]


def test_webhook_alert_is_posted(world: World) -> None:
    import http.server

    got: list[dict[str, Any]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.10",
                                         "thresholds": "50", "alert_url": f"http://127.0.0.1:{srv.server_port}/h"})
        sid = world.submit(time="1m")["slurm_job_id"]
        world.tick()
        world.slurm.start(sid)
        world.advance(60)
        world.slurm.finish(sid)
        world.tick()
        outbox.tick(world.svc)
        import time

        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert [(g["group"], g["threshold_pct"], g["spent"]) for g in got] == [("vision", 50, "$0.06")]
    finally:
        srv.shutdown()


def test_semesters_never_overlap(world: World) -> None:
    with pytest.raises(SpecError, match="overlaps 2026-fall"):
        world.ops()["semester_add"](ROOT, {"name": "x", "start": "2027-01-31", "end": "2027-05-31"})
    world.ops()["semester_add"](ROOT, {"name": "2027-spring", "start": "2027-02-01", "end": "2027-05-31"})
    with pytest.raises(SpecError, match="before it starts"):
        world.ops()["semester_add"](ROOT, {"name": "y", "start": "2027-08-01", "end": "2027-07-01"})


def test_price_csv_import_is_all_or_nothing_and_idempotent(world: World) -> None:
    good = ("partition,capacity,price_per_gpu_hour,effective_from\n"
            "spot,spot,0.918,2027-01-01\nondemand,ondemand,$3.06,2027-01-01T00:00:00Z\n*,spot,1.5,2027-01-01\n")
    assert len(world.ops()["price_import"](ROOT, {"csv_text": good})["added"]) == 3
    assert world.ops()["price_import"](ROOT, {"csv_text": good}) == {"added": [], "unchanged": 3}
    bad = ("partition,capacity,price_per_gpu_hour,effective_from\n"
           "spot,spot,1.0,2027-02-01\nspot,cheap,1.0,2027-02-01\nondemand,ondemand,abc,2027-02-01\n"
           "spto,spot,1.0,2027-02-01\nspot,spot,1.0,2027-02-01,extra\n")
    with pytest.raises(SpecError) as err:
        world.ops()["price_import"](ROOT, {"csv_text": bad})
    assert "line 3: capacity 'cheap'" in err.value.message and "line 4: price" in err.value.message
    assert "line 5: partition 'spto' is not one gbroker places jobs in" in err.value.message
    assert "line 6: 5 fields, the header names 4" in err.value.message
    with pytest.raises(SpecError, match="unknown column.*currency"):
        world.ops()["price_import"](ROOT, {"csv_text": good.replace("effective_from", "effective_from,currency")})
    with pytest.raises(SpecError, match="partition 'spto' is not one"):
        world.ops()["price_set"](ROOT, {"partition": "spto", "capacity": "spot", "price": "1", "effective": "now"})
    prices = world.ops()["price_list"](ROOT, {})
    assert not any(p["effective_from"].startswith("2027-02") for p in prices)
    with pytest.raises(SpecError, match="missing column"):
        world.ops()["price_import"](ROOT, {"csv_text": "partition,price\nspot,1\n"})
    conflict = "partition,capacity,price_per_gpu_hour,effective_from\nspot,spot,0.5,2027-01-01\n"
    with pytest.raises(SpecError, match="already has a price from 2027-01-01"):
        world.ops()["price_import"](ROOT, {"csv_text": conflict})


def test_forecast_burn_rate_and_run_out_date(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "10"})
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "100"})
    sid = world.submit(gpus=4, time="2h")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.advance(3600)  # 4 GPU-hours at $3.60
    world.slurm.finish(sid)
    world.tick()
    st = world.status()
    assert st["spent_micros"] == 14_400_000
    fc = st["forecast"]
    # The window is the last 7 days: $14.40 a week; $85.60 left lasts 85.60 / 14.40 weeks.
    assert fc["burn_micros_per_day"] == round(14_400_000 / 7)
    runout = world.clock.now() + timedelta(seconds=85_600_000 * 7 * 86_400 // 14_400_000)
    assert fc["runout_at"] == runout.strftime("%Y-%m-%dT%H:%M:%SZ") == "2026-11-11T23:40:00Z"
    assert fc["runs_out_before_semester_end"]
    # A running job counts at once: two more 4-GPU hours running now bring the date forward.
    sid = world.submit(gpus=4, time="2h")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.tick()
    world.advance(3600)
    fc2 = world.status()["forecast"]
    assert fc2["running_micros"] == 14_400_000
    assert fc2["runout_at"] < fc["runout_at"]


def test_budget_show_reports_reserved_money_of_running_jobs(world: World) -> None:
    world.submit(gpus=2, time="1h")
    st = world.status()
    assert (st["reserved_micros"], st["spent_micros"]) == (7_200_000, 0)
    assert st["left"] == "$92.80"


def test_admission_under_postgres_too(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc, vision_budget="1.20")
    w.submit()
    w.submit()
    with pytest.raises(AdmissionRefused, match=r"\$0\.00 left of \$1\.20"):
        w.submit()


def test_a_reclaimed_job_that_goes_on_holds_its_next_attempt_beside_the_others_reservations(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc, vision_budget="100")
    a = w.submit(gpus=1, time="1h")["slurm_job_id"]
    held_a = w.status()["reserved_micros"]
    w.submit(gpus=2, time="1h")
    held_b = w.status()["reserved_micros"] - held_a
    assert held_b == 2 * held_a > 0
    w.tick()
    w.slurm.start(a)
    w.advance(600)
    assert w.slurm.reclaim(a)
    w.tick()  # ten minutes charged; going on, it holds one more whole attempt, not what was left
    st = w.status()
    assert st["spent_micros"] == 600_000
    assert st["reserved_micros"] == held_a + held_b


def test_reports_by_every_key_add_up(world: World, tmp_path: Path) -> None:
    ids = [world.submit(user=u, group=g, gpus=n, time="1h")["slurm_job_id"]
           for u, g, n in (("alice", "vision", 1), ("bob", "vision", 2), ("carol", "climate", 4))]
    world.tick()
    for sid in ids:
        world.slurm.start(sid)
    world.advance(600)
    world.slurm.reclaim(ids[0])
    for sid in ids[1:]:
        world.slurm.finish(sid)
    world.tick()
    world.slurm.start(ids[0])
    world.advance(60)
    world.slurm.finish(ids[0])
    world.tick()
    total = sum(ln["amount_micros"] for ln in world.lines())
    assert total == 600_000 + 60_000 + 2 * 600_000 + 4 * 600_000
    for by in ("group", "user", "kind", "partition"):
        rep = world.ops()["report"](ROOT, {"semester": "2026-fall", "by": by})
        assert sum(r["spend_micros"] for r in rep["rows"]) == rep["total"]["spend_micros"] == total
    rep = world.ops()["report"](ROOT, {"by": "group"})
    rows = {r["key"]: r for r in rep["rows"]}
    assert rows["vision"]["lost_micros"] == 600_000 and rows["climate"]["lost_micros"] == 0
    assert rows["vision"]["saved_micros"] == 600_000 + 60_000 + 1_200_000  # on-demand costs twice as much
    assert rows["vision"]["spot_share_pct"] == "100.0"
    mine = world.ops()["report"](caller("carol"), {"by": "user"})
    assert [r["key"] for r in mine["rows"]] == ["carol"]

    from broker.report.plot import plot_burndown
    from broker.report.render import report_csv, report_table

    csv_text = report_csv(rep)
    assert csv_text.splitlines()[0].startswith("semester,group,spend,spend_micros")
    assert "total" in report_table(rep).lower()
    png = tmp_path / "burn.png"
    assert plot_burndown(world.ops()["burndown"](ROOT, {}), str(png)) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_has_no_orm_import() -> None:
    import subprocess
    import sys

    code = ("import sys, broker.cli.main, broker.cli.admin, broker.cli.report, broker.report.render; "
            "print(any(m.startswith('sqlalchemy') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env=dict(os.environ)).stdout.strip()
    assert out == "False"


def test_forecast_window_can_be_chosen(world: World) -> None:
    sid = world.submit(gpus=1, time="1h")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.advance(3600)
    world.slurm.finish(sid)
    world.tick()
    week = world.ops()["budget_list"](ROOT, {})["budgets"][1]["forecast"]
    day = world.ops()["budget_list"](ROOT, {"window_days": 1})["budgets"][1]["forecast"]
    assert week["burn_micros_per_day"] == round(3_600_000 / 7)
    assert day["burn_micros_per_day"] == 3_600_000
    with pytest.raises(SpecError, match="--window"):
        world.ops()["budget_list"](ROOT, {"window_days": 0})


def test_a_charge_notes_when_sacct_and_the_daemon_disagree(world: World) -> None:
    sid = world.submit()["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.tick()
    world.advance(60)
    world.slurm.finish(sid)
    run = world.slurm.jobs_by_id[sid].current
    run.start -= timedelta(seconds=20)  # accounting says it started 20 s before the queue showed it
    world.tick()
    with world.svc.sessions() as s:
        from sqlalchemy import select

        from broker.db.models import Event

        msg = s.execute(select(Event.message).where(Event.kind == "charged")).scalar_one()
    assert "sacct's 80s used, the daemon saw 60s" in msg
    assert [ln["seconds"] for ln in world.lines()] == [80]


def test_quota_per_capacity_class_counts_where_the_policy_placed_the_job(world: World) -> None:
    ops = world.ops()
    g = ops["quota_set"](ROOT, {"group": "vision", "limits": {"class:spot": 4}})
    assert g["limits"] == {"class:spot": 4}
    world.submit(gpus=4, time="1h")  # placed on spot: 4 of 4
    with pytest.raises(AdmissionRefused) as err:
        world.submit(gpus=1, time="1h")
    assert err.value.message.startswith("group vision: quota is 4 spot GPUs at once; 4 are queued or running")
    assert "--class-gpus spot=N" in (err.value.hint or "")
    world.submit(gpus=2, time="1h", interruptible=False)  # on-demand: not limited by the spot limit
    listed = {q["name"]: q for q in ops["quota_list"](ROOT, {})}["vision"]
    assert listed["in_use_by"] == {"class:ondemand": 2, "class:spot": 4}
    from click.testing import CliRunner

    from broker.cli import main as cli_main

    with pytest.MonkeyPatch.context() as mp:  # the table shows each limit against its use
        mp.setattr(cli_main.Context, "call", lambda self, op, repeatable=False, **a: ops[op](ROOT, a))
        r = CliRunner().invoke(cli_main.cli, ["--socket", "/nonexistent.sock", "quota", "list"])
    assert r.exit_code == 0 and "PER CLASS/TYPE IN USE/MAX" in r.output, r.output
    assert [line.split()[-1] for line in r.output.splitlines() if line.startswith("vision")] == ["spot=4/4"], r.output
    # None removes the limit; a wrong key is refused by name.
    assert ops["quota_set"](ROOT, {"group": "vision", "limits": {"class:spot": None}})["limits"] == {}
    world.submit(gpus=1, time="1h")
    for bad in ({"spot": 4}, {"class:gold": 4}, {"gpu:a100": -1}):
        with pytest.raises(SpecError):
            ops["quota_set"](ROOT, {"group": "vision", "limits": bad})


def test_quota_set_on_the_command_line_sets_the_class_and_type_limits(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gbroker quota set --class-gpus/--type-gpus` (what the refusal hints name) reach the handler."""
    import json

    from click.testing import CliRunner

    from broker.cli import main as cli_main

    from dataclasses import replace

    from broker.pools.catalog import Pool

    world.svc.settings = replace(world.svc.settings, pools=(
        Pool("spot", "spot", "spot", gpu_type="A100"), Pool("ondemand", "ondemand", "ondemand", gpu_type="A100")))
    ops = world.ops()

    def call(self: Any, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        return ops[op](ROOT, args)

    monkeypatch.setattr(cli_main.Context, "call", call)

    def cli(*args: str) -> Any:
        return CliRunner().invoke(cli_main.cli, ["--socket", "/nonexistent.sock", "quota", "set", "vision", *args])

    r = cli("--class-gpus", "spot=4", "--type-gpus", "A100=2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)[0]["limits"] == {"class:spot": 4, "gpu:A100": 2}  # as the catalog spells it
    r = cli("--class-gpus", "spot=none")
    assert r.exit_code == 0 and "A100=2" in r.output and "spot=" not in r.output, r.output
    for bad in (["--class-gpus", "spot"], ["--class-gpus", "gold=3"], ["--type-gpus", "a100=-1"],
                ["--type-gpus", "a10o=8"], ["--class-gpus", "spot=12", "--class-gpus", "spot=4"]):
        r = cli(*bad)
        assert r.exit_code == 2 and "gbroker: error:" in r.output and bad[0] in r.output, (bad, r.output)


def test_group_members_refuse_a_removal_that_would_do_nothing(world: World) -> None:
    ops = world.ops()
    with pytest.raises(SpecError, match="alcie: not a member of vision"):
        ops["group_members"](ROOT, {"name": "vision", "add": ["carol"], "remove": ["alcie"]})
    with pytest.raises(SpecError, match="carol: both added and removed"):
        ops["group_members"](ROOT, {"name": "vision", "add": ["carol"], "remove": ["carol"]})
    assert ops["group_list"](ROOT, {})[1]["members"] == ["alice", "bob"]  # nothing changed
    g = ops["group_members"](ROOT, {"name": "vision", "add": ["carol"], "remove": ["bob"]})
    assert g["members"] == ["alice", "carol"]


def test_cli_input_that_cannot_be_read_gets_a_message_not_a_traceback(world: World,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from broker.cli import main as cli_main

    ops = world.ops()
    monkeypatch.setattr(cli_main.Context, "call", lambda self, op, repeatable=False, **a: ops[op](ROOT, a))
    for args, words in ((["budget", "set", "vision", "--semester", "2026-fall", "--amount", "10", "--alert-command",
                          '"/usr/bin/notify'], "cannot be split into arguments"),
                        (["quota", "set", "vision", "--gpus", "\u00b2"], "expected a number of GPUs"),
                        (["report", "--json", "--format", "csv"], "--json and --format csv ask for two formats"),
                        (["budget", "ledger", "--json", "--format", "csv"], "--json and --format csv ask for two")):
        r = CliRunner().invoke(cli_main.cli, ["--socket", "/nonexistent.sock", *args])
        assert r.exit_code == 2 and "gbroker: error:" in r.output and words in r.output, (args, r.output)
    r = CliRunner().invoke(cli_main.cli, ["--socket", "/nonexistent.sock", "budget", "ledger", "--json"])
    assert r.exit_code == 0 and isinstance(json.loads(r.output), list), r.output


def test_a_type_limit_is_removed_however_it_was_spelled_and_for_a_type_no_pool_has(world: World) -> None:
    from broker.db.ledger_models import LabGroup, QuotaLimit

    ops = world.ops()
    with world.svc.tx() as s:  # as stored before limits were checked against the catalog
        gid = s.query(LabGroup).filter_by(name="vision").one().id
        s.add(QuotaLimit(group_id=gid, kind="gpu", name="a100", max_gpus=2, updated_at=world.clock.now()))
        s.add(QuotaLimit(group_id=gid, kind="gpu", name="v100", max_gpus=2, updated_at=world.clock.now()))
    assert ops["quota_set"](ROOT, {"group": "vision", "limits": {"gpu:A100": None, "gpu:v100": None}})["limits"] == {}
    with pytest.raises(SpecError, match="no pool has that GPU type"):
        ops["quota_set"](ROOT, {"group": "vision", "limits": {"gpu:v100": 4}})


def test_admin_lists_must_be_names_and_a_csv_column_without_a_name_is_shown(world: World) -> None:
    ops = world.ops()
    for bad in ({"add": [5]}, {"remove": [5], "add": [5]}, {"remove": "bob"}):
        with pytest.raises(SpecError, match="expected a list of user names"):
            ops["group_members"](ROOT, {"name": "vision", **bad})
    text = "partition,capacity,price_per_gpu_hour,effective_from,\nspot,spot,1.0,2027-03-01,\n"
    with pytest.raises(SpecError, match="unknown column\\(s\\) ''"):
        ops["price_import"](ROOT, {"csv_text": text})


def test_an_admin_name_with_a_trailing_newline_is_refused(world: World) -> None:
    """``$`` matches before a final newline: a group "robots\\n" would never match its Slurm account."""
    ops = world.ops()
    for op, args in (("group_add", {"name": "robots\n"}), ("group_add", {"name": "robots", "members": ["dave\n"]}),
                     ("group_members", {"name": "vision", "add": ["carol\n"]})):
        with pytest.raises(SpecError, match="is not a valid name"):
            ops[op](ROOT, args)
    names = [g["name"] for g in ops["group_list"](ROOT, {})]
    assert not any(n.startswith("robots") for n in names), names


def test_thresholds_are_whole_percentages_in_plain_digits(world: World) -> None:
    ops = world.ops()
    b = ops["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "10",
                                 "thresholds": "90 %, 50,50"})
    assert b["thresholds"] == "50,90", b
    for bad in ("50,1_0", "50,\u0661\u0660", "50,-5", "half"):
        with pytest.raises(SpecError, match="write whole percentages"):
            ops["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "thresholds": bad})
