"""A notification's text as each target's markup reads it, and a webhook that answers with a redirect.

The markup functions are pure; the redirect is two real HTTP servers on
loopback and the real outbox on the service layer (a fake Slurm).
"""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import replace
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.db.ops_models import OutboxMessage
from broker.ops import markup, outbox
from broker.opsconfig import NotifySettings, Subscription, Target
from ledger_fakes import World, setup_lab

HOSTILE = "gb-x <!channel> <https://evil.example/login|gbroker: sign in again> & @here [x](https://e.example)"


def test_chat_text_shows_a_hostile_name_and_never_reads_it_as_markup() -> None:
    out = markup.for_chat(f"gbroker: job 7 ({HOSTILE}) failed")
    assert "<" not in out and ">" not in out
    assert "&lt;!channel&gt;" in out
    assert "&lt;https://evil.example/login|gbroker: sign in again&gt;" in out
    assert " &amp; " in out
    assert markup.for_chat("&lt;") == "&amp;lt;"  # already-escaped text is shown as written, not decoded
    assert "@here" not in out and "@" + markup.WORD_JOINER + "here" in out
    assert "](" not in out and "]" + markup.WORD_JOINER + "(" in out
    # gbroker's own words pass unchanged.
    plain_text = "gbroker: job 7 (train-1, alice/vision) completed: exit 0"
    assert markup.for_chat(plain_text) == plain_text


def test_control_characters_are_shown_escaped_newlines_and_tabs_kept() -> None:
    assert markup.plain("a\x1b]0;TITLE\x07\x1b[2J\tb\nc\r\x7f\x9b") == "a\\x1b]0;TITLE\\x07\\x1b[2J\tb\nc\\x0d\\x7f\\u009b"
    assert markup.for_chat("\x1b[2J") == "\\x1b[2J"


def test_a_mail_subject_is_one_line_with_no_header_of_its_own() -> None:
    subject = markup.header("job 7 (gb-x\r\nBcc: everyone@example.org\rX: y\n) failed \x1b[2J " + "é" * 300)
    assert "\r" not in subject and "\n" not in subject and "\x1b" not in subject
    assert len(subject) == markup.SUBJECT_MAX
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "gbroker", "ops@example.org", subject
    msg.set_content("body")
    parsed = BytesParser(policy=default_policy).parsebytes(msg.as_bytes())
    assert parsed["Bcc"] is None and parsed["X"] is None
    # Encoded (RFC 2047) and read back whole (folding may change how many spaces are at a fold).
    assert str(parsed["Subject"]).split() == subject.split()


