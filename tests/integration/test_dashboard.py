"""The web dashboard on the real daemon's TCP listener, with tokens from `gbroker token` as real users,
and in a real browser: Debian's headless Chromium driven by Playwright signs in, opens a job and checks
the burn-down chart. Screenshots are kept under test-artifacts/dashboard/ (or $GBROKER_TEST_ARTIFACTS).

One daemon serves both tests (its start and a charged job are the slow parts).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker_fixtures import REPO, BrokerDaemon, daemon_with_config, public_dir, user_dir

pytestmark = pytest.mark.slurm

SEMESTER = "web-term"
CHROMIUM = "/usr/bin/chromium"
SETUP_HINT = "run contrib/dev/setup (as root): it installs Debian's chromium and the test extras (playwright)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a: Any, **k: Any) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirect)


def http(port: int, path: str, cookie: str = "", form: dict[str, str] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=dict(headers or {}))
    if cookie:
        req.add_header("Cookie", cookie)
    try:
        with OPENER.open(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def token(d: BrokerDaemon, user: str, *args: str) -> dict[str, Any]:
    return ok(d.cli("token", "--json", *args, user=user)).json()


def sign_in(port: int, text: str) -> str:
    code, headers, body = http(port, "/login", form={"token": text})
    assert code == 303 and headers["Location"] == "/jobs", (code, body)
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    return cookie.split(";", 1)[0]


class Lab:
    def __init__(self, d: BrokerDaemon, port: int, jobs: dict[str, int]) -> None:
        self.d, self.port, self.jobs = d, port, jobs


@pytest.fixture(scope="module")
def lab(slurm_cluster: Any) -> Iterator[Lab]:
    port = free_port()
    config = f'slurm_timeout_seconds = 5\n\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    with daemon_with_config(slurm_cluster, config) as d:
        today = datetime.now(UTC).date()
        for args in (("semester", "add", SEMESTER, "--start", str(today - timedelta(days=20)),
                      "--end", str(today + timedelta(days=60))),
                     ("group", "add", "vision", "--member", "alice", "--member", "bob"),
                     ("group", "add", "climate", "--member", "carol"),
                     ("price", "set", "spot", "--capacity", "spot", "--price", "1800.00",
                      "--from", str(today - timedelta(days=20))),
                     ("price", "set", "ondemand", "--capacity", "ondemand", "--price", "3600.00",
                      "--from", str(today - timedelta(days=20))),
                     ("budget", "set", "vision", "--semester", SEMESTER, "--amount", "100"),
                     ("budget", "set", "climate", "--semester", SEMESTER, "--amount", "100")):
            ok(d.cli(*args, user="root"))
        alice = ok(d.cli("submit", "--json", "--group", "vision", "--time", "1m", "--name", "web-alice",
                         "--", "sleep", "3", user="alice")).json()
        carol = ok(d.cli("submit", "--json", "--group", "climate", "--time", "1m", "--name", "web-carol",
                         "--", "sleep", "55", user="carol",
                         cwd=user_dir(public_dir("gbroker-web-carol-"), "carol"))).json()
        d.wait_job(alice["id"], lambda j: j["state"] == "completed", timeout=120, interval=0.5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the ledger tick charges the ended run
            lines = ok(d.cli("budget", "ledger", "--format", "json", user="root")).json()
            if any(c["job_id"] == alice["id"] for c in lines):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"alice's run was not charged within 60 s\n{d.log_tail()}")
        try:
            yield Lab(d, port, {"alice": alice["id"], "carol": carol["id"]})
        finally:
            d.cli("cancel", str(carol["id"]), user="carol")


def test_tokens_from_the_cli_show_each_user_only_what_their_cli_shows(lab: Lab) -> None:
    d, port, jobs = lab.d, lab.port, lab.jobs
    t0 = time.monotonic()
    assert http(port, "/jobs")[1]["Location"] == "/login"
    mine = token(d, "alice", "--ttl", "2h", "--note", "laptop")
    assert mine["user"] == "alice" and mine["token"].startswith("gbt_")
    # The CLI prints the bare token on stdout (for a pipe), what it is on stderr.
    plain = ok(d.cli("token", user="alice"))
    assert plain.out.strip().startswith("gbt_") and "gbroker token --revoke" in plain.err
    alice = sign_in(port, mine["token"])

    code, _, page = http(port, "/jobs", alice)
    assert code == 200 and "web-alice" in page and "web-carol" not in page
    code, _, page = http(port, f"/jobs/{jobs['alice']}", alice)
    assert code == 200 and "Attempts" in page and ">completed<" in page
    code, _, page = http(port, f"/jobs/{jobs['carol']}", alice)
    assert code == 404 and "web-carol" not in page
    assert http(port, "/jobs?user=carol", alice)[0] == 403
    assert http(port, "/admin/tokens", alice)[0] == 403
    # Headers a client makes up are not a sign-in (no proxy is trusted by default).
    assert http(port, "/jobs", headers={"X-Forwarded-User": "root"})[0] == 303
    code, _, page = http(port, "/spend", alice)
    assert code == 200 and "vision" in page and "climate" not in page and "<circle" in page
    code, _, page = http(port, "/nodes", alice)
    assert code == 200 and "Pools" in page

    # Carol cannot end alice's token; alice can, and then the browser's cookie is refused.
    r = d.cli("token", "--revoke", str(mine["id"]), user="carol")
    assert r.code == 3 and "no token" in r.err
    listed = token(d, "alice", "--list")
    assert [t["id"] for t in listed if t["status"] == "active"] == [mine["id"], mine["id"] + 1]
    assert token(d, "alice", "--revoke", str(mine["id"]))["status"] == "revoked"
    assert http(port, "/jobs", alice)[1]["Location"] == "/login"
    code, _, page = http(port, "/login", form={"token": mine["token"]})
    assert code == 401 and "revoked" in page
    # An admin's token sees every job and the admin page; an admin revokes anyone's token.
    root = sign_in(port, token(d, "root")["token"])
    code, _, page = http(port, "/jobs", root)
    assert "web-alice" in page and "web-carol" in page
    code, _, page = http(port, "/admin/tokens", root)
    assert code == 200 and "laptop" in page
    assert token(d, "root", "--revoke", str(mine["id"] + 1))["revoked_by"] == "root"
    r = d.cli("token", "--ttl", "5s", user="alice")
    assert r.code == 2 and "between 1 minute and 30 days" in r.err
    print(f"dashboard HTTP checks: {time.monotonic() - t0:.1f}s")


def artifacts_dir() -> Path:
    where = Path(os.environ.get("GBROKER_TEST_ARTIFACTS") or REPO / "test-artifacts") / "dashboard"
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_a_real_browser_signs_in_opens_a_job_and_sees_the_burndown(lab: Lab) -> None:
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMIUM)):
        pytest.fail(f"{CHROMIUM} is missing: {SETUP_HINT}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"playwright is not installed in this Python: {SETUP_HINT}")
    d, port, jobs = lab.d, lab.port, lab.jobs
    text = token(d, "alice")["token"]
    shots = artifacts_dir()
    t0 = time.monotonic()
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root, where Chromium's sandbox will not start.
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/jobs")
            assert page.url.endswith("/login")
            page.fill("input[name=token]", text)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"/jobs$"))
            page.screenshot(path=str(shots / "1-jobs.png"), full_page=True)
            assert page.locator("table tbody tr").count() == 1 and "web-alice" in page.content()
            cookie = next(c for c in page.context.cookies() if c["name"] == "gbroker_session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert page.evaluate("document.cookie") == ""  # no script can read the session

            page.click(f"a[href='/jobs/{jobs['alice']}']")
            page.wait_for_url(re.compile(rf"/jobs/{jobs['alice']}$"))
            assert page.locator("h1").inner_text() == f"Job {jobs['alice']}"
            assert page.get_by_text("completed").count() >= 1
            page.screenshot(path=str(shots / "2-job.png"), full_page=True)

            page.click("a[href='/spend']")
            page.wait_for_url(re.compile(r"/spend$"))
            chart = page.locator("svg.burndown")
            chart.wait_for()
            box = chart.bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100  # drawn, not just present
            points = page.locator("svg.burndown g[data-group='vision'] circle.point")
            assert points.count() >= 2  # the budget at the start, then after alice's charge
            ys = [float(points.nth(i).get_attribute("cy") or 0) for i in range(points.count())]
            assert ys[-1] > ys[0]  # money left went down: the last dot is lower
            assert page.locator("svg.burndown polyline.spent").first.is_visible()
            chart.screenshot(path=str(shots / "3-burndown.png"))
            page.screenshot(path=str(shots / "3-spend.png"), full_page=True)

            page.goto(f"http://127.0.0.1:{port}/jobs/{jobs['carol']}")
            assert "web-carol" not in page.content() and "no job" in page.content()
            page.click("a[href='/nodes']")
            page.wait_for_url(re.compile(r"/nodes$"))
            page.screenshot(path=str(shots / "4-nodes.png"), full_page=True)

            # Signing out ends the session on the server: a copy of the cookie opens nothing after it.
            assert http(port, "/jobs", f"gbroker_session={cookie['value']}")[0] == 200
            page.click("header button[type=submit]")
            page.wait_for_url(re.compile(r"/login$"))
            assert not any(c["name"] == "gbroker_session" for c in page.context.cookies())
            code, headers, _ = http(port, "/jobs", f"gbroker_session={cookie['value']}")
            assert code == 303 and headers["Location"] == "/login"
        finally:
            browser.close()
    print(f"browser test: {time.monotonic() - t0:.1f}s; screenshots in {shots}")
    for name in ("1-jobs.png", "2-job.png", "3-burndown.png", "4-nodes.png"):
        assert (shots / name).stat().st_size > 1000, name
