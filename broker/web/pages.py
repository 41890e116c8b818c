"""The dashboard's HTML, server-rendered from the socket operations' plain data.

No JavaScript and nothing fetched from elsewhere: the style sheet is inline
and the charts are inline SVG (``broker/web/charts.py``). Every value goes
through ``esc`` (job names and reasons are users' text: they may hold tags,
quotes and newlines); a URL's query through ``urlencode``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from broker.durations import format_duration
from broker.web.auth import TokenPage
from broker.web.charts import burndown_svg, esc, node_bars_svg

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#23344a;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#fff;text-decoration:none}header a.here{text-decoration:underline}
header form{margin-left:auto}main{padding:12px 16px}
table{border-collapse:collapse;margin:8px 0}th,td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.msg{white-space:pre-wrap}.error{background:#fdecea;border:1px solid #e0a39b;padding:8px 12px}
.empty{color:#777}form.filters label{margin-right:10px}code{background:#f3f3f3;padding:1px 4px}
"""

NAV = (("/jobs", "Jobs"), ("/spend", "Spend"), ("/nodes", "Pools and nodes"))


def page(title: str, body: str, user: str | None = None, admin: bool = False, here: str = "") -> str:
    nav = ""
    if user is not None:
        links = [*NAV, *((("/admin/tokens", "Tokens"),) if admin else ())]
        nav = "".join(f'<a href="{p}"{" class=here" if p == here else ""}>{esc(t)}</a>' for p, t in links)
        nav += (f'<form method="post" action="/logout"><span>{esc(user)}{" (admin)" if admin else ""}</span> '
                f'<button type="submit">Sign out</button></form>')
    return ("<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width'><title>{esc(title)} - gbroker</title>"
            f"<style>{STYLE}</style></head><body><header><strong>gbroker</strong>{nav}</header>"
            f"<main><h1>{esc(title)}</h1>{body}</main></body></html>\n")


def error_page(title: str, message: str, hint: str = "", user: str | None = None, admin: bool = False) -> str:
    body = f'<div class="error"><p class="msg">{esc(message)}</p>'
    if hint:
        body += f'<p class="msg">{esc(hint)}</p>'
    return page(title, body + "</div>", user, admin)


def login_page(message: str = "") -> str:
    err = f'<div class="error"><p class="msg">{esc(message)}</p></div>' if message else ""
    body = (f"{err}<p>Run <code>gbroker token</code> on a machine that reaches the daemon and paste the token "
            "here. It is bound to your user; it expires (12 h unless <code>--ttl</code> says otherwise) and "
            "<code>gbroker token --revoke ID</code> ends it. Signing out ends this browser's session "
            "(the token stays valid for your other sign-ins).</p>"
            '<form method="post" action="/login"><label>Token <input name="token" type="password" size="50" '
            'autocomplete="off" autofocus required></label> <button type="submit">Sign in</button></form>')
    return page("Sign in", body)


def table(headers: list[str], rows: list[list[str]], num: frozenset[int] = frozenset()) -> str:
    """Cells are HTML already (callers escape); headers are escaped here."""
    if not rows:
        return '<p class="empty">Nothing to show.</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _opt(v: Any) -> str:
    return "" if v is None else esc(v)


def jobs_page(jobs: list[dict[str, Any]], filters: dict[str, str], choices: dict[str, list[str]],
              user: str, admin: bool, pool_of: dict[str, str], capped: int = 0) -> str:
    def select_box(name: str) -> str:
        opts = "".join(f'<option value="{esc(v)}"{" selected" if filters.get(name) == v else ""}>{esc(v or "any")}'
                       "</option>" for v in ["", *choices.get(name, [])])
        return f'<label>{esc(name)} <select name="{esc(name)}">{opts}</select></label>'

    form = ('<form class="filters" method="get" action="/jobs">'
            + "".join(select_box(n) for n in ("user", "group", "state", "pool"))
            + '<button type="submit">Filter</button> <a href="/jobs">clear</a></form>')
    who = "every user's jobs" if admin else "your jobs"
    rows = [[f'<a href="/jobs/{int(j["id"])}">{int(j["id"])}</a>', esc(j["name"]), esc(j["owner"]), esc(j["group"]),
             esc(j["state"]), esc(pool_of.get(j.get("partition") or "", j.get("partition") or "")),
             _opt(j.get("capacity")), str(int(j["attempts"])), _opt(j.get("created_at")),
             f'<span class="msg">{esc(j.get("reason") or "")}</span>'] for j in jobs]
    cap = (f" Only the newest {capped} that match are shown: narrow the filters, or use `gbroker history`."
           if capped else "")
    body = (f"<p>{len(jobs)} of {esc(who)}, newest first.{esc(cap)}</p>{form}"
            + table(["job", "name", "user", "group", "state", "pool", "capacity", "attempts", "submitted", "reason"],
                    rows, frozenset({0, 7})))
    return page("Jobs", body, user, admin, "/jobs")


