"""Operations, on the service layer with a fake Slurm: the outbox, health, metrics, settings, systemd."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import logging
import os
import socket
import tempfile
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from sqlalchemy import select

from broker.cli.main import cli
from broker.config import Settings, load_settings
from broker.db.ops_models import OutboxMessage
from broker.errors import ConfigError
from broker.ops import outbox, systemd
from broker.ops.health import readiness
from broker.ops.metrics import registry
from broker.ops.reload import merge
from broker.ops.stats import CountingBackend, DaemonStats
from broker.opsconfig import NotifySettings, Subscription, Target
from broker.timeparse import parse_when
from ledger_fakes import ROOT, World, caller, job_spec, setup_lab

SECRET = "s3cret"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


class Hook:
    """A real HTTP server on a fixed port that can be down (closed) and come back."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.srv: http.server.HTTPServer | None = None

    def up(self) -> None:
        got = self.got

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = http.server.HTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.srv is not None:
            self.srv.shutdown()
            self.srv.server_close()
            self.srv = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def with_notify(world: World, url: str, **kw: Any) -> None:
    cfg = NotifySettings(targets=(Target("lab", "webhook", url=url, secret=SECRET),),
                         subscriptions=(Subscription("lab", users=("alice",)),),
                         backoff_seconds=10, backoff_max_seconds=40, max_tries=20, timeout_seconds=2, **kw)
    world.svc.settings = replace(world.svc.settings, notify=cfg)


def submit_no_retry(world: World) -> dict[str, Any]:
    from broker.jobs.submit import submit

    return submit(world.svc, caller("alice"), {**job_spec(), "max_retries": 0})


def reclaimed_after_two_minutes(world: World) -> int:
    """A spot job started, reclaimed 2 minutes in, and the tick that sees it; its Slurm id."""
    a = int(world.submit(time="10m")["slurm_job_id"])
    world.tick()
    world.slurm.start(a)
    world.advance(120)
    world.slurm.reclaim(a)
    world.tick()
    return a


def rows(world: World) -> list[OutboxMessage]:
    with world.svc.sessions() as s:
        return list(s.execute(select(OutboxMessage).order_by(OutboxMessage.id)).scalars())


# -- the outbox ---------------------------------------------------------------------------
def test_a_webhook_that_is_down_gets_every_message_once_when_back_even_after_a_restart(world: World) -> None:
    hook = Hook()
    with_notify(world, hook.url)
    a = world.submit(time="10m")["slurm_job_id"]
    b = submit_no_retry(world)["slurm_job_id"]
    world.tick()
    world.slurm.start(a)
    world.slurm.start(b, node="spot2")
    world.advance(60)
    world.slurm.finish(a)
    world.slurm.finish(b, ok=False, exit_code=3)
    world.tick()
    outbox.tick(world.svc)  # the hook is down: connection refused
    first = rows(world)
    assert sorted(m.event for m in first) == ["job.completed", "job.failed"]
    # One try per tick for a target that fails: its other message waits, keeping the order.
    assert [m.tries for m in first] == [1, 0] and all(m.status == "pending" for m in first)
    assert "Connection refused" in first[0].last_error
    world.advance(5)
    outbox.tick(world.svc)  # not due yet (backoff 10 s)
    assert [m.tries for m in rows(world)] == [1, 0]
    world.advance(6)
    outbox.tick(world.svc)
    assert [m.tries for m in rows(world)] == [2, 0]  # next wait doubles: 20 s
    # The daemon restarts while the hook is still down: the outbox is in the database.
    world.restart()
    with_notify(world, hook.url)
    hook.up()
    try:
        world.advance(21)
        outbox.tick(world.svc)
        outbox.tick(world.svc)
        world.advance(60)
        outbox.tick(world.svc)
        assert [m.status for m in rows(world)] == ["delivered", "delivered"]
        bodies = [json.loads(body) for _, body in hook.got]
        assert sorted(b["event"] for b in bodies) == ["job.completed", "job.failed"]  # once each
        for headers, body in hook.got:
            want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            assert headers["X-Gbroker-Signature"] == want
            assert headers["X-Gbroker-Delivery"] == str(json.loads(body)["delivery"])
        text = next(b for b in bodies if b["event"] == "job.failed")["text"]
        assert text.startswith("gbroker: job ") and "(t, alice/vision) failed" in text, text
    finally:
        hook.down()


