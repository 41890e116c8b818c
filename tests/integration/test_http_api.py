"""HTTP/1.1 on the daemon's UNIX socket, with curl as the users, against the real daemon:
a user reads their own jobs and is refused another user's, whatever the request claims."""

from __future__ import annotations

import json
import pwd
from pathlib import Path
from typing import Any

import pytest

from attack_tools import run_as
from broker_fixtures import REPO, BrokerDaemon, broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm


def curl(d: BrokerDaemon, user: str, path: str, *extra: str) -> tuple[int, Any]:
    p = run_as(d, user, ["curl", "-sS", "-w", "\n%{http_code}", "--unix-socket", d.socket, *extra,
                         f"http://gbroker{path}"], timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    body, _, code = p.stdout.decode().rpartition("\n")
    return int(code), json.loads(body) if body.strip() else None


def submit(d: BrokerDaemon, user: str, group: str) -> int:
    r = d.cli("submit", "--json", "--group", group, "--time", "5m", "--", "sleep", "300", user=user,
              cwd=user_dir(public_dir(f"gbroker-http-{user}-"), user))
    assert r.code == 0, r.err
    return int(r.json()["id"])


def test_curl_reads_the_callers_own_jobs_and_is_refused_anyone_elses(broker_daemon):
    d = broker_daemon
    mine, theirs = submit(d, "alice", "vision"), submit(d, "carol", "climate")
    try:
        code, who = curl(d, "alice", "/v1/ping")
        assert (code, who["user"], who["admin"]) == (200, "alice", False)
        code, jobs = curl(d, "alice", "/v1/jobs")
        assert code == 200 and [j["id"] for j in jobs] == [mine], jobs
        code, job = curl(d, "alice", f"/v1/jobs/{mine}")
        assert code == 200 and job["id"] == mine and job["owner"] == "alice", job
        # Another user's job: not found for alice, whatever she claims to be.
        for extra in ((), ("-H", "X-Remote-User: carol"), ("-H", "Authorization: Bearer carol"),
                      ("-H", "Cookie: user=carol")):
            code, answer = curl(d, "alice", f"/v1/jobs/{theirs}", *extra)
            assert code == 404 and "no job" in answer["error"]["message"], answer
            code, jobs = curl(d, "alice", "/v1/jobs?all_users=true", *extra)
            assert code == 403 or [j["id"] for j in jobs] == [mine], (code, jobs)
        code, answer = curl(d, "alice", f"/v1/jobs/{theirs}", "-X", "DELETE")
        assert code == 404, answer
        assert d.show(theirs, user="carol")["state"] in ("pending", "running")
        # A submission over HTTP belongs to the caller the kernel names; a spec cannot say otherwise.
        spec = {"group": "vision", "time_limit": "5m", "command": ["sleep", "1"], "owner": "carol"}
        code, answer = curl(d, "alice", "/v1/jobs", "-H", "Content-Type: application/json",
                            "--data", json.dumps({"spec": spec, "key": "gb-httpone1"}))
        assert code == 400 and "owner" in answer["error"]["message"], answer
        del spec["owner"]
        # A log the request names must be one made for this job in its own workdir (here her home).
        home = Path(pwd.getpwnam("alice").pw_dir)
        for log in ("/etc/gbroker-sleep-abcdef.out", str(home / "gbroker-other-abcdef.out"),
                    str(home / "gbroker-sleep-abc/../x.out"), str(home / "thesis.tex")):
            code, answer = curl(d, "alice", "/v1/jobs", "-H", "Content-Type: application/json",
                                "--data", json.dumps({"spec": {**spec, "name": "sleep"}, "key": "gb-httplog1",
                                                      "log": log}))
            assert code == 400 and "is not a log made for job sleep" in answer["error"]["message"], (log, answer)
        code, made = curl(d, "alice", "/v1/jobs", "-H", "Content-Type: application/json",
                          "--data", json.dumps({"spec": spec, "key": "gb-httpone1"}))
        assert code == 200, made
        shown = d.show(made["id"], user="alice")
        assert shown["owner"] == "alice"
        # Without one, the daemon made it, as her, in her home.
        made_log = Path(shown["log"])
        assert made_log.parent == home and made_log.stat().st_uid == pwd.getpwnam("alice").pw_uid, shown["log"]
        assert made_log.stat().st_mode & 0o777 == 0o600
        code, again = curl(d, "alice", "/v1/jobs", "-H", "Content-Type: application/json",
                           "--data", json.dumps({"spec": spec, "key": "gb-httpone1"}))
        assert code == 200 and again["id"] == made["id"], again  # the key makes it idempotent
        # The admin sees everyone's.
        code, jobs = curl(d, "root", "/v1/jobs?all_users=true")
        assert code == 200 and {mine, theirs} <= {j["id"] for j in jobs}
        # The document the daemon serves is the one kept in the repo.
        code, doc = curl(d, "alice", "/v1/openapi.json")
        kept = json.loads((REPO / "docs" / "openapi.json").read_text())
        assert code == 200 and doc == kept, (
            "docs/openapi.json is out of date: curl --unix-socket SOCK http://gbroker/v1/openapi.json "
            "| python3 -m json.tool > docs/openapi.json")
        # The CLI's own wire still works on the same socket.
        assert d.cli("status", user="alice").code == 0
    finally:
        d.cli("cancel", str(mine), user="alice")
        d.cli("cancel", str(theirs), user="carol")


def test_the_repo_document_names_every_operation_the_daemon_serves():
    doc = json.loads(Path(REPO / "docs" / "openapi.json").read_text())
    ops = next(p for p in doc["paths"]["/v1/ops/{op}"]["post"]["parameters"] if p["name"] == "op")["schema"]["enum"]
    assert {"submit", "list", "show", "cancel", "ping"} <= set(ops)