# -- a redirect is a failed delivery ---------------------------------------------------------
def _server(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.HTTPServer:
    srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def test_a_webhook_answering_with_a_redirect_is_not_followed_and_not_delivered(world: World,
                                                                               caplog: pytest.LogCaptureFixture) -> None:
    inner_got: list[str] = []
    hook_got: list[dict[str, Any]] = []

    class Inner(http.server.BaseHTTPRequestHandler):
        """Another loopback service, which the receiver's redirect points at."""

        def do_GET(self) -> None:  # noqa: N802
            inner_got.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

        def log_message(self, *a: Any) -> None:
            pass

    inner = _server(Inner)
    target = f"http://127.0.0.1:{inner.server_address[1]}/x"

    class Redirector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            hook_got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    hook = _server(Redirector)
    try:
        cfg = NotifySettings(targets=(Target("lab", "webhook", url=f"http://127.0.0.1:{hook.server_address[1]}/hook"),),
                             subscriptions=(Subscription("lab", users=("alice",)),),
                             backoff_seconds=10, backoff_max_seconds=40, max_tries=2, timeout_seconds=2)
        world.svc.settings = replace(world.svc.settings, notify=cfg)
        a = world.submit(time="10m")["slurm_job_id"]
        world.tick()
        world.slurm.start(a)
        world.advance(30)
        world.slurm.finish(a)
        world.tick()
        with caplog.at_level("WARNING", logger="broker.ops.outbox"):
            outbox.tick(world.svc)
        (logged,) = [r.getMessage() for r in caplog.records if r.name == "broker.ops.outbox"]
        assert "failed (try 1 of 2)" in logged and "answered 302" in logged, logged
        with world.svc.sessions() as s:
            (m,) = s.execute(select(OutboxMessage)).scalars()
            assert (m.status, m.tries) == ("pending", 1)
            assert "answered 302" in m.last_error and target in m.last_error and "not followed" in m.last_error
        world.advance(11)
        outbox.tick(world.svc)  # retried per the outbox's rules, then given up: never delivered
        with world.svc.sessions() as s:
            (m,) = s.execute(select(OutboxMessage)).scalars()
            assert (m.status, m.tries, m.delivered_at) == ("dead", 2, None)
        assert len(hook_got) == 2 and hook_got[0]["event"] == "job.completed"
        assert inner_got == []  # the service the redirect named never got a request
    finally:
        for srv in (hook, inner):
            srv.shutdown()
            srv.server_close()


def test_only_a_2xx_answer_delivers(world: World) -> None:
    got: list[int] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            code = (304, 200)[len(got)]
            got.append(code)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    srv = _server(Hook)
    try:
        t = Target("lab", "webhook", url=f"http://127.0.0.1:{srv.server_address[1]}/hook")
        with pytest.raises(outbox.DeliveryFailed, match="304"):
            outbox.post(t, 1, {"text": "x"}, "job.completed", 2)
        outbox.post(t, 2, {"text": "x"}, "job.completed", 2)
        assert got == [304, 200]
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_webhook_text_is_escaped_and_the_raw_fields_stay(world: World) -> None:
    bodies: list[dict[str, Any]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    srv = _server(Hook)
    try:
        t = Target("lab", "webhook", url=f"http://127.0.0.1:{srv.server_address[1]}/hook")
        outbox.post(t, 1, {"text": f"gbroker: job 7 ({HOSTILE}) failed", "message": HOSTILE}, "job.failed", 2)
        (body,) = bodies
        assert "<!channel>" not in body["text"] and "&lt;!channel&gt;" in body["text"]
        assert body["message"] == HOSTILE
    finally:
        srv.shutdown()
        srv.server_close()



# -- the whole path: a renamed Slurm job's failure notice --------------------------------------
RENAMED = "gb-x <!channel> <https://evil.example/login|gbroker: sign in again>"


def _chat_hook(bodies: list[dict[str, Any]]) -> http.server.HTTPServer:
    """A Slack-style receiver on loopback that keeps every body it is sent."""

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    return _server(Hook)


def _as_slack_shows(text: str) -> str:
    """What a reader sees of Slack's three entities."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_a_job_renamed_in_slurm_reaches_chat_as_text_and_an_ordinary_one_unchanged(world: World) -> None:
    bodies: list[dict[str, Any]] = []
    srv = _chat_hook(bodies)
    try:
        cfg = NotifySettings(targets=(Target("lab", "webhook", url=f"http://127.0.0.1:{srv.server_address[1]}/hook"),),
                             subscriptions=(Subscription("lab", users=("alice",)),), timeout_seconds=2)
        world.svc.settings = replace(world.svc.settings, notify=cfg)
        hostile = world.submit(time="10m")["slurm_job_id"]
        ordinary = world.submit(time="10m", name="train-1.v2_a")["slurm_job_id"]
        world.tick()
        # alice's `scontrol update JobId=... Name=... Comment=...`: the job is no longer gbroker's
        world.slurm.jobs_by_id[hostile].name, world.slurm.jobs_by_id[hostile].comment = RENAMED, "mine-now"
        world.slurm.start(ordinary)
        world.tick()
        world.advance(30)
        world.slurm.finish(ordinary)
        world.tick()  # gbroker fails the renamed job, its reason quoting the name; the other completes
        outbox.tick(world.svc)
        by_event = {b["job"]["id"]: b for b in bodies}
        with world.svc.sessions() as s:
            statuses = {m.status for m in s.execute(select(OutboxMessage)).scalars()}
            rows = {m.event_id: json.loads(m.payload_json) for m in s.execute(select(OutboxMessage)).scalars()}
        assert statuses == {"delivered"} and len(bodies) == 2
        bad, good = by_event[1], by_event[2]
        assert (bad["event"], good["event"]) == ("job.failed", "job.completed")
        assert RENAMED in bad["message"]  # the reason quotes the name; the payload's own fields stay raw
        assert "<!channel>" not in bad["text"], bad["text"]
        assert "<https://" not in bad["text"] and "|gbroker: sign in again>" not in bad["text"], bad["text"]
        assert "&lt;!channel&gt; &lt;https://evil.example/login|gbroker: sign in again&gt;" in bad["text"]
        assert "&amp;lt;" not in bad["text"]  # escaped once
        # An ordinary job's notice reads as gbroker wrote it: its name verbatim, and only its own
        # "->" written as Slack's entity (which Slack shows as ->).
        (queued,) = [p for p in rows.values() if p["job"]["id"] == 2]
        assert "job 2 (train-1.v2_a, alice/vision) completed: running -&gt; completed" in good["text"], good["text"]
        assert _as_slack_shows(good["text"]) == queued["text"]
        assert _as_slack_shows(bad["text"]).count(RENAMED) == 1  # shown once, as the text it is
    finally:
        srv.shutdown()
        srv.server_close()