def test_backoff_doubles_up_to_its_ceiling_and_a_message_is_given_up_after_max_tries(world: World) -> None:
    cfg = NotifySettings(backoff_seconds=10, backoff_max_seconds=35, max_tries=3)
    assert [outbox.backoff(cfg, n) for n in (1, 2, 3, 4)] == [10, 20, 35, 35]
    hook = Hook()  # never up
    with_notify(world, hook.url)
    world.svc.settings = replace(world.svc.settings, notify=replace(world.svc.settings.notify, max_tries=2))
    a = world.submit(time="10m")["slurm_job_id"]
    world.tick()
    world.slurm.start(a)
    world.advance(30)
    world.slurm.finish(a)
    world.tick()
    outbox.tick(world.svc)
    world.advance(11)
    outbox.tick(world.svc)
    (m,) = rows(world)
    assert (m.status, m.tries) == ("dead", 2)


def test_only_subscribed_users_and_groups_are_told(world: World) -> None:
    hook = Hook()
    with_notify(world, hook.url)
    world.svc.settings = replace(world.svc.settings, notify=replace(
        world.svc.settings.notify, subscriptions=(Subscription("lab", events=("job.completed",), groups=("climate",)),)))
    a = world.submit(time="10m")["slurm_job_id"]  # alice, vision: not subscribed
    world.tick()
    world.slurm.start(a)
    world.advance(30)
    world.slurm.finish(a)
    world.tick()
    outbox.tick(world.svc)
    assert rows(world) == []


def test_a_budget_alert_reaches_its_own_webhook_through_the_outbox_after_it_was_down(world: World) -> None:
    hook = Hook()
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.10",
                                     "thresholds": "50", "alert_url": hook.url})
    sid = world.submit(time="1m")["slurm_job_id"]
    world.tick()
    world.slurm.start(sid)
    world.advance(60)
    world.slurm.finish(sid)
    world.tick()
    outbox.tick(world.svc)
    assert [(m.event, m.status, m.tries) for m in rows(world)] == [("budget.threshold", "pending", 1)]
    hook.up()
    try:
        world.advance(31)
        outbox.tick(world.svc)
        got = [json.loads(b) for _, b in hook.got]
        assert [(g["group"], g["threshold_pct"], g["spent"], g["event"]) for g in got] == [
            ("vision", 50, "$0.06", "budget.threshold")]
        assert got[0]["text"].startswith("gbroker: group vision crossed 50%")
    finally:
        hook.down()


def test_money_in_notifications_names_the_lab_currency() -> None:
    from broker.ops.notify import money_text

    assert money_text(1_234_500_000, "USD") == "$1,234.50"
    assert money_text(60_000, "EUR") == "EUR 0.06"


def test_the_lab_currency_is_how_the_daemon_writes_every_amount(world: World, tmp_path: Path) -> None:
    """build_services takes the currency from the settings; every amount the daemon writes uses it."""
    from broker import amount
    from broker.wiring import build_services
    from ledger_fakes import ROOT

    try:
        build_services(replace(world.svc.settings, currency="EUR", db_url=f"sqlite:///{tmp_path / 'eur.db'}",
                               slurm_backend="cli"))
        budgets = world.ops()["budget_list"](ROOT, {})["budgets"]
        assert [(b["amount"], b["left"]) for b in budgets] == [("EUR 100.00", "EUR 100.00")] * 2
        assert world.ops()["report"](ROOT, {})["total"]["spend"] == "EUR 0.00"
        amount.show_in("USD")
        assert world.ops()["report"](ROOT, {})["total"]["spend"] == "$0.00"
    finally:
        amount.show_in("USD")


