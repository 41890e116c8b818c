"""The dashboard's logic on a real database with the fake Slurm: tokens, who sees what, escaping, charts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select, text

from broker.caller import Caller
from broker.config import load_settings
from broker.db.web_models import WebToken
from broker.errors import ConfigError, NotFound, PermissionDenied, SpecError
from broker.jobs.submit import submit
from broker.nodes.manager import NodeManager
from broker.opsconfig import WebSettings
from broker.web import auth, charts, pages
from broker.web.app import Dashboard, Response
from broker.wiring import handlers
from ledger_fakes import World, job_spec, setup_lab

USERS = {
    1001: Caller(uid=1001, gid=1001, pid=1, name="alice", is_admin=False),
    1002: Caller(uid=1002, gid=1002, pid=1, name="bob", is_admin=False),
    0: Caller(uid=0, gid=0, pid=1, name="root", is_admin=True),
}
ALICE, BOB, ROOT = USERS[1001], USERS[1002], USERS[0]
HOSTILE = '<script>alert("x")</script>\n"quoted" \'single\' & <b>bold</b>'


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def dashboard(w: World) -> Dashboard:
    return Dashboard(w.svc, handlers(w.svc, NodeManager(w.svc)), lambda uid: USERS[uid])


def signed_in(d: Dashboard, w: World, who: Caller, ttl_s: int = 3600) -> dict[str, str]:
    token = auth.mint(w.svc, who, ttl_s)["token"]
    r = d.post("/login", {"Host": "dash"}, f"token={token}".encode())
    assert r.status == 303 and r.headers["Location"] == "/jobs", r.body
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    return {"Cookie": cookie.split(";", 1)[0], "Host": "dash"}


def body(r: Response) -> str:
    return r.body.decode()


def jobs_of(w: World) -> dict[str, int]:
    a = submit(w.svc, ALICE, {**job_spec(name="alice-job"), "name": "alice-job"})
    b = submit(w.svc, BOB, {**job_spec(name="bob-secret"), "name": "bob-secret"})
    return {"alice": int(a["id"]), "bob": int(b["id"])}


# -- tokens ------------------------------------------------------------------------------------------
def test_a_token_is_stored_as_its_hash_and_ends_when_it_expires_or_is_revoked(world: World) -> None:
    made = auth.mint(world.svc, ALICE, 600, "laptop")
    token = made["token"]
    assert token.startswith("gbt_") and len(token) > 40
    with world.svc.sessions() as s:
        row = s.execute(select(WebToken)).scalar_one()
        dump = " ".join(str(v) for v in s.execute(text("SELECT * FROM web_tokens")).one())
    assert row.token_sha256 == auth.hash_token(token) and token not in dump and token[4:] not in dump
    assert auth.verify(world.svc, token, world.clock.now()).uid == 1001
    assert auth.verify(world.svc, token + "x", world.clock.now()).uid is None
    assert "not a gbroker token" in auth.verify(world.svc, "hello", world.clock.now()).why

    world.clock.advance(601)
    refused = auth.verify(world.svc, token, world.clock.now())
    assert refused.uid is None and "expired" in refused.why

    second = auth.mint(world.svc, ALICE, 600)
    with pytest.raises(NotFound):
        auth.revoke(world.svc, BOB, second["id"])  # not bob's: same answer as a missing one
    assert auth.verify(world.svc, second["token"], world.clock.now()).uid == 1001
    assert auth.revoke(world.svc, ALICE, second["id"])["status"] == "revoked"
    refused = auth.verify(world.svc, second["token"], world.clock.now())
    assert refused.uid is None and "revoked" in refused.why

    third = auth.mint(world.svc, BOB, 600)
    assert auth.revoke(world.svc, ROOT, third["id"])["revoked_by"] == "root"  # an admin revokes anyone's
    assert [t["status"] for t in auth.list_tokens(world.svc, ALICE)] == ["expired", "revoked"]
    with pytest.raises(PermissionDenied):
        auth.list_tokens(world.svc, ALICE, all_users=True)
    assert len(auth.list_tokens(world.svc, ROOT, all_users=True)) == 3


def test_the_token_operations_check_their_arguments(world: World) -> None:
    ops = auth.handlers(world.svc)
    assert ops["token_mint"](ALICE, {})["expires_at"] == "2026-10-01T20:00:00Z"  # 12 h by default
    for bad, words in (({"ttl_s": 5}, "between 1 minute and 30 days"), ({"ttl_s": "1h"}, "whole number"),
                       ({"ttl_s": True}, "whole number"), ({"user": "bob"}, "unknown argument"),
                       ({"note": "a\nb"}, "printable")):
        with pytest.raises(SpecError, match=words):
            ops["token_mint"](ALICE, bad)
    with pytest.raises(SpecError, match="whole number"):
        ops["token_revoke"](ALICE, {"token_id": "1"})
    with pytest.raises(PermissionDenied):
        ops["token_list"](BOB, {"all_users": True})


def test_cookies_are_read_strictly() -> None:
    assert auth.cookie_token("a=1; gbroker_session=gbt_abc") == "gbt_abc"
    assert auth.cookie_token("other=1") is None and auth.cookie_token("") is None
    with pytest.raises(ValueError):
        auth.cookie_header("gbt_x; Domain=evil", 10, False)
    with pytest.raises(ValueError):
        auth.cookie_header("gbt_abc", 10, False)  # a cookie holds a session id, never the token
    assert auth.cookie_header("gbs_abc", 10, True).endswith("Max-Age=10; Secure")


# -- who sees what -----------------------------------------------------------------------------------
def test_a_users_token_reads_their_own_jobs_never_another_users_or_the_admin_pages(world: World) -> None:
    ids = jobs_of(world)
    d = dashboard(world)
    alice = signed_in(d, world, ALICE)

    page = body(d.get("/jobs", alice))
    assert "alice-job" in page and "bob-secret" not in page
    mine = d.get(f"/jobs/{ids['alice']}", alice)
    assert mine.status == 200 and ">pending<" in body(mine) and "JobState" not in body(mine)
    other = d.get(f"/jobs/{ids['bob']}", alice)
    assert other.status == 404 and "bob-secret" not in body(other) and "no job" in body(other)
    refused = d.get("/jobs?user=bob", alice)
    assert refused.status == 403 and "not yours to see" in body(refused)
    admin_page = d.get("/admin/tokens", alice)
    assert admin_page.status == 403 and "for gbroker admins" in body(admin_page)
    assert "/admin/tokens" not in body(d.get("/jobs", alice))  # no link to it either

    root = signed_in(d, world, ROOT)
    everyone = body(d.get("/jobs", root))
    assert "alice-job" in everyone and "bob-secret" in everyone
    only_bob = body(d.get("/jobs?user=bob", root))
    assert "bob-secret" in only_bob and "alice-job" not in only_bob
    assert "bob-secret" in body(d.get(f"/jobs/{ids['bob']}", root))
    tokens = d.get("/admin/tokens", root)
    assert tokens.status == 200 and "alice" in body(tokens)


def test_signed_out_expired_and_revoked_browsers_are_sent_to_sign_in(world: World) -> None:
    jobs_of(world)
    d = dashboard(world)
    assert d.get("/jobs", {}).headers["Location"] == "/login"
    assert d.get("/jobs", {"Cookie": "gbroker_session=gbt_forged"}).headers["Location"] == "/login"
    alice = signed_in(d, world, ALICE, ttl_s=120)
    assert d.get("/jobs", alice).status == 200
    world.clock.advance(121)
    assert d.get("/jobs", alice).status == 303

    token = auth.mint(world.svc, ALICE, 3600)
    assert d.get("/jobs", {"Cookie": f"gbroker_session={token['token']}"}).status == 303  # the token is no cookie
    signed = d.post("/login", {}, f"token={token['token']}".encode())
    cookie = {"Cookie": signed.headers["Set-Cookie"].split(";", 1)[0]}
    assert d.get("/jobs", cookie).status == 200
    auth.revoke(world.svc, ROOT, token["id"])
    assert d.get("/jobs", cookie).status == 303
    r = d.post("/login", {}, f"token={token['token']}".encode())
    assert r.status == 401 and "revoked" in body(r) and "Set-Cookie" not in r.headers


def test_sign_in_refuses_other_sites_and_unknown_fields(world: World) -> None:
    d = dashboard(world)
    token = auth.mint(world.svc, ALICE, 3600)["token"]
    cross = d.post("/login", {"Host": "dash:9464", "Origin": "http://evil.example"}, f"token={token}".encode())
    assert cross.status == 403 and "Set-Cookie" not in cross.headers
    same = d.post("/login", {"Host": "dash:9464", "Origin": "http://dash:9464"}, f"token={token}".encode())
    assert same.status == 303
    extra = d.post("/login", {}, f"token={token}&user=root".encode())
    assert extra.status == 400 and "unknown form field" in body(extra)
    assert d.post("/jobs", {}, b"").status == 405
    out = d.post("/logout", {}, b"")
    assert out.status == 303 and "Max-Age=0" in out.headers["Set-Cookie"]


def test_filters_are_checked_and_applied(world: World) -> None:
    jobs_of(world)
    d = dashboard(world)
    root = signed_in(d, world, ROOT)
    for query, words in (("?colour=red", "unknown query parameter"), ("?state=BOGUS", "not a job state"),
                         ("?user=a&user=b", "given twice"), ("?pool=moon", "is not one of this lab")):
        r = d.get("/jobs" + query, root)
        assert r.status == 400 and words in body(r), query
    assert "Nothing to show" in body(d.get("/jobs?group=climate", root))
    assert "alice-job" in body(d.get("/jobs?group=vision&state=pending", root))
    assert "Nothing to show" in body(d.get("/jobs?state=completed", root))
    assert "alice-job" in body(d.get("/jobs?pool=spot", root))
    assert d.get("/nodes?days=0", root).status == 400
    assert d.get("/nowhere", root).status == 404


def test_the_database_filters_so_an_old_match_is_found_past_the_pages_cap(world: World,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.web.app as app

    ids = jobs_of(world)
    for i in range(3):  # newer jobs that do not match
        submit(world.svc, BOB, {**job_spec(name=f"bob-{i}"), "name": f"bob-{i}"})
    monkeypatch.setattr(app, "MAX_LIST", 2)
    d = dashboard(world)
    root = signed_in(d, world, ROOT)
    page = body(d.get("/jobs?user=alice", root))
    assert f'<a href="/jobs/{ids["alice"]}">' in page and "bob-" not in page
    assert "Only the newest 2 that match" in body(d.get("/jobs", root))
    assert "alice" in body(d.get("/jobs", root)).split("<select name=\"user\">")[1].split("</select>")[0]

    ops = handlers(world.svc, NodeManager(world.svc))
    listed = ops["list"](ROOT, {"active": False, "all_users": True, "user": "bob", "state": "pending",
                                "partitions": ["spot"], "group": "vision"})
    assert sorted(j["name"] for j in listed) == ["bob-0", "bob-1", "bob-2", "bob-secret"]
    assert ops["list"](ROOT, {"all_users": True, "partitions": ["ondemand"]}) == []
    assert [j["name"] for j in ops["list"](ALICE, {"user": "alice"})] == ["alice-job"]
    with pytest.raises(PermissionDenied):
        ops["list"](ALICE, {"user": "bob"})
    for bad in ({"state": "BOGUS"}, {"user": "a\nb"}, {"partitions": "spot"}, {"group": ""}):
        with pytest.raises(SpecError):
            ops["list"](ROOT, {"all_users": True, **bad})


def test_proxy_header_is_ignored_unless_configured_and_needs_the_proxys_secret(world: World, tmp_path: Path) -> None:
    import os
    import pwd

    from broker.web.app import PROXY_SECRET_HEADER

    jobs_of(world)
    d = dashboard(world)
    forged = {"X-Forwarded-User": "root"}
    assert d.get("/jobs", forged).status == 303  # off by default: a header is not a sign-in
    secret = tmp_path / "proxy-secret"
    secret.write_text("s3cret-only-the-proxy-knows\n")
    secret.chmod(0o600)
    world.svc.settings = replace(world.svc.settings, web=WebSettings(trust_proxy_header="X-Forwarded-User",
                                                                     proxy_secret_file=str(secret)))
    me = pwd.getpwuid(0).pw_name  # the proxy's user must be a real account on this host; root always is
    d.caller_of = lambda uid: ROOT if uid == 0 else USERS[uid]
    # Any local user can reach the listener: the name alone, or with a wrong secret, is refused.
    for sent in ({}, {PROXY_SECRET_HEADER: "guess"}, {PROXY_SECRET_HEADER: "s3cret-only-the-proxy-know"}):
        r = d.get("/jobs", {"X-Forwarded-User": me, **sent})
        assert r.status == 403 and "without the proxy" in body(r) and "bob-secret" not in body(r)
    proxied = {PROXY_SECRET_HEADER: "s3cret-only-the-proxy-knows"}
    r = d.get("/jobs", {"X-Forwarded-User": me, **proxied})
    assert r.status == 200 and "bob-secret" in body(r)
    nobody = d.get("/jobs", {"X-Forwarded-User": "no-such-user-here", **proxied})
    assert nobody.status == 403 and "no account here" in body(nobody)
    # A secret others may read, or a link to one, stops the daemon's start (it reads the file there).
    for bad, words in (("mode", "only the daemon's user can read"), ("link", "proxy_secret_file"),
                       ("short", "under 16 characters")):
        f = tmp_path / f"secret-{bad}"
        if bad == "link":
            os.symlink(secret, f)
        else:
            f.write_text("short" if bad == "short" else "long-enough-secret-but-readable")
            f.chmod(0o644 if bad == "mode" else 0o600)
        world.svc.settings = replace(world.svc.settings, web=WebSettings(trust_proxy_header="X-Forwarded-User",
                                                                         proxy_secret_file=str(f)))
        with pytest.raises(ConfigError, match=words):
            dashboard(world).proxy_secret()


def test_web_settings_are_checked(tmp_path: Path) -> None:
    f = tmp_path / "g.toml"
    f.write_text('[web]\ntrust_proxy_header = "X-Forwarded-User"\nproxy_secret_file = "/etc/gbroker/proxy-secret"\n')
    web = load_settings(str(f)).web
    assert (web.trust_proxy_header, web.proxy_secret_file) == ("X-Forwarded-User", "/etc/gbroker/proxy-secret")
    for bad, words in (('trust_proxy_header = "X Bad"', "not a header name"),
                       ('trust_proxy_header = "Cookie"', "browsers send themselves"),
                       ('trust_proxy_header = "X-Forwarded-User"', "needs proxy_secret_file"),
                       ('proxy_secret_file = "/etc/gbroker/proxy-secret"', "would do nothing"),
                       ('trust_proxy_header = "X-User"\nproxy_secret_file = "secret"', "not an absolute path"),
                       ('proxy = "x"', "unknown key")):
        f.write_text(f"[web]\n{bad}\n")
        with pytest.raises(ConfigError, match=words):
            load_settings(str(f))


# -- rendering ---------------------------------------------------------------------------------------
def test_every_value_users_write_is_escaped(world: World) -> None:
    job = submit(world.svc, ALICE, {**job_spec(), "name": "x" * 3})
    from broker.db.models import Job

    with world.svc.tx() as s:  # a name and a reason as hostile as a user can make them
        row = s.get(Job, job["id"])
        assert row is not None
        row.name, row.reason = HOSTILE[:64], HOSTILE
    d = dashboard(world)
    alice = signed_in(d, world, ALICE)
    for page in (body(d.get("/jobs", alice)), body(d.get(f"/jobs/{job['id']}", alice))):
        assert "<script>" not in page and "<b>bold</b>" not in page
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page and "&#x27;single&#x27;" in page
    assert "<script" not in pages.login_page('<script>"')
    bad = d.get("/jobs/%3Cscript%3E", alice)
    assert bad.status == 404 and "<script>" not in body(bad)


def test_an_arrays_page_shows_its_progress_line() -> None:
    job = {"id": 7, "name": "frames", "state": "running", "owner": "alice", "group": "vision", "kind": "render",
           "key": "gb-1", "attempts": [], "events": [],
           "pieces": {"total": 40, "counts": {"done": 12, "running": 4}, "line": "12/40 done, 4 running"}}
    page = pages.job_page(job, "alice", False)
    assert "12/40 done, 4 running" in page and "counts" not in page


def test_the_burndown_chart_draws_each_point_and_the_forecast() -> None:
    data = {"semester": "2026-fall", "starts_at": "2026-09-01T00:00:00Z", "ends_at": "2027-01-31T00:00:00Z",
            "now": "2026-10-01T00:00:00Z",
            "series": [{"group": "<vision>", "amount_micros": 100_000_000,
                        "points": [["2026-09-01T00:00:00Z", 100_000_000], ["2026-09-10T00:00:00Z", 70_000_000],
                                   ["2026-09-20T00:00:00Z", 40_000_000]],
                        "forecast": [["2026-10-01T00:00:00Z", 40_000_000], ["2026-10-20T00:00:00Z", 0]],
                        "runout_at": "2026-10-20T00:00:00Z"}]}
    svg = charts.burndown_svg(data)
    root = ET.fromstring(svg)  # well-formed XML, so every browser draws it
    ns = "{http://www.w3.org/2000/svg}"
    circles = root.findall(f".//{ns}circle")
    assert len(circles) == 3
    ys = [float(c.get("cy", "0")) for c in circles]
    assert ys[0] < ys[1] < ys[2]  # money left falls, so the dots go down
    forecast = root.find(f".//{ns}polyline[@class='forecast']")
    assert forecast is not None and forecast.get("stroke-dasharray")
    assert "&lt;vision&gt;" in svg and "<vision>" not in svg
    assert "No budget" in charts.burndown_svg({**data, "series": []})


def test_node_bars_add_up_to_the_window() -> None:
    svg = charts.node_bars_svg([{"node": "spot1", "busy_s": 3600, "idle_s": 1800, "released_s": 1800}])
    root = ET.fromstring(svg)
    widths = [float(r.get("width", "0")) for r in root.iter("{http://www.w3.org/2000/svg}rect")
              if r.get("class") in ("busy", "idle", "released")]
    assert len(widths) == 3 and widths[0] == pytest.approx(2 * widths[1]) and widths[1] == pytest.approx(widths[2])


def test_the_spend_and_nodes_pages_render_from_the_lab(world: World) -> None:
    job = world.submit("alice")
    world.slurm.start(job["slurm_job_id"] or 101)
    world.advance(1800)
    world.slurm.finish(job["slurm_job_id"] or 101)
    world.tick()
    world.advance(60)
    world.tick()
    d = dashboard(world)
    alice = signed_in(d, world, ALICE)
    spend = d.get("/spend", alice)
    assert spend.status == 200
    page = body(spend)
    assert "<svg" in page and "vision" in page and "climate" not in page  # alice is not in climate
    svg = re.search(r"<svg.*?</svg>", page, re.S)
    assert svg is not None and len(ET.fromstring(svg.group(0)).findall(".//{http://www.w3.org/2000/svg}circle")) >= 2
    assert "2026-fall" in page
    nodes = d.get("/nodes?days=7", alice)
    assert nodes.status == 200 and "Pools" in body(nodes)
    missing = d.get("/spend?semester=nope", alice)
    assert missing.status == 200 and "nope" in body(missing)


def test_pages_send_no_script_and_nothing_from_elsewhere(world: World) -> None:
    jobs_of(world)
    d = dashboard(world)
    root = signed_in(d, world, ROOT)
    for path in ("/jobs", "/spend", "/nodes", "/admin/tokens", "/login"):
        page = body(d.get(path, root))
        assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page), path


def test_gbroker_token_refuses_flags_that_do_not_go_together() -> None:
    from click.testing import CliRunner

    from broker.cli.main import cli

    for args, words in ((["--list", "--ttl", "1h"], "--ttl only apply when making a token"),
                        (["--revoke", "3", "--note", "x"], "--note only apply when making a token"),
                        (["--list", "--revoke", "3"], "not both"), (["--all"], "--all goes with --list"),
                        (["--ttl", "soon"], "--ttl 'soon'")):
        r = CliRunner().invoke(cli, ["--socket", "/nonexistent/gbroker.sock", "token", *args])
        assert r.exit_code == 2 and words in r.output, (args, r.output)


def test_node_time_splits_the_window_into_busy_idle_and_released(world: World) -> None:
    from datetime import timedelta

    from broker.db.node_models import NodeSession, NodeUsage
    from broker.web.nodes import node_time

    t0 = world.clock.now()
    h = timedelta(hours=1)
    with world.svc.tx() as s:
        done = NodeSession(node="spot1", partition="spot", capacity="spot", source="test", open_key="k1",
                           close_key="c1", resumed_at=t0 - 5 * h, suspended_at=t0 - 2 * h)
        live = NodeSession(node="spot2", partition="spot", capacity="spot", source="test", open_key="k2",
                           resumed_at=t0 - 1 * h)
        old = NodeSession(node="spot3", partition="spot", capacity="spot", source="test", open_key="k3",
                          close_key="c3", resumed_at=t0 - 30 * h, suspended_at=t0 - 25 * h)
        s.add_all([done, live, old])
        s.flush()
        s.add_all([NodeUsage(session_id=done.id, state="busy", started_at=t0 - 5 * h, ended_at=t0 - 3 * h),
                   NodeUsage(session_id=done.id, state="idle", started_at=t0 - 3 * h, ended_at=t0 - 2 * h),
                   NodeUsage(session_id=live.id, state="busy", started_at=t0 - 1 * h, ended_at=None)])
    with world.svc.sessions() as s:
        rows = {r["node"]: r for r in node_time(s, t0 - 24 * h, t0)}
    assert set(rows) == {"spot1", "spot2"}  # spot3's session ended before the window
    one, two = rows["spot1"], rows["spot2"]
    assert (one["busy_s"], one["idle_s"], one["released_s"]) == (7200, 3600, 21 * 3600)
    assert (two["busy_s"], two["idle_s"], two["released_s"]) == (3600, 0, 23 * 3600)
    for r in rows.values():
        assert r["busy_s"] + r["idle_s"] + r["released_s"] == 24 * 3600
