"""Socket operations of the node manager.

The hooks (``node_resume``, ``node_suspend``, ``node_resume_fail``) and
``node_tick`` change things: admins only (Slurm runs its hooks as SlurmUser,
root here). ``node_list`` and ``node_report`` are open to every user: they
show node names, usernames and partition totals, as sinfo and squeue do.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from broker import timeparse
from broker.caller import Caller, Handler
from broker.errors import SpecError
from broker.amount import format_money
from broker.nodes.providers.hooks import expand_hostlists, new_key
from broker.money.nodecost import node_cost
from broker.nodes.manager import NodeManager
from broker.state import Services



def handlers(svc: Services, nodes: NodeManager) -> dict[str, Handler]:
    def admin(what: str, fn: Callable[[dict[str, Any]], Any]) -> Handler:
        def run(caller: Caller, args: dict[str, Any]) -> Any:
            caller.require_admin(what)
            return fn(args)
        return run

    return {
        "node_resume": admin("resuming nodes", lambda a: nodes.resume(_names(a), _key(a))),
        "node_suspend": admin("suspending nodes", lambda a: nodes.suspend(_names(a), _key(a))),
        "node_resume_fail": admin("failing node resumes", lambda a: nodes.resume_failed(_names(a), _key(a))),
        "node_tick": admin("running the node manager", lambda a: nodes.tick().as_dict()),
        "node_list": lambda caller, args: nodes.status(),
        "node_report": lambda caller, args: report(svc, args.get("since"), args.get("until")),
    }


def _names(args: dict[str, Any]) -> list[str]:
    raw = args.get("nodes")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        raise SpecError("give node names or a hostlist, e.g. spot[1-2]")
    return expand_hostlists(raw)


def _key(args: dict[str, Any]) -> str:
    key = args.get("key") or new_key()
    if not isinstance(key, str) or not 8 <= len(key) <= 40 or not key.replace("-", "").isalnum():
        raise SpecError("key: expected 8-40 letters or digits")
    return key


def parse_when(text: str | None, now: datetime) -> datetime | None:
    """A report bound (the forms of ``broker.timeparse``, e.g. 2026-09-01 or -7d); None when not given."""
    if text is None or text == "":
        return None
    try:
        return timeparse.parse_when(text, now)
    except ValueError as exc:
        raise SpecError(f"cannot read the time {text!r}{timeparse.why(exc)}",
                        hint="use 2026-09-01, 2026-09-01T08:00 or -7d") from None


def report(svc: Services, since: str | None, until: str | None) -> dict[str, Any]:
    now = svc.clock.now()
    start = parse_when(since, now)
    end = parse_when(until, now) or now
    with svc.sessions() as s:
        rows = [r.as_dict() for r in node_cost(s, start, end)]
    for r in rows:
        for k in ("node_s", "busy_s", "idle_s"):
            r[k.replace("_s", "_hours")] = f"{r[k] / 3600:.3f}"
        r["idle_cost"] = format_money(r["idle_cost_micros"])
        r["cost"] = format_money(r["cost_micros"])
    return {"since": start.isoformat() if start else None, "until": end.isoformat(), "partitions": rows}