def test_a_move_to_on_demand_is_read_from_the_events_data_not_its_words() -> None:
    from broker.db.models import Event
    from broker.ops.notify import classify

    def ev(kind: str, message: str, data: dict[str, Any] | None = None) -> Event:
        return Event(kind=kind, message=message, data_json=json.dumps(data or {}))

    assert classify(ev("reclaimed", "attempt 1 reclaimed on spot1; policy: resume_spot — x",
                       {"policy": "move_ondemand"})) == ["job.reclaimed", "job.moved_to_ondemand"]
    # The words no longer decide: a reason that happens to quote the action does not make a move.
    assert classify(ev("reclaimed", "policy: resume_spot — not policy: move_ondemand",
                       {"policy": "resume_spot"})) == ["job.reclaimed"]
    assert classify(ev("fallback", "moved to od", {"to_capacity": "ondemand"})) == ["job.moved_to_ondemand"]
    assert classify(ev("moved", "pieces 3-4 requeued on ondemand", {"to_capacity": "ondemand"})) == [
        "job.moved_to_ondemand"]  # an array's pieces (not told before)
    # Events stored before they carried the data are still read from their text.
    assert classify(ev("preempted", "attempt 2 preempted; policy: move_ondemand — d")) == [
        "job.reclaimed", "job.moved_to_ondemand"]
    assert classify(ev("fallback", "moved to ondemand to meet the deadline (x)")) == ["job.moved_to_ondemand"]


def test_a_reclaim_event_carries_the_policys_action(world: World) -> None:
    from broker.db.models import Event
    from broker.ops.notify import classify
    from policies import Action

    reclaimed_after_two_minutes(world)
    with world.svc.sessions() as s:
        (ev,) = s.execute(select(Event).where(Event.kind == "reclaimed")).scalars()
        action = json.loads(ev.data_json)["policy"]
        assert action in {a.value for a in Action} and f"policy: {action} " in ev.message
        assert ("job.moved_to_ondemand" in classify(ev)) == (action == Action.MOVE_ONDEMAND.value)


def test_deadline_at_risk_is_told_once(world: World) -> None:
    hook = Hook()
    with_notify(world, hook.url)
    world.submit(time="60m", deadline_in_s=2 * 3600)
    world.tick()
    outbox.tick(world.svc)
    assert rows(world) == []  # 2 h left for at most 1 h of work
    world.advance(3600 + 120)
    world.tick()
    outbox.tick(world.svc)
    world.advance(60)
    outbox.tick(world.svc)
    events = [m.event for m in rows(world)]
    assert events.count("job.deadline_at_risk") == 1, events  # (the policy may move it to on-demand too)


# -- health and metrics ------------------------------------------------------------------------
class Mono:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_readyz_needs_the_lease_a_recent_tick_and_slurm(world: World) -> None:
    mono = Mono()
    stats = DaemonStats(clock=mono)
    svc = world.svc
    svc.settings = replace(svc.settings, tick_seconds=1, metrics=replace(svc.settings.metrics,
                                                                        ready_tick_age_seconds=5))
    r = readiness(svc, stats)
    assert not r.ready and r.checks["lease"] != "ok" and r.checks["tick"] == "no reconcile tick has finished yet"
    stats.lease_ok("me:1")
    stats.timed("reconcile", lambda: None)()
    assert readiness(svc, stats).ready
    mono.t += 6
    r = readiness(svc, stats)
    assert not r.ready and r.checks["tick"] == "last reconcile tick finished 6s ago (limit 5s)"
    stats.lease_ok("me:1")
    stats.timed("reconcile", lambda: None)()
    svc.slurm_down(world.clock.now(), "test")
    r = readiness(svc, stats)
    assert not r.ready and r.checks["slurm"].startswith("Slurm controller unreachable since")
    svc.slurm_up(world.clock.now())
    stats.lease_gone()
    assert readiness(svc, stats).checks == {"lease": "this daemon does not hold the lease", "tick": "ok",
                                            "slurm": "ok"}


def test_metrics_count_jobs_reclaims_spend_ticks_and_slurm_errors(world: World) -> None:
    stats = DaemonStats()
    world.svc.backend = CountingBackend(world.svc.backend, stats)  # type: ignore[assignment]
    reclaimed_after_two_minutes(world)
    world.tick()
    stats.timed("reconcile", world.tick)()

    def boom() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        stats.timed("ledger", boom)()
    text = generate_latest(registry(world.svc, stats)).decode()
    assert 'gbroker_reclaims_total{group="vision"} 1.0' in text
    assert 'gbroker_tick_duration_seconds_count{tick="reconcile"} 1.0' in text
    assert 'gbroker_tick_errors_total{tick="ledger"} 1.0' in text
    assert 'gbroker_slurm_calls_total{call="jobs"}' in text
    assert 'gbroker_budget_micros{currency="USD",group="vision",semester="2026-fall"} 1e+08' in text
    assert 'gbroker_spend_micros{currency="USD",group="vision",semester="2026-fall"}' in text
    assert 'gbroker_database_up 1.0' in text
    jobs = [ln for ln in text.splitlines() if ln.startswith("gbroker_jobs{")]
    assert jobs and all('group="vision"' in ln for ln in jobs), jobs


