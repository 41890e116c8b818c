"""A hostile user against the dashboard's sign-in, on the real daemon and its real ops listener.

alice floods the socket with token requests (each used to be a 30-day credential and a row, without
end), and bob replays a cookie he copied from alice's browser after she signed out (the cookie used to
be the token itself, good until it expired). Each is done as the attacker would: unprivileged Unix
users, the real CLI, the real socket, a real HTTP client of their own on the loopback listener.
docs/SECURITY.md lists both.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from attack_tools import StatusProbe, run_as
from broker_fixtures import BrokerDaemon, daemon_with_config

pytestmark = pytest.mark.slurm

CAP = 20
"""``[web] max_tokens_per_user``'s default (the daemon here runs with it)."""

FLOOD = r"""
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
out = {"ok": 0, "refused": [], "seconds": 0.0}
t = time.monotonic()
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    s.sendall((json.dumps({"op": "token_mint", "args": {"ttl_s": 30 * 86400}}) + "\n").encode())
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    s.close()
    answer = json.loads(buf)
    if answer.get("ok"):
        out["ok"] += 1
    else:
        out["refused"].append(answer.get("error", answer))
out["seconds"] = time.monotonic() - t
print(json.dumps(out))
"""

HTTP_CLIENT = r"""
import json, sys, urllib.error, urllib.request
class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
opener = urllib.request.build_opener(NoRedirect)
base, cookie, form, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
out = []
for path in paths:
    data = form.encode() if form else None  # a form: POST it
    req = urllib.request.Request(base + path, data=data, headers={"Cookie": cookie} if cookie else {})
    try:
        r = opener.open(req, timeout=20)
    except urllib.error.HTTPError as e:
        r = e
    with r:
        out.append({"status": r.status, "headers": dict(r.headers), "location": r.headers.get("Location"),
                    "body": r.read().decode()})
print(json.dumps(out))
"""
"""An HTTP client of the attacker's own: GETs (or POSTs the form to) each path with the cookie, follows no
redirect, prints each answer."""


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lab:
    def __init__(self, d: BrokerDaemon, port: int) -> None:
        self.d, self.port = d, port

    def as_user(self, user: str, cookie: str, *paths: str, form: str = "") -> list[dict[str, Any]]:
        """GET ``paths`` (POST ``form`` to them) with ``cookie`` from a process of ``user``'s own."""
        p = run_as(self.d, user, [sys.executable, "-c", HTTP_CLIENT, f"http://127.0.0.1:{self.port}", cookie, form,
                                  *paths])
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        answers: list[dict[str, Any]] = json.loads(p.stdout)
        return answers

    def sign_in(self, user: str, token: str) -> str:
        answer = self.as_user(user, "", "/login", form=f"token={token}")[0]
        assert answer["status"] == 303 and answer["location"] == "/jobs", answer
        cookie = answer["headers"]["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie, cookie
        return str(cookie.split(";", 1)[0])


@pytest.fixture(scope="module")
def lab(slurm_cluster: Any) -> Iterator[Lab]:
    port = free_port()
    config = f'slurm_timeout_seconds = 5\n\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    with daemon_with_config(slurm_cluster, config) as d:
        yield Lab(d, port)


def token(d: BrokerDaemon, user: str, *args: str) -> dict[str, Any]:
    return ok(d.cli("token", "--json", *args, user=user)).json()  # type: ignore[no-any-return]


def test_a_flood_of_token_requests_stops_at_the_users_cap(lab: Lab) -> None:
    d = lab.d
    with StatusProbe(d) as probe:
        p = run_as(d, "alice", [sys.executable, "-c", FLOOD, d.socket, "200"], timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    flood = json.loads(p.stdout)
    print(f"alice's 200 token requests: {flood['ok']} made, {len(flood['refused'])} refused, "
          f"{flood['seconds']:.2f}s")
    assert flood["ok"] == CAP and len(flood["refused"]) == 200 - CAP
    assert all(f"max_tokens_per_user = {CAP}" in e["message"] for e in flood["refused"])
    probe.check()

    # The real CLI says why, and what to do.
    refused = d.cli("token", "--ttl", "30d", user="alice")
    assert refused.code == 5 and refused.out == "", (refused.code, refused.out, refused.err)
    assert f"alice holds {CAP} live dashboard tokens" in refused.err
    assert "gbroker token --list" in refused.err and "gbroker token --revoke ID" in refused.err
    mine = [t for t in token(d, "alice", "--list") if t["status"] == "active"]
    assert len(mine) == CAP
    # Another user is not held back by alice's flood; ending one of hers frees a place for her.
    assert token(d, "bob")["user"] == "bob"
    ok(d.cli("token", "--revoke", str(mine[0]["id"]), user="alice"))
    assert token(d, "alice", "--ttl", "1h")["user"] == "alice"
    assert d.cli("token", user="alice").code == 5

    # The admin page shows a page at a time, with a link to the next.
    for user in ("bob", "carol"):
        run_as(d, user, [sys.executable, "-c", FLOOD, d.socket, str(CAP)], timeout=300)
    root = lab.sign_in("root", token(d, "root")["token"])
    first, second = lab.as_user("root", root, "/admin/tokens", "/admin/tokens?page=2")
    assert first["status"] == 200 and second["status"] == 200
    rows = [len(re.findall(r"<tr>", a["body"])) - 1 for a in (first, second)]
    total = len(token(d, "root", "--list", "--all"))
    assert total > 50 and rows == [50, total - 50], (rows, total)
    assert 'href="/admin/tokens?page=2"' in first["body"] and 'rel="next"' not in second["body"]
    assert 'href="/admin/tokens?page=1"' in second["body"]


def test_a_cookie_copied_before_sign_out_opens_nothing_after_it(lab: Lab) -> None:
    d = lab.d
    alice_token = token_or_free(d, "alice")
    cookie = lab.sign_in("alice", alice_token["token"])
    assert alice_token["token"] not in cookie and cookie.split("=", 1)[1].startswith("gbs_")
    before = lab.as_user("bob", cookie, "/jobs")[0]  # bob copied the cookie from alice's browser profile
    assert before["status"] == 200 and "alice" in before["body"]

    out = lab.as_user("alice", cookie, "/logout", form="-")[0]  # the Sign out button (a POST; its body is not read)
    assert out["status"] == 303 and out["location"] == "/login" and "Max-Age=0" in out["headers"]["Set-Cookie"]
    t0 = time.monotonic()
    after = lab.as_user("bob", cookie, "/jobs", "/spend", "/nodes", "/admin/tokens", "/")
    assert [(a["status"], a["location"]) for a in after] == [(303, "/login")] * 5, after
    assert all("alice" not in a["body"] for a in after)
    print(f"replayed cookie after sign-out: refused on 5 pages in {time.monotonic() - t0:.2f}s")
    # The token itself is no cookie, and the token still signs alice in afresh.
    forged = lab.as_user("bob", f"gbroker_session={alice_token['token']}", "/jobs")[0]
    assert (forged["status"], forged["location"]) == (303, "/login")
    laptop, phone = lab.sign_in("alice", alice_token["token"]), lab.sign_in("alice", alice_token["token"])
    assert [a["status"] for a in lab.as_user("alice", laptop, "/jobs")] == [200]

    # Revoking the token ends every browser signed in with it.
    ok(d.cli("token", "--revoke", str(alice_token["id"]), user="alice"))
    for c in (laptop, phone):
        a = lab.as_user("bob", c, "/jobs")[0]
        assert (a["status"], a["location"]) == (303, "/login")


def token_or_free(d: BrokerDaemon, user: str) -> dict[str, Any]:
    """A new token for ``user``, revoking their oldest live one first if the flood test left them at the cap."""
    r = d.cli("token", "--json", user=user)
    if r.code == 5:
        oldest = next(t for t in token(d, user, "--list") if t["status"] == "active")
        ok(d.cli("token", "--revoke", str(oldest["id"]), user=user))
        r = d.cli("token", "--json", user=user)
    return ok(r).json()  # type: ignore[no-any-return]
