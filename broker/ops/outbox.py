"""Delivering the outbox: webhook (signed JSON), email through the local MTA, or a command.

The notify tick takes the due rows in order, delivers each outside any
transaction or lock, and records the outcome: delivered, or one more try
and the next one after an exponential backoff (``[notify] backoff_seconds``
doubling up to ``backoff_max_seconds``), or dead after ``max_tries``. A
target's messages go in order: one that failed (or waits for its retry)
holds back the target's later ones, so a dead endpoint costs one timeout per
retry, not one per message. Delivery is at
least once: a daemon killed between a send and its record sends that one
message again after the restart; ``X-Gbroker-Delivery`` (the row id) lets a
receiver drop the repeat.

Webhook: POST of the JSON payload (Slack-compatible: it has ``text``, written
for Slack's and Mattermost's markup by ``broker.ops.markup``), with
``X-Gbroker-Signature: sha256=<hex HMAC-SHA256 of the body>`` when the target
has a ``secret``. Only a 2xx answer delivers a message: a redirect is never
followed (the root daemon would otherwise send the message wherever the
receiver points, another service on loopback included) and counts as a failed
try, retried like any other. Email: ``/usr/sbin/sendmail -oi -- <recipients>`` (argv,
no shell) as the target's user. Command: the admin's argv from the settings,
as the target's user (the settings' ``hook_user``, ``nobody``, by default),
the payload as JSON on stdin and as ``GBROKER_*`` variables.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from email.message import EmailMessage
from typing import Any

from sqlalchemy import select

from broker import proc
from broker.ops import markup
from broker.db.ops_models import OUTBOX_DEAD, OUTBOX_DELIVERED, OUTBOX_PENDING, OutboxMessage
from broker.errors import BrokerError
from broker.ops.notify import enqueue
from broker.opsconfig import SENDMAIL, NotifySettings, Target
from broker.state import Services, must_get

log = logging.getLogger(__name__)

DUE_BATCH = 100
PENDING_BATCH = 2000
MAX_ERROR = 500


class DeliveryFailed(Exception):
    pass


def backoff(cfg: NotifySettings, tries: int) -> float:
    """Seconds before try ``tries + 1``: backoff_seconds * 2**(tries-1), at most backoff_max_seconds."""
    return float(min(cfg.backoff_max_seconds, cfg.backoff_seconds * (2 ** max(0, tries - 1))))


def deliver_due(svc: Services, now: datetime) -> tuple[int, int]:
    """Deliver what is due; returns (delivered, failed) counts."""
    with svc.sessions() as s:
        pending = [(m.id, m.target, m.target_json, m.payload_json, m.event, m.next_at) for m in s.execute(
            select(OutboxMessage).where(OutboxMessage.status == OUTBOX_PENDING)
            .order_by(OutboxMessage.id).limit(PENDING_BATCH)).scalars()]
    # Per target, in order: a message waiting for its retry holds back the target's later ones.
    blocked: set[str] = set()
    done = failed = 0
    for msg_id, name, target_json, payload_json, event, next_at in pending:
        if name in blocked:
            continue
        if next_at > now or done + failed >= DUE_BATCH:
            blocked.add(name)
            continue
        error = ""
        try:
            send(svc, msg_id, json.loads(target_json), json.loads(payload_json), event)
        except (DeliveryFailed, BrokerError, OSError, ValueError) as exc:
            error = str(exc) or type(exc).__name__
        _record(svc, msg_id, error, svc.clock.now())
        if error:
            failed += 1
            blocked.add(name)
        else:
            done += 1
    return done, failed


def _record(svc: Services, msg_id: int, error: str, now: datetime) -> None:
    cfg = svc.settings.notify
    with svc.tx() as s:
        m = must_get(s, OutboxMessage, msg_id)
        m.tries += 1
        if not error:
            m.status, m.delivered_at, m.last_error = OUTBOX_DELIVERED, now, ""
            log.info("notification %s (%s) delivered to %s", m.id, m.event, m.target)
            return
        m.last_error = error[:MAX_ERROR]
        if m.tries >= cfg.max_tries:
            m.status = OUTBOX_DEAD
            log.error("notification %s (%s) to %s given up after %s tries: %s", m.id, m.event, m.target,
                      m.tries, m.last_error)
            return
        wait = backoff(cfg, m.tries)
        m.next_at = now + timedelta(seconds=wait)
        log.warning("notification %s (%s) to %s failed (try %s of %s), again in %.0fs: %s", m.id, m.event,
                    m.target, m.tries, cfg.max_tries, wait, m.last_error)


def resolve(svc: Services, target: dict[str, Any]) -> Target:
    """A row's target: a settings target by name (as the settings say now), or a budget's own hook."""
    if "name" in target:
        t = svc.settings.notify.target(str(target["name"]))
        if t is None:
            raise DeliveryFailed(f"target {target['name']!r} is no longer in [notify.targets]")
        return t
    if target.get("kind") == "webhook":
        return Target("budget-url", "webhook", url=str(target["url"]))
    if target.get("kind") == "command":
        return Target("budget-command", "command", argv=tuple(str(a) for a in target["argv"]))
    raise DeliveryFailed(f"unknown target {target!r}")


def send(svc: Services, msg_id: int, target: dict[str, Any], payload: dict[str, Any], event: str) -> None:
    t = resolve(svc, target)
    timeout = svc.settings.notify.timeout_seconds
    if t.kind == "webhook":
        post(t, msg_id, payload, event, timeout)
    elif t.kind == "email":
        mail(t, payload, t.user or svc.settings.hook_user, timeout)
    else:
        command(t, msg_id, payload, event, t.user or svc.settings.hook_user, timeout)


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is a failed delivery: the request is never sent again to where it points."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        where = str(newurl)[:200]
        fp.close()
        raise DeliveryFailed(f"{req.full_url} answered {code} {msg}, a redirect to {where}; "
                             "not followed (a webhook is delivered only by a 2xx answer)")


_OPENER = urllib.request.build_opener(_NoRedirects())


def post(t: Target, msg_id: int, payload: dict[str, Any], event: str, timeout: float) -> None:
    text = markup.for_chat(str(payload.get("text", "")))
    body = json.dumps({**payload, "text": text, "delivery": msg_id}, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "gbroker", "X-Gbroker-Event": event,
               "X-Gbroker-Delivery": str(msg_id)}
    if t.secret:
        headers["X-Gbroker-Signature"] = signature(t.secret, body)
    req = urllib.request.Request(t.url, data=body, method="POST", headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read(4096)
            if not 200 <= resp.status < 300:
                raise DeliveryFailed(f"{t.url} answered {resp.status}")
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"{t.url} answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryFailed(f"{t.url}: {getattr(exc, 'reason', exc)}") from None


def recipients(t: Target, payload: dict[str, Any]) -> list[str]:
    out = list(t.to)
    user = (payload.get("job") or {}).get("user")
    if t.to_owner and user:
        out.append(f"{user}@{t.mail_domain}" if t.mail_domain else str(user))
    return out


def mail(t: Target, payload: dict[str, Any], run_as: str, timeout: float) -> None:
    to = recipients(t, payload)
    if not to:
        return  # a budget message to an owner-only target: nobody to tell
    msg = EmailMessage()
    msg["From"] = t.sender
    msg["To"] = ", ".join(to)
    msg["Subject"] = markup.header(str(payload.get("text", "gbroker")))
    msg.set_content(markup.plain(str(payload.get("text", ""))) + "\n\n"
                    + json.dumps(payload, indent=2, sort_keys=True) + "\n")
    _run([SENDMAIL, "-oi", "--", *to], msg.as_bytes(), {}, run_as, timeout, "sendmail")


def command(t: Target, msg_id: int, payload: dict[str, Any], event: str, run_as: str, timeout: float) -> None:
    env = {"GBROKER_EVENT": event, "GBROKER_TEXT": str(payload.get("text", "")), "GBROKER_DELIVERY": str(msg_id)}
    if event == "budget.threshold":  # the variables budget alert commands have always had
        env.update({
            "GBROKER_ALERT_GROUP": str(payload.get("group", "")),
            "GBROKER_ALERT_SEMESTER": str(payload.get("semester", "")),
            "GBROKER_ALERT_THRESHOLD": str(payload.get("threshold_pct", "")),
            "GBROKER_ALERT_SPENT": str(payload.get("spent", "")),
            "GBROKER_ALERT_AMOUNT": str(payload.get("amount", "")),
            "GBROKER_ALERT_MESSAGE": str(payload.get("message", "")),
        })
    _run(list(t.argv), json.dumps({**payload, "delivery": msg_id}, sort_keys=True).encode(), env, run_as,
         timeout, t.argv[0])


def _run(argv: list[str], stdin: bytes, env: dict[str, str], run_as: str, timeout: float, what: str) -> None:
    full = {"PATH": proc.SAFE_PATH, "LANG": "C.UTF-8", **env}
    result = proc.run(argv, env=full, timeout_s=timeout, user=proc.identity(run_as), input=stdin,
                      max_output=64 * 1024)
    if result.timed_out:
        raise DeliveryFailed(f"{what} timed out after {timeout:g}s")
    if result.returncode != 0:
        raise DeliveryFailed(f"{what} exited {result.returncode}: {result.err.strip()[:300]}")


def tick(svc: Services) -> None:
    """The notify tick: new events into the outbox, then deliver what is due."""
    with svc.tx() as s:
        made = enqueue(s, svc, svc.clock.now())
    if made:
        log.debug("notify: %s new outbox messages", made)
    deliver_due(svc, svc.clock.now())


def ticks(svc: Services) -> list[tuple[str, Any, float]]:
    return [("notify", lambda: tick(svc), svc.settings.notify.tick_seconds)]