def test_counting_backend_counts_errors_and_raises_them_again() -> None:
    class B:
        name = "fake"

        def jobs(self) -> list[int]:
            raise OSError("controller down")

    stats = DaemonStats()
    b = CountingBackend(B(), stats)
    assert b.name == "fake"
    with pytest.raises(OSError):
        b.jobs()
    assert stats.slurm_errors == {("jobs", "OSError"): 1}


# -- settings ------------------------------------------------------------------------------
def test_semester_days_are_local_midnight_in_the_lab_time_zone(world: World) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    assert parse_when("2027-06-01", datetime.now(UTC), tz=berlin).astimezone(UTC) == datetime(2027, 5, 31, 22,
                                                                                                tzinfo=UTC)
    # The day DST ends has 25 hours: the end of 2026-10-25 is local midnight, 23:00 UTC.
    assert parse_when("2026-10-25", datetime.now(UTC), tz=berlin, end_of_day=True).astimezone(UTC) == datetime(
        2026, 10, 25, 23, tzinfo=UTC)
    world.svc.settings = replace(world.svc.settings, timezone="Europe/Berlin")
    sem = world.ops()["semester_add"](ROOT, {"name": "2027-summer", "start": "2027-06-01", "end": "2027-08-31"})
    assert (sem["starts_at"], sem["ends_at"]) == ("2027-05-31T22:00:00Z", "2027-08-31T22:00:00Z")
    world.svc.settings = replace(world.svc.settings, timezone="UTC")
    sem = world.ops()["semester_add"](ROOT, {"name": "2027-autumn", "start": "2027-09-01", "end": "2027-12-31"})
    assert (sem["starts_at"], sem["ends_at"]) == ("2027-09-01T00:00:00Z", "2028-01-01T00:00:00Z")


GOOD = """\
timezone = "America/New_York"
currency = "EUR"
db_url = "postgresql://gb:pw@db/gb"
[metrics]
listen = "127.0.0.1:9464"
[notify.targets.lab-slack]
kind = "webhook"
url = "https://hooks.example/x"
secret = "do-not-print"
[notify.targets.ops-mail]
kind = "email"
to = ["ops@lab.example"]
[[notify.subscriptions]]
target = "lab-slack"
groups = ["Vision"]
events = ["job.failed"]
"""


def _check(tmp_path: Path, text: str, *args: str) -> Any:
    path = tmp_path / "gbroker.toml"
    path.write_text(text)
    return CliRunner().invoke(cli, ["config", "check", str(path), *args], env={"GBROKER_DB_URL": ""})


def test_config_check_prints_the_resolved_settings_without_secrets(tmp_path: Path) -> None:
    r = _check(tmp_path, GOOD)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == f"{tmp_path / 'gbroker.toml'}: ok"
    assert '  timezone = "America/New_York"' in r.output and '  currency = "EUR"' in r.output
    assert '"listen": "127.0.0.1:9464"' in r.output
    assert "do-not-print" not in r.output and "pw@" not in r.output and '"signed": true' in r.output
    r = _check(tmp_path, GOOD, "--json")
    got = json.loads(r.output)["settings"]
    assert got["notify"]["subscriptions"] == [{"target": "lab-slack", "events": ["job.failed"], "users": [],
                                               "groups": ["vision"]}]
    assert got["db_url"] == "postgresql://***@db/gb"


