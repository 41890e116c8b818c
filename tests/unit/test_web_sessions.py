"""Dashboard sessions and the per-user token cap, on real SQLite and PostgreSQL databases: what the
browser's cookie opens, when it stops, and how many rows one user can make."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from broker.caller import Caller
from broker.config import load_settings
from broker.db.web_models import WebSession, WebToken
from broker.errors import AdmissionRefused, ConfigError, PermissionDenied
from broker.nodes.manager import NodeManager
from broker.opsconfig import WebSettings
from broker.web import auth
from broker.web.app import Dashboard
from broker.wiring import handlers
from ledger_fakes import World, setup_lab

USERS = {
    1001: Caller(uid=1001, gid=1001, pid=1, name="alice", is_admin=False),
    1002: Caller(uid=1002, gid=1002, pid=1, name="bob", is_admin=False),
    0: Caller(uid=0, gid=0, pid=1, name="root", is_admin=True),
}
ALICE, BOB, ROOT = USERS[1001], USERS[1002], USERS[0]


@pytest.fixture
def world(db_url: str) -> World:
    """A lab on each backend (the session and pruning queries are the database's)."""
    w = World(db_url)
    setup_lab(w.svc)
    return w


def dashboard(w: World) -> Dashboard:
    return Dashboard(w.svc, handlers(w.svc, NodeManager(w.svc)), lambda uid: USERS[uid])


def sign_in(d: Dashboard, token: str) -> dict[str, str]:
    r = d.post("/login", {"Host": "dash"}, f"token={token}".encode())
    assert r.status == 303, r.body
    return {"Cookie": r.headers["Set-Cookie"].split(";", 1)[0], "Host": "dash"}


def count(w: World, model: type[WebToken] | type[WebSession]) -> int:
    with w.svc.sessions() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def with_cap(w: World, cap: int) -> None:
    w.svc.settings = replace(w.svc.settings, web=WebSettings(max_tokens_per_user=cap))


# -- sessions ----------------------------------------------------------------------------------------
def test_the_cookie_is_a_session_id_stored_as_its_hash_not_the_token(world: World) -> None:
    d = dashboard(world)
    token = auth.mint(world.svc, ALICE, 3600)["token"]
    cookie = sign_in(d, token)
    value = cookie["Cookie"].split("=", 1)[1]
    assert value.startswith("gbs_") and token not in cookie["Cookie"] and len(value) > 40
    with world.svc.sessions() as s:
        dump = " ".join(str(v) for v in s.execute(text("SELECT * FROM web_sessions")).one())
    assert value not in dump and value[4:] not in dump and auth.hash_token(value) in dump
    assert d.get("/jobs", cookie).status == 200


def test_signing_out_ends_the_session_so_the_same_cookie_opens_nothing(world: World) -> None:
    d = dashboard(world)
    token = auth.mint(world.svc, ALICE, 3600)["token"]
    laptop, phone = sign_in(d, token), sign_in(d, token)
    out = d.post("/logout", laptop, b"")
    assert out.status == 303 and out.headers["Location"] == "/login" and "Max-Age=0" in out.headers["Set-Cookie"]
    replay = d.get("/jobs", laptop)  # the cookie a browser (or anyone who copied it) still holds
    assert replay.status == 303 and replay.headers["Location"] == "/login"
    assert d.get("/jobs", phone).status == 200  # another browser's session is its own
    assert d.post("/logout", laptop, b"").status == 303  # signing out twice is harmless
    again = sign_in(d, token)  # the token still signs in afresh
    assert d.get("/jobs", again).status == 200


def test_revoking_the_token_ends_every_session_opened_with_it(world: World) -> None:
    d = dashboard(world)
    made = auth.mint(world.svc, ALICE, 3600)
    cookies = [sign_in(d, made["token"]) for _ in range(3)]
    auth.revoke(world.svc, ALICE, made["id"])
    assert [d.get("/jobs", c).status for c in cookies] == [303, 303, 303]
    with world.svc.sessions() as s:
        assert {r.ended_why for r in s.execute(select(WebSession)).scalars()} == {"token revoked"}


def test_a_session_ends_with_its_token(world: World) -> None:
    d = dashboard(world)
    cookie = sign_in(d, auth.mint(world.svc, ALICE, 120)["token"])
    assert d.get("/jobs", cookie).status == 200
    world.clock.advance(121)
    assert d.get("/jobs", cookie).status == 303


def test_a_session_whose_token_changed_hands_is_refused(world: World) -> None:
    """The session names its owner; a token row that says otherwise (a bug, a hand edit) signs nobody in."""
    d = dashboard(world)
    cookie = sign_in(d, auth.mint(world.svc, ALICE, 3600)["token"])
    with world.svc.tx() as s:
        row = s.execute(select(WebToken)).scalar_one()
        row.owner_uid = 1002
    assert d.get("/jobs", cookie).status == 303


def test_forged_and_malformed_cookies_open_nothing(world: World) -> None:
    d = dashboard(world)
    sign_in(d, auth.mint(world.svc, ALICE, 3600)["token"])
    for value in ("gbs_" + "A" * 43, "gbs_", "gbs_a b", "gbs_" + "x" * 300, "gbt_whatever", "ö"):
        assert d.get("/jobs", {"Cookie": f"gbroker_session={value}"}).status == 303, value
    assert auth.verify_session(world.svc, "gbs_é", world.clock.now()).uid is None


def test_signing_in_again_and_again_keeps_a_bounded_number_of_session_rows(world: World) -> None:
    d = dashboard(world)
    token = auth.mint(world.svc, ALICE, 3600)["token"]
    cookies = [sign_in(d, token) for _ in range(auth.MAX_SESSIONS_PER_TOKEN + 5)]
    for c in cookies[-3:]:
        d.post("/logout", c, b"")
    sign_in(d, token)
    assert count(world, WebSession) <= auth.MAX_SESSIONS_PER_TOKEN + 5
    for _ in range(30):
        sign_in(d, token)
    assert count(world, WebSession) <= 2 * auth.MAX_SESSIONS_PER_TOKEN
    live = [c for c in cookies if d.get("/jobs", c).status == 200]
    assert live == []  # the oldest sign-ins were ended to make room for the newest
    newest = sign_in(d, token)
    assert d.get("/jobs", newest).status == 200


# -- the token cap -----------------------------------------------------------------------------------
def test_a_user_holds_at_most_the_cap_of_live_tokens_and_is_told_how_to_end_one(world: World) -> None:
    with_cap(world, 3)
    made = [auth.mint(world.svc, ALICE, 3600) for _ in range(3)]
    with pytest.raises(AdmissionRefused) as refused:
        auth.mint(world.svc, ALICE, 3600)
    assert "3 live dashboard tokens" in refused.value.message and "max_tokens_per_user = 3" in refused.value.message
    assert "gbroker token --revoke ID" in (refused.value.hint or "")
    assert "gbroker token --list" in (refused.value.hint or "")
    assert auth.mint(world.svc, BOB, 3600)["user"] == "bob"  # the cap is per user
    auth.revoke(world.svc, ALICE, made[0]["id"])
    auth.mint(world.svc, ALICE, 3600)  # a revoked one frees its place
    world.clock.advance(3601)
    assert len([auth.mint(world.svc, ALICE, 60) for _ in range(3)]) == 3  # and so does an expired one
    with pytest.raises(AdmissionRefused):
        auth.mint(world.svc, ALICE, 60)


def test_an_admin_is_capped_too(world: World) -> None:
    with_cap(world, 2)
    auth.mint(world.svc, ROOT, 60)
    auth.mint(world.svc, ROOT, 60)
    with pytest.raises(AdmissionRefused):
        auth.handlers(world.svc)["token_mint"](ROOT, {"ttl_s": 60})


def test_revoking_and_minting_again_keeps_only_the_newest_ended_tokens(world: World) -> None:
    d = dashboard(world)
    with_cap(world, 2)
    first = auth.mint(world.svc, ALICE, 3600)
    sign_in(d, first["token"])
    for _ in range(auth.KEEP_ENDED_TOKENS + 15):
        auth.revoke(world.svc, ALICE, auth.mint(world.svc, ALICE, 3600)["id"])
    auth.revoke(world.svc, ALICE, first["id"])
    auth.mint(world.svc, ALICE, 3600)
    listed = auth.list_tokens(world.svc, ALICE)
    assert len(listed) == auth.KEEP_ENDED_TOKENS + 1  # the newest ended ones and the live one
    assert first["id"] not in {t["id"] for t in listed}
    assert count(world, WebSession) == 0  # the pruned token's session went with it
    bob = auth.mint(world.svc, BOB, 3600)  # another user's tokens are not touched
    assert bob["id"] in {t["id"] for t in auth.list_tokens(world.svc, BOB)}


def test_the_cap_is_a_web_setting(tmp_path: Path) -> None:
    f = tmp_path / "g.toml"
    f.write_text("[web]\nmax_tokens_per_user = 5\n")
    assert load_settings(str(f)).web.max_tokens_per_user == 5
    f.write_text("[web]\n")
    assert load_settings(str(f)).web.max_tokens_per_user == 20
    for bad in ("0", "true", '"20"', "1001"):
        f.write_text(f"[web]\nmax_tokens_per_user = {bad}\n")
        with pytest.raises(ConfigError, match="max_tokens_per_user"):
            load_settings(str(f))


# -- the admin page pages ----------------------------------------------------------------------------
def test_the_admin_tokens_page_shows_a_bounded_page_with_previous_and_next(world: World) -> None:
    d = dashboard(world)
    with_cap(world, 1000)
    ids = [auth.mint(world.svc, ALICE, 3600, f"n{i}")["id"] for i in range(auth.TOKENS_PER_PAGE * 2 + 7)]
    root = sign_in(d, auth.mint(world.svc, ROOT, 3600, "root-token")["token"])
    first = d.get("/admin/tokens", root).body.decode()
    assert first.count("<tr>") == auth.TOKENS_PER_PAGE + 1  # the header row and one page
    assert "root-token" in first and f"<td>{ids[0]}</td>" not in first  # newest first
    assert 'href="/admin/tokens?page=2"' in first and 'rel="prev"' not in first and "page 1 of 3" in first
    last = d.get("/admin/tokens?page=3", root).body.decode()
    assert f"<td>{ids[0]}</td>" in last and 'rel="next"' not in last and 'href="/admin/tokens?page=2"' in last
    assert last.count("<tr>") == 8 + 1  # 107 alice + 1 root = 108 = 50 + 50 + 8
    past = d.get("/admin/tokens?page=99", root).body.decode()
    assert "page 3 of 3" in past  # past the end shows the last page
    for bad in ("0", "x", "-1", "1" * 12):
        r = d.get(f"/admin/tokens?page={bad}", root)
        assert r.status == 400 and "whole number" in r.body.decode(), bad
    assert d.get("/admin/tokens?colour=red", root).status == 400
    alice = sign_in(d, auth.mint(world.svc, ALICE, 3600)["token"])
    assert d.get("/admin/tokens?page=2", alice).status == 403
    with pytest.raises(PermissionDenied):
        auth.token_page(world.svc, ALICE, 1)