def job_page(job: dict[str, Any], user: str, admin: bool) -> str:
    fields = [("name", job["name"]), ("state", job["state"]), ("reason", job.get("reason") or ""),
              ("user", job["owner"]), ("group", job["group"]), ("kind", job["kind"]),
              ("capacity", job.get("capacity")), ("partition", job.get("partition")),
              ("policy", job.get("policy")), ("reclaims", job.get("reclaims")), ("failures", job.get("failures")),
              ("deadline", job.get("deadline")), ("submitted", job.get("created_at")),
              ("finished", job.get("finished_at")), ("key", job["key"]), ("log", job.get("log"))]
    if job.get("pieces"):
        fields.append(("pieces", job["pieces"]["line"]))
    info = table(["field", "value"], [[esc(k), f'<span class="msg">{_opt(v)}</span>'] for k, v in fields])
    attempts = table(
        ["#", "slurm job", "partition", "capacity", "state", "nodes", "submitted", "started", "ended", "exit",
         "lost"],
        [[str(a["number"]), _opt(a["slurm_job_id"]), _opt(a["partition"]), _opt(a["capacity"]), esc(a["state"]),
          _opt(a["nodes"]), _opt(a["submitted_at"]), _opt(a["started_at"]), _opt(a["ended_at"]),
          _opt(a["exit_code"]), format_duration(int(a["lost_s"] or 0))] for a in job.get("attempts", [])],
        frozenset({0}))
    events = table(["at", "kind", "message"],
                   [[esc(e["at"]), esc(e["kind"]), f'<span class="msg">{esc(e["message"])}</span>']
                    for e in job.get("events", [])])
    body = f"{info}<h2>Attempts</h2>{attempts}<h2>Events</h2>{events}"
    return page(f"Job {int(job['id'])}", body, user, admin, "/jobs")


def spend_page(burn: dict[str, Any] | None, budgets: dict[str, Any] | None, report: dict[str, Any] | None,
               problem: str, user: str, admin: bool) -> str:
    if burn is None:
        return page("Spend", f'<div class="error"><p class="msg">{esc(problem)}</p></div>', user, admin, "/spend")
    rows = []
    for b in (budgets or {}).get("budgets", []):
        fc = b.get("forecast") or {}
        runout = fc.get("runout_at") or "not at this rate"
        rows.append([esc(b["group"]), esc(b["amount"]), esc(b["spent"]), esc(b["reserved"]), esc(b["left"]),
                     esc(b["pct_spent"]), esc(fc.get("burn_per_day", "")), esc(runout),
                     "yes" if fc.get("runs_out_before_semester_end") else "no"])
    budget_table = table(["group", "budget", "spent", "reserved", "left", "% spent", "burn per day", "runs out",
                          "before the end"], rows, frozenset({1, 2, 3, 4, 5, 6}))
    spend_rows = [[esc(r["key"]), esc(r["spend"]), esc(r["gpu_hours"]), esc(r["spot_share_pct"]), esc(r["saved"]),
                   esc(r["lost"])] for r in (report or {}).get("rows", [])]
    spend_table = table(["group", "spend", "GPU hours", "spot %", "saved vs on-demand", "lost to reclaims"],
                        spend_rows, frozenset({1, 2, 3, 4, 5}))
    body = (f"<p>Semester <strong>{esc(burn['semester'])}</strong>, {esc(burn['starts_at'][:10])} to "
            f"{esc(burn['ends_at'][:10])}. Solid: money left after each ledger line; dashed: the forecast at "
            "the recent burn rate.</p>"
            f"<h2>Burn-down</h2>{burndown_svg(burn)}<h2>Budgets and forecast</h2>{budget_table}"
            f"<h2>Spend per group</h2>{spend_table}")
    return page("Spend", body, user, admin, "/spend")


