"""The HTTP side of the daemon's socket (broker/http_wire.py): parsing, routing, status codes,
and the OpenAPI document kept in docs/openapi.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker import http_wire as hw, wiring
from broker.errors import BrokerError, NotFound

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
OPS = ["cancel", "list", "ping", "show", "submit", "report"]


def head(raw: str) -> hw.Head:
    return hw.parse_head(raw.replace("\n", "\r\n").encode())


def routed(method: str, target: str, body: bytes = b"", **headers: str) -> hw.Routed:
    lines = [f"{method} {target} HTTP/1.1", "Host: gbroker", *(f"{k}: {v}" for k, v in headers.items())]
    return hw.route(head("\n".join(lines)), body, OPS)


def refused(method: str, target: str, body: bytes = b"", **headers: str) -> hw.HttpError:
    with pytest.raises(hw.HttpError) as e:
        routed(method, target, body, **headers)
    return e.value


def test_an_http_request_line_is_told_from_a_json_line():
    assert hw.is_http(b"GET /v1/jobs HTTP/1.1\r\n")
    assert hw.is_http(b"POST /v1/jobs HTTP/1.0\n")
    assert not hw.is_http(b'{"op": "list", "args": {}}\n')
    assert not hw.is_http(b"GET /v1/jobs\r\n")  # HTTP/0.9 is not spoken
    assert not hw.is_http(b"BREW /pot HTTP/1.1\r\n")


def test_routes_give_the_cli_operations_with_their_arguments():
    assert routed("GET", "/v1/jobs") == hw.Routed("list", {"active": True, "all_users": False})
    assert routed("GET", "/v1/jobs?active=false&all_users=1&limit=5") == hw.Routed(
        "list", {"active": False, "all_users": True, "limit": 5})
    assert routed("GET", "/v1/jobs?user=bob&group=vision&state=running&partition=spot&partition=spotb") == hw.Routed(
        "list", {"active": True, "all_users": False, "user": "bob", "group": "vision", "state": "running",
                 "partitions": ["spot", "spotb"]})
    assert routed("GET", "/v1/jobs/42") == hw.Routed("show", {"job_id": 42})
    assert routed("DELETE", "/v1/jobs/42") == hw.Routed("cancel", {"job_ids": [42]})
    assert routed("POST", "/v1/jobs", b'{"spec": {"group": "g"}, "key": "k1"}') == hw.Routed(
        "submit", {"spec": {"group": "g"}, "key": "k1"})
    assert routed("POST", "/v1/ops/report", b'{"semester": "s"}') == hw.Routed("report", {"semester": "s"})
    assert routed("POST", "/v1/ops/ping") == hw.Routed("ping", {})
    assert routed("GET", "/v1/openapi.json") == hw.Routed(None, {})


def test_nothing_a_client_writes_is_ignored():
    assert "bogus" in refused("GET", "/v1/jobs?bogus=1").message
    assert "given 2 times" in refused("GET", "/v1/jobs?limit=1&limit=2").message
    assert "given 2 times" in refused("GET", "/v1/jobs?state=a&state=b").message
    assert refused("GET", "/v1/jobs?active=maybe").status == 400
    assert refused("GET", "/v1/jobs?limit=-1").status == 400
    assert "owner" in refused("POST", "/v1/jobs", b'{"spec": {}, "owner": "bob"}').message
    assert refused("POST", "/v1/jobs", b'{"key": "k"}').status == 400
    assert refused("POST", "/v1/jobs", b"not json").status == 400
    assert refused("POST", "/v1/jobs", b'{"spec": {}}', **{"Content-Type": "text/plain"}).status == 400
    assert "takes no body" in refused("GET", "/v1/jobs", b'{"x": 1}').message
    assert refused("POST", "/v1/ops/report", b"[1, 2]").status == 400


def test_unknown_paths_methods_and_operations_say_where_to_look():
    e = refused("GET", "/v2/jobs")
    assert e.status == 404 and "openapi.json" in (e.hint or "")
    e = refused("PUT", "/v1/jobs")
    assert e.status == 405 and e.headers["Allow"] == "GET, POST"
    assert refused("POST", "/v1/ops/format_disk").status == 404
    assert refused("GET", "/v1/jobs/abc").status == 400  # a job id is a number (broker.http_fields)
    assert refused("POST", "/v1/openapi.json").status == 405


def test_malformed_heads_are_refused():
    for raw in (b"GET /v1/jobs HTTP/2\r\n", b"GET /v1/jobs HTTP/1.1\r\nno colon here",
                b"GET /v1/jobs HTTP/1.1\r\n bad: folded"):
        with pytest.raises(hw.HttpError) as e:
            hw.parse_head(raw)
        assert e.value.status == 400
    h = head("POST /v1/jobs HTTP/1.1\nTransfer-Encoding: chunked")
    with pytest.raises(hw.HttpError) as e:
        _ = h.content_length
    assert e.value.status == 411
    with pytest.raises(hw.HttpError):
        _ = head("POST /v1/jobs HTTP/1.1\nContent-Length: 12abc").content_length
    assert head("POST /v1/jobs HTTP/1.1\nContent-Length: 12").content_length == 12


def test_errors_keep_their_meaning_as_status_codes():
    def err(exc: BrokerError) -> dict:
        return {"ok": False, "error": {"type": type(exc).__name__, "message": exc.message, "exit_code": exc.exit_code}}

    assert hw.status_of({"ok": True, "result": []}) == 200
    assert hw.status_of(err(NotFound("no job 9 of yours"))) == 404
    assert hw.status_of(err(BrokerError("internal error in show: boom"))) == 500
    assert hw.status_of({"ok": False, "error": {"type": "RequestTooLarge", "exit_code": 2}}) == 413
    assert hw.status_of({"ok": False, "error": {"type": "Busy", "exit_code": 6}}) == 503
    assert hw.status_of({"ok": False, "error": {"type": "AdmissionRefused", "exit_code": 5}}) == 409
    assert hw.status_of({"ok": False, "error": {"type": "PermissionDenied", "exit_code": 4}}) == 403


def test_a_response_is_complete_http_and_closes():
    raw = hw.response(404, {"error": {"message": "no"}}, {"X-A": "1"})
    head_part, body = raw.split(b"\r\n\r\n", 1)
    lines = head_part.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 404 Not Found"
    assert "Connection: close" in lines and "X-A: 1" in lines
    assert f"Content-Length: {len(body)}" in lines and json.loads(body) == {"error": {"message": "no"}}


def test_every_route_is_in_the_openapi_document_kept_in_the_repo():
    doc = json.loads(DOC.read_text())
    for r in hw.ROUTES:
        assert r.method.lower() in doc["paths"].get(r.pattern, {}), f"{r.method} {r.pattern} missing from {DOC}"
    assert hw.OPENAPI_PATH in doc["paths"]
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert documented == {(r.method, r.pattern) for r in hw.ROUTES} | {("GET", hw.OPENAPI_PATH)}
    # The file is what the code makes for the daemon's own operations (the
    # integration test also compares it with a real daemon's answer).
    ops = next(p for p in doc["paths"]["/v1/ops/{op}"]["post"]["parameters"] if p["name"] == "op")["schema"]["enum"]
    served = sorted(wiring.handlers(None, None))  # the builders only close over svc; nothing is called
    assert ops == served, (
        f"docs/openapi.json lists {sorted(set(ops) - set(served))} the daemon does not serve and misses "
        f"{sorted(set(served) - set(ops))}: regenerate it from http_wire.openapi(sorted(wiring.handlers(...)))")
    assert hw.openapi(served) == doc
