"""Per node, over a window: busy, idle and released (powered-down) seconds, from the node sessions.

Read-only, inside the caller's session. A session's usage stretches (busy or
idle, ``broker/nodes/sessions.py`` writes them) are cut to the window
(``broker.money.nodecost.stretches_in``, as ``gbroker node report`` cuts them); open
ones count up to its end. Released is the rest of the window: the node was
powered down (given back) then. Nodes with no session in the window (owned
nodes, which are never released) are not listed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from broker.db.node_models import USAGE_BUSY
from broker.money.nodecost import sessions_in, stretches_in


def node_time(s: Session, start: datetime, end: datetime) -> list[dict[str, Any]]:
    window = max(0, int((end - start).total_seconds()))
    sessions = sessions_in(s, start, end)
    rows: dict[str, dict[str, Any]] = {}
    for sess in sessions.values():
        row = rows.setdefault(sess.node, {"node": sess.node, "partition": sess.partition,
                                          "capacity": sess.capacity, "sessions": 0,
                                          "powered_s": 0, "busy_s": 0, "idle_s": 0})
        row["sessions"] += 1
        a, b = max(sess.resumed_at, start), min(sess.suspended_at or end, end)
        row["powered_s"] += max(0, int((b - a).total_seconds()))
    for sess, u, a, b in stretches_in(s, sessions, start, end):
        rows[sess.node]["busy_s" if u.state == USAGE_BUSY else "idle_s"] += int((b - a).total_seconds())
    out = []
    for name in sorted(rows):
        row = rows[name]
        powered = min(window, row["powered_s"])
        # Powered time not split into stretches yet (the node tick has not seen it) counts as idle,
        # so busy + idle + released is the window.
        row["busy_s"] = min(row["busy_s"], powered)
        row["idle_s"] = powered - row["busy_s"]
        row["released_s"] = window - powered
        out.append(row)
    return out