def nodes_page(pools: list[dict[str, Any]], partitions: list[dict[str, Any]], nodes: list[dict[str, Any]],
               now_nodes: list[dict[str, Any]] | None, now_problem: str, days: int, user: str, admin: bool) -> str:
    pool_rows = [[esc(p.get("name", "")), _opt(p.get("partition")), _opt(p.get("capacity")),
                  _opt(p.get("gpu_type")), _opt(p.get("nodes")), _opt(p.get("busy_gpus")), _opt(p.get("free_gpus")),
                  _opt(p.get("price"))] for p in pools]
    part_rows = [[esc(r["partition"]), str(int(r.get("sessions", 0))), esc(r["node_hours"]), esc(r["busy_hours"]),
                  esc(r["idle_hours"]), esc(r["idle_cost"]), esc(r["cost"])] for r in partitions]
    node_rows = [[esc(r["node"]), esc(r["partition"]), esc(r["capacity"]), str(r["sessions"]),
                  format_duration(r["busy_s"]), format_duration(r["idle_s"]), format_duration(r["released_s"])]
                 for r in nodes]
    if now_nodes is None:
        current = f'<div class="error"><p class="msg">{esc(now_problem)}</p></div>'
    else:
        current = table(["node", "state", "power", "capacity", "GPUs", "idle since", "users", "jobs"],
                        [[esc(n["node"]), esc(n["state"]), esc(n["power"]), _opt(n["capacity"]), _opt(n["gpus"]),
                          _opt(n["idle_since"]), esc(", ".join(n["users"])), esc(", ".join(map(str, n["jobs"])))]
                         for n in now_nodes])
    windows = " ".join(f'<a href="/nodes?{urlencode({"days": d})}">{d} d</a>' for d in (1, 7, 30))
    body = (f"<h2>Pools</h2>{table(['pool', 'partition', 'capacity', 'GPU', 'nodes', 'busy GPUs', 'free GPUs', 'price per GPU-hour'], pool_rows, frozenset({4, 5, 6}))}"
            f"<h2>Node time, last {days} days</h2><p>Window: {windows}</p>{node_bars_svg(nodes)}"
            + table(["node", "partition", "capacity", "sessions", "busy", "idle", "released"], node_rows,
                    frozenset({3, 4, 5, 6}))
            + "<h2>Per partition</h2>"
            + table(["partition", "sessions", "node h", "busy h", "idle h", "idle cost", "cost"], part_rows,
                    frozenset({1, 2, 3, 4, 5, 6}))
            + f"<h2>Nodes now</h2>{current}")
    return page("Pools and nodes", body, user, admin, "/nodes")


def _pager(at: int, pages: int, path: str) -> str:
    """Previous and next links for a page of ``pages`` (none needed for one)."""
    if pages <= 1:
        return ""
    links = []
    if at > 1:
        links.append(f'<a rel="prev" href="{path}?{urlencode({"page": at - 1})}">previous</a>')
    links.append(f"page {at} of {pages}")
    if at < pages:
        links.append(f'<a rel="next" href="{path}?{urlencode({"page": at + 1})}">next</a>')
    return '<p class="pager">' + " | ".join(links) + "</p>"


def tokens_page(tp: TokenPage, user: str) -> str:
    rows = [[str(t["id"]), esc(t["user"]), esc(t["note"]), esc(t["status"]), _opt(t["created_at"]),
             _opt(t["expires_at"]), _opt(t["last_used_at"]), esc(t["revoked_by"])] for t in tp.rows]
    pager = _pager(tp.page, tp.pages, "/admin/tokens")
    body = (f"<p>Every user's sign-in tokens, newest first: {tp.total} in all (only their hashes are stored). "
            "Revoke one with <code>gbroker token --revoke ID</code>; that also signs out every browser "
            "signed in with it.</p>" + pager
            + table(["id", "user", "note", "status", "created", "expires", "last sign-in", "revoked by"], rows)
            + pager)
    return page("Sign-in tokens", body, user, True, "/admin/tokens")