@pytest.mark.parametrize(("text", "error", "hint"), [
    ('timezone = "Mars/Olympus"\n', "timezone = 'Mars/Olympus' is not a time zone", 'e.g. timezone = "Europe/Berlin"'),
    ('currency = "euro"\n', "currency = 'euro' is not an ISO 4217 code", "three capital letters"),
    ('[metrics]\nlisten = "0.0.0.0:9464"\n', "listen = '0.0.0.0:9464' is reachable from other machines",
     "allow_remote = true"),
    ('[metrics]\nlisten = "9464"\n', "listen = '9464' is not HOST:PORT", "127.0.0.1:9464"),
    ('[[notify.subscriptions]]\ntarget = "slack"\n', "target = 'slack' is not a [notify.targets.NAME]",
     "targets: none defined"),
    ('[notify.targets.x]\nkind = "command"\nargv = ["page"]\n', "argv[0] = 'page': give the program's absolute path",
     None),
    ('[notify.targets.x]\nkind = "webhook"\nurl = "http://h/"\n[[notify.subscriptions]]\ntarget = "x"\n'
     'events = ["job.done"]\n', "unknown event(s) ['job.done']", "events: job.completed, job.failed"),
    ('[notify.targets.x]\nkind = "webhook"\nurl = "http://h/"\n[[notify.subscriptions]]\ntarget = "x"\n'
     'events = []\n', "events = [] subscribes to nothing", "leave events out for all"),
])
def test_a_bad_config_says_what_is_wrong_and_how_to_fix_it(tmp_path: Path, text: str, error: str,
                                                            hint: str | None) -> None:
    r = _check(tmp_path, text)
    assert r.exit_code == ConfigError.exit_code, r.output
    assert f"gbroker: error: {tmp_path / 'gbroker.toml'}: " in r.output and error in r.output, r.output
    if hint:
        assert "hint: " in r.output and hint in r.output, r.output


@pytest.mark.parametrize(("text", "error", "hint"), [
    ('policy = "nosuch"\n', "unknown policy 'nosuch'", "set policy to one of: gbroker, gbroker-markov, gepa"),
    ('node_provider = "gcp"\n', "unknown node provider 'gcp'", "valid providers: aws, command, local"),
    ('node_provider = "command"\n[providers.command]\nresume = ["/bin/true"]\nsuspend = ["/bin/true"]\n'
     'colour = "red"\n', "bad settings for node provider 'command': unknown setting(s) colour", "accepted settings:"),
    ('hook_user = ""\n', "hook_user = '' is not a user of this machine", "budget alert commands run as it"),
    ('hook_user = "no-such-user-here"\n', "hook_user = 'no-such-user-here' is not a user",
     'budget alert commands run as it: name one that exists (default "nobody")'),
])
def test_config_check_checks_what_the_daemon_checks_at_start(tmp_path: Path, text: str, error: str,
                                                             hint: str) -> None:
    r = _check(tmp_path, text)
    assert r.exit_code == ConfigError.exit_code, r.output
    assert f"gbroker: error: {error}" in r.output and f"hint: {hint}" in r.output, r.output


def test_a_missing_default_hook_user_is_a_note_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    real = pwd.getpwnam

    def getpwnam(name: str) -> Any:
        if name == "nobody":  # a minimal image without it
            raise KeyError(name)
        return real(name)

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    r = _check(tmp_path, 'tick_seconds = 5\n')
    assert r.exit_code == 0, r.output
    assert "note: hook_user 'nobody' (the default) is not a user of this machine" in r.output, r.output
    r = _check(tmp_path, 'hook_user = "nobody"\n')  # the same name, written: still the default's case
    assert r.exit_code == 0 and "note: hook_user 'nobody'" in r.output, r.output


def test_a_daemon_with_an_unknown_policy_stops_with_a_configuration_error() -> None:
    from broker.wiring import make_policy

    with pytest.raises(ConfigError, match="unknown policy 'nosuch'") as info:
        make_policy(Settings(policy="nosuch"))
    assert "uniform-progress" in (info.value.hint or "")


PROXIED = '[metrics]\nlisten = "127.0.0.1:9464"\n[web]\ntrust_proxy_header = "X-Forwarded-User"\nproxy_secret_file = "{}"\n'


def test_config_check_reads_the_proxy_secret_as_root_and_says_so_when_it_cannot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "proxy-secret"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    r = _check(tmp_path, PROXIED.format(secret))
    assert r.exit_code == ConfigError.exit_code and f"proxy_secret_file {secret}: No such file" in r.output, r.output
    no_dashboard = PROXIED.format(secret).replace('[metrics]\nlisten = "127.0.0.1:9464"\n', "")
    r = _check(tmp_path, no_dashboard)  # the daemon reads the secret only with the dashboard on
    assert r.exit_code == 0 and "not checked" not in r.output, r.output
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = _check(tmp_path, PROXIED.format(secret))
    assert r.exit_code == 0, r.output
    assert f"note: [web] proxy_secret_file {secret} not checked" in r.output and "run gbroker config check as root" \
        in r.output, r.output


