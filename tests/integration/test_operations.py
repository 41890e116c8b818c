"""Operations on the real dev cluster with a real daemon: /metrics after a reclaim, /healthz and /readyz,
and a webhook that is down receiving every notification once when it is back, across a daemon restart.

One daemon serves the three checks (a daemon start and a reclaim are the slow parts): the listener is a
real TCP socket, the webhook a real local HTTP server, the reclaim a real node failure in Slurm.
"""

from __future__ import annotations

import http.server
import json
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from broker_fixtures import BrokerDaemon, daemon_with_config, start_controller, stop_controller

pytestmark = pytest.mark.slurm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Hook:
    """A webhook receiver on a fixed port: closed (connection refused) until ``up``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.got: list[dict[str, Any]] = []
        self.srv: http.server.HTTPServer | None = None

    def up(self) -> None:
        got = self.got

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = http.server.HTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.srv is not None:
            self.srv.shutdown()
            self.srv.server_close()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            return float(m.group(2))
    return 0.0


def wait_for(what: str, fn: Callable[[], Any], timeout: float, d: BrokerDaemon) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s\n{d.log_tail()}")


def config(metrics_port: int, hook: Hook) -> str:
    return f"""
slurm_timeout_seconds = 5

[metrics]
listen = "127.0.0.1:{metrics_port}"
ready_tick_age_seconds = 10

[notify]
tick_seconds = 0.5
backoff_seconds = 0.5
backoff_max_seconds = 2
max_tries = 1000
timeout_seconds = 2

[notify.targets.hook]
kind = "webhook"
url = "http://127.0.0.1:{hook.port}/notify"
secret = "test-secret"

[[notify.subscriptions]]
target = "hook"
users = ["alice"]
"""


def test_metrics_after_a_reclaim_health_and_a_webhook_down_across_a_restart(slurm_cluster):
    port, hook = free_port(), Hook()
    with daemon_with_config(slurm_cluster, config(port, hook)) as d:
        t0 = time.monotonic()
        assert get(port, "/healthz") == (200, "ok\n")
        code, body = wait_for("ready", lambda: (r := get(port, "/readyz"))[0] == 200 and r, 30, d)
        assert json.loads(body) == {"ready": True, "checks": {"lease": "ok", "tick": "ok", "slurm": "ok"}}
        before = get(port, "/metrics")[1]
        assert sample(before, "gbroker_lease_held") == 1
        assert sample(before, "gbroker_reclaims_total") == 0

        # A spot job (the whole node, so the reclaim touches nobody else's job), reclaimed while it runs.
        r = d.cli("submit", "--json", "--group", "vision", "--gpus", "4", "--time", "10m", "--name", "ops-reclaim",
                  "--", "sleep", "10")
        assert r.code == 0, r.err
        job = r.json()
        running = d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
        slurm_cluster.reclaim(running["attempts"][-1]["nodes"])
        d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=300)

        # (a) The scrape: the counters moved.
        # The notify tick (every 0.5 s) turns the job's events into outbox rows after the job ends, so
        # the scrape is awaited until both are there.
        text = wait_for("reclaim counted, both notices queued", lambda: (m := get(port, "/metrics")[1])
                        and sample(m, "gbroker_reclaims_total") >= 1
                        and sample(m, "gbroker_outbox_messages", state="pending") >= 2 and m, 30, d)
        assert sample(text, "gbroker_tick_duration_seconds_count", tick="reconcile") > sample(
            before, "gbroker_tick_duration_seconds_count", tick="reconcile")
        assert sample(text, "gbroker_slurm_calls_total", call="jobs") > sample(
            before, "gbroker_slurm_calls_total", call="jobs")
        assert sample(text, "gbroker_jobs", state="completed") >= 1
        assert 'gbroker_lease_holder_info{holder="' in text
        # The hook is down: the messages wait in the outbox.
        assert sample(text, "gbroker_outbox_messages", state="pending") >= 2
        assert sample(text, "gbroker_outbox_messages", state="delivered") == 0

        # (b) A daemon restart while the hook is still down, then the hook comes back. This time the
        # daemon runs as under systemd: a notify socket, a watchdog, journald's stream.
        d.stop()
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify_path = d.workdir.parent / "notify.sock"
        notify.bind(str(notify_path))
        notify.settimeout(10)
        d.start(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="2000000", JOURNAL_STREAM="8:1")
        said = [notify.recv(4096).decode() for _ in range(2)]
        notify.close()
        assert sorted(m.split("\n")[0] for m in said) == ["READY=1", "WATCHDOG=1"], said
        assert any(ln.startswith("<6>broker.daemon: gbroker daemon up") for ln in d.log_tail(200).splitlines())
        hook.up()
        try:
            got = wait_for("every notification delivered", lambda: (
                {g["event"] for g in hook.got} >= {"job.reclaimed", "job.completed"} and hook.got), 30, d)
            time.sleep(1.5)  # three more notify ticks: a repeat, if one were made, would arrive now
            events = sorted(g["event"] for g in hook.got)
            assert events == ["job.completed", "job.reclaimed"], events  # once each
            assert all(g["job"]["id"] == job["id"] and g["text"].startswith(f"gbroker: job {job['id']} ")
                       for g in got)
            assert sample(get(port, "/metrics")[1], "gbroker_outbox_messages", state="delivered") == 2
        finally:
            hook.down()

        # (c) Slurm down: not ready, and it says why; ready again when the controller is back.
        stop_controller(slurm_cluster)
        try:
            # A Slurm call that hangs makes the tick old first (not ready either); once it times out, the
            # tick says the controller is unreachable.
            code, body = wait_for("not ready, Slurm down", lambda: (r := get(port, "/readyz"))[0] == 503
                                  and json.loads(r[1])["checks"]["slurm"] != "ok" and r, 60, d)
            checks = json.loads(body)["checks"]
            assert checks["slurm"].startswith("Slurm controller unreachable since"), checks
            assert get(port, "/healthz")[0] == 200  # the process is up
            errors = get(port, "/metrics")[1]
            assert sample(errors, "gbroker_slurm_up") == 0
        finally:
            start_controller(slurm_cluster)
        wait_for("ready again", lambda: get(port, "/readyz")[0] == 200, 120, d)

        # SIGHUP: a broken file changes nothing; a good one applies what can change and names the rest.
        cfg = d.workdir.parent / "gbroker.toml"
        good = cfg.read_text()
        cfg.write_text('timezone = "Mars/Olympus"\n' + good)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        wait_for("reload refused", lambda: "reload refused, keeping the running settings" in d.log_tail(), 10, d)
        assert "timezone = 'Mars/Olympus' is not a time zone" in d.log_tail()
        cfg.write_text('hook_user = "no-such-user-here"\n' + good)  # checked as at start
        d.proc.send_signal(signal.SIGHUP)
        wait_for("hook_user refused", lambda: "hook_user = 'no-such-user-here' is not a user of this machine"
                 in d.log_tail(), 10, d)
        cfg.write_text('timezone = "Europe/Berlin"\n' + good.replace("ready_tick_age_seconds = 10",
                                                                     "ready_tick_age_seconds = 20")
                       .replace(f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"))
        d.proc.send_signal(signal.SIGHUP)
        wait_for("reloaded", lambda: "settings reloaded: timezone, metrics.ready_tick_age_seconds" in d.log_tail(),
                 10, d)
        assert "restart the daemon to apply): metrics.listen" in d.log_tail()
        assert get(port, "/readyz")[0] == 200  # still on the port it started with
        print(f"ops integration: {time.monotonic() - t0:.1f}s")