def test_config_check_without_a_file_runs_on_defaults_as_the_daemon_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.config

    missing = tmp_path / "none.toml"
    monkeypatch.setattr(broker.config, "DEFAULT_CONFIG_PATH", missing)
    r = CliRunner().invoke(cli, ["config", "check"], env={"GBROKER_CONFIG": None, "GBROKER_DB_URL": ""})
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == f"{missing}: ok (no such file: defaults and environment only)"
    for named in (["config", "check", str(missing)], ["--config", str(missing), "config", "check"]):
        r = CliRunner().invoke(cli, named, env={"GBROKER_CONFIG": None, "GBROKER_DB_URL": ""})
        assert r.exit_code == ConfigError.exit_code and f"config file {missing} does not exist" in r.output, r.output


def test_a_remote_listener_must_be_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9464"\nallow_remote = true\n')
    m = load_settings(path, env={}).metrics
    assert (m.host, m.port, m.enabled) == ("0.0.0.0", 9464, True)


def test_reload_applies_what_can_change_and_names_what_needs_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('tick_seconds = 5\n[metrics]\nlisten = "127.0.0.1:9464"\n')
    old = load_settings(path, env={})
    path.write_text('tick_seconds = 9\ntimezone = "Asia/Tokyo"\n[metrics]\nlisten = "127.0.0.1:9465"\n'
                    'ready_tick_age_seconds = 7\n'
                    '[notify.targets.x]\nkind = "webhook"\nurl = "http://h/"\n')
    merged, applied, restart = merge(old, load_settings(path, env={}))
    assert sorted(applied) == ["metrics.ready_tick_age_seconds", "notify", "timezone"]
    assert sorted(restart) == ["metrics.listen", "tick_seconds"]
    assert merged.tick_seconds == 5 and merged.timezone == "Asia/Tokyo" and merged.metrics.port == 9464
    assert merged.metrics.ready_tick_age_seconds == 7 and merged.notify.target("x") is not None


# -- systemd ---------------------------------------------------------------------------------
def test_sd_notify_sends_ready_to_the_notify_socket_and_nothing_without_it() -> None:
    where = Path(tempfile.mkdtemp(prefix="gb-notify-")) / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(where))
        s.settimeout(2)
        assert systemd.notify("READY=1", env={"NOTIFY_SOCKET": str(where)})
        assert s.recv(100) == b"READY=1"
    assert not systemd.notify("READY=1", env={})
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}) == 10
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}) is None
    assert systemd.watchdog_interval({}) is None


def test_journald_lines_carry_the_syslog_priority() -> None:
    handler = systemd.log_handler({"JOURNAL_STREAM": "8:1234"})
    rec = logging.LogRecord("broker.x", logging.ERROR, __file__, 1, "lost the lease", None, None)
    assert handler.format(rec) == "<3>broker.x: lost the lease"
    rec = logging.LogRecord("broker.x", logging.WARNING, __file__, 1, "two\nlines", None, None)
    assert handler.format(rec) == "<4>broker.x: two\n<4>lines"
    plain = systemd.log_handler({})
    assert not plain.format(rec).startswith("<")


def test_the_readme_unit_is_read_by_systemd_without_a_complaint(tmp_path: Path) -> None:
    """The unit operators copy: systemd's own parser reads every line of it (an unknown key or a bad
    value is skipped by systemd with a warning only), and lines without a priority are errors."""
    import subprocess

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    unit = readme.split("```ini\n", 1)[1].split("```", 1)[0]
    assert "Type=notify" in unit and "\nSyslogLevel=err\n" in unit
    (tmp_path / "gbroker.service").write_text(unit)
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "gbroker.service")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "" and p.stdout == "", p.stderr
    (tmp_path / "typo.service").write_text(unit.replace("SyslogLevel=err", "SyslogLevel=eror"))
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "typo.service")],
                       capture_output=True, text=True, timeout=60)
    assert "Failed to parse log level" in p.stderr  # the check can fail


def test_idle_connections_cannot_pile_up_in_the_listener(world: World) -> None:
    import socket
    import time
    import urllib.error
    import urllib.request

    from broker.ops.listener import OpsListener

    ops = OpsListener(world.svc, DaemonStats(), "127.0.0.1", 0, max_connections=2, root_reserve=0,
                      request_timeout_s=0.5)
    ops.start()
    base = f"http://127.0.0.1:{ops.address[1]}"
    idle = [socket.create_connection(ops.address, timeout=5) for _ in range(2)]  # connect, send nothing
    try:
        time.sleep(0.1)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert e.value.code == 503 and b"too many connections" in e.value.read()
        # A silent connection is dropped after the request timeout, and its slot serves again.
        # The handler closes the socket just before it hands its slot back, so a request sent the
        # moment the client sees the close may still be told 503: ask again for up to 2 s.
        assert all(c.recv(1) == b"" for c in idle)
        until = time.monotonic() + 2
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
                    assert (r.status, r.read()) == (200, b"ok\n")
                break
            except urllib.error.HTTPError as busy:
                assert busy.code == 503 and time.monotonic() < until, busy
                time.sleep(0.05)
    finally:
        for c in idle:
            c.close()
        ops.stop()


def test_a_connection_that_trickles_bytes_is_cut_at_its_deadline(world: World) -> None:
    import socket
    import time
    import urllib.request

    from broker.ops.listener import OpsListener

    ops = OpsListener(world.svc, DaemonStats(), "127.0.0.1", 0, max_connections=1, request_timeout_s=0.5,
                      connection_deadline_s=1.5)
    ops.start()
    slow = socket.create_connection(ops.address, timeout=5)
    try:
        started = time.monotonic()
        closed = False
        for byte in b"GET /healthz HTTP/1.0\r\nX-Drip: " + b"a" * 40:  # a byte well inside every read timeout
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - started > 4:
                break
        closed = closed or slow.recv(1) == b""
        assert closed and time.monotonic() - started < 4, "the trickling connection kept its slot"
        with urllib.request.urlopen(f"http://127.0.0.1:{ops.address[1]}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        slow.close()
        ops.stop()


def test_the_listener_serves_three_read_only_pages_and_says_when_its_port_is_taken(world: World) -> None:
    import urllib.error
    import urllib.request

    from broker.ops.listener import OpsListener

    stats = DaemonStats()
    ops = OpsListener(world.svc, stats, "127.0.0.1", 0)
    ops.start()
    base = f"http://127.0.0.1:{ops.address[1]}"
    try:
        with urllib.request.urlopen(base + "/healthz") as r:
            assert (r.status, r.read()) == (200, b"ok\n")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/readyz")
        assert e.value.code == 503 and json.loads(e.value.read())["checks"]["lease"] != "ok"
        with urllib.request.urlopen(base + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain") and b"gbroker_database_up 1.0" in r.read()
        for path, method, code in (("/etc/passwd", "GET", 404), ("/metrics", "POST", 405)):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(base + path, method=method, data=b"" if method ==
                                                              "POST" else None))
            assert e.value.code == code
        with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1:\d+ for metrics"):
            OpsListener(world.svc, stats, "127.0.0.1", ops.address[1])
    finally:
        ops.stop()


def test_config_check_and_every_command_name_a_gbroker_variable_nobody_reads(tmp_path: Path) -> None:
    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)

    path = tmp_path / "gbroker.toml"
    path.write_text(f'socket = "{tmp_path}/none.sock"\n')
    env = {"GBROKER_DB_URL": "", "GBROKER_SOCKT": f"{tmp_path}/meant.sock", "GBROKER_CONFIG": str(path),
           "GBROKER_SOCKET": None}
    r = CliRunner().invoke(cli, ["config", "check"], env=env)
    assert r.exit_code == 0, r.output
    assert "note: GBROKER_SOCKT is not a gbroker setting and is ignored (did you mean GBROKER_SOCKET?)" in r.output
    r = CliRunner().invoke(cli, ["status"], env=env)
    assert r.exit_code != 0
    assert "gbroker: warning: GBROKER_SOCKT is not a gbroker setting and is ignored" in r.output
    assert f"{tmp_path}/none.sock" in r.output  # the command still says where it looked
