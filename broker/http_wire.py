"""HTTP/1.1 on the daemon's UNIX socket, next to the CLI's JSON-lines wire.

``curl --unix-socket /run/gbroker/gbroker.sock http://gbroker/v1/jobs`` reaches
the operations the CLI uses, as the same caller: who asks is read from the
kernel (SO_PEERCRED) by ``broker.api``; no header, cookie or field of the
request names a user, and none is read. The same limits hold (one request per
connection, the whole request within the read timeout and the size bound).

This module is the HTTP side only, and pure: parse a request head, route it
to an operation and its arguments, and write the answer with a status code.
Routes (``ROUTES``) and the OpenAPI document (``openapi()``, kept in
``docs/openapi.json``; a unit test checks the two agree) come from one table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from broker.errors import BrokerError
from broker.http_fields import HttpError as HttpError  # the servers catch it as http_wire's
from broker.http_fields import MAX_HEAD_BYTES as MAX_HEAD_BYTES  # the socket's server reads it here
from broker.http_fields import content_length, whole_number
from broker.spec_schema import anchored, job_spec_schema

API_VERSION = "v1"
# MAX_HEAD_BYTES (broker.http_fields, for both servers): the request line and the header lines, each
# with its line ending, and the empty line that ends them: a head of exactly that many bytes is read,
# one byte more is refused with 431.
_HEAD_END = re.compile(rb"\n\r?\n")
METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS")
_REQUEST_LINE = re.compile(rb"^([A-Z]{3,7}) (\S{1,8192}) HTTP/1\.[01]\r?\n$")

STATUS_TEXT = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
               409: "Conflict", 411: "Length Required", 413: "Content Too Large",
               431: "Request Header Fields Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
               503: "Service Unavailable"}
STATUS_OF_EXIT = {2: 400, 3: 404, 4: 403, 5: 409, 6: 503, 7: 502}
"""An error's exit code (``broker.errors``) -> HTTP status: bad input 400, not found (or not
yours) 404, not allowed 403, refused by admission 409, busy 503, Slurm 502."""


def is_http(first_line: bytes) -> bool:
    """True when a connection's first line is an HTTP request line (not a JSON-lines request)."""
    return first_line[:8].split(b" ", 1)[0].decode("ascii", "replace") in METHODS and \
        _REQUEST_LINE.match(first_line) is not None


@dataclass(frozen=True)
class Head:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names; a header sent more than once has its values joined by ", " (RFC 9110 5.3),
    so two Content-Lengths are both seen."""

    @property
    def content_length(self) -> int:
        """The body's length (0 without one); HttpError when the request's framing is unclear."""
        raw = self.headers.get("content-length")
        return content_length([] if raw is None else [raw], "transfer-encoding" in self.headers)


def head_length(buf: bytes, limit: int = MAX_HEAD_BYTES) -> int | None:
    """How many bytes of ``buf`` the head takes (to the end of its first empty line), None while it
    may still come, or HttpError 431 once it cannot end within ``limit`` bytes."""
    m = _HEAD_END.search(buf, 0, limit)
    if m is not None:
        return m.end()
    if len(buf) >= limit:
        raise HttpError(431, f"the request's head (request line and headers) is larger than {limit} bytes",
                        hint="send fewer or shorter headers")
    return None


def parse_head(raw: bytes) -> Head:
    """The request line and headers (up to the empty line; it may be included)."""
    lines = raw.split(b"\n")
    m = _REQUEST_LINE.match(lines[0] + b"\n")
    if m is None:
        raise HttpError(400, "malformed HTTP request line")
    method, target = m.group(1).decode(), m.group(2).decode("ascii", "replace")
    if method not in METHODS:
        raise HttpError(405, f"method {method} is not served")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed HTTP header line")
        key, text = name.decode("ascii", "replace").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    url = urlsplit(target)
    return Head(method=method, path=unquote(url.path), query=parse_qs(url.query, keep_blank_values=True),
                headers=headers)


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise HttpError(400, f"query parameter {name!r} given {len(values)} times")
    return values[0]


def _flag(query: Mapping[str, list[str]], name: str, default: bool) -> bool:
    raw = _one(query, name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise HttpError(400, f"query parameter {name}={raw[:20]!r} is not true or false")


def _job_id(raw: str) -> int:
    return whole_number(raw, "job id")


Args = Callable[[Mapping[str, str], Mapping[str, list[str]], Any], dict[str, Any]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str
    """``/v1/jobs/{job_id}``: names in braces match one path segment."""
    op: str | None
    """The operation it calls; None: ``{op}`` in the path names it."""
    summary: str
    args: Args
    query: tuple[str, ...] = ()
    """Query parameters it reads (any other is refused)."""
    body: bool = False

    def match(self, path: str) -> dict[str, str] | None:
        want, got = self.pattern.strip("/").split("/"), path.strip("/").split("/")
        if len(want) != len(got):
            return None
        params = {}
        for w, g in zip(want, got, strict=True):
            if w.startswith("{"):
                if not g:
                    return None
                params[w[1:-1]] = g
            elif w != g:
                return None
        return params


def _list_args(_: Mapping[str, str], q: Mapping[str, list[str]], __: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"active": _flag(q, "active", True), "all_users": _flag(q, "all_users", False)}
    limit = _one(q, "limit")
    if limit is not None:
        args["limit"] = whole_number(limit, "limit")
    for name in ("user", "group", "state"):
        if (value := _one(q, name)) is not None:
            args[name] = value
    if "partition" in q:
        args["partitions"] = q["partition"]  # may be given more than once
    return args


def _submit_args(_: Mapping[str, str], __: Mapping[str, list[str]], body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or "spec" not in body:
        raise HttpError(400, 'the body must be a JSON object {"spec": {...}, "key": "...", "log": "..."}',
                        hint="key is the idempotency key: the same key returns the same job; log, the job's "
                             "log you made (key and log may be left out)")
    unknown = sorted(set(body) - set(SUBMIT_FIELDS))
    if unknown:
        raise HttpError(400, f"unknown field(s) in the body: {', '.join(unknown)}",
                        hint=f"it takes: {', '.join(SUBMIT_FIELDS)}")
    return {k: body[k] for k in SUBMIT_FIELDS if k in body}


SUBMIT_FIELDS = ("spec", "key", "log")
"""What a ``POST /v1/jobs`` body may hold: the submit operation's arguments."""


def _body_args(_: Mapping[str, str], __: Mapping[str, list[str]], body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object of the operation's arguments")
    return body


ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/ping", "ping", "Who the daemon sees calling (uid from the kernel) and whether an admin",
          lambda p, q, b: {}),
    Route("GET", "/v1/jobs", "list", "The caller's jobs, newest first (all users' for an admin with "
          "all_users=true); user, group, state (instead of active) and partition filter them",
          _list_args, query=("active", "all_users", "limit", "user", "group", "state", "partition")),
    Route("POST", "/v1/jobs", "submit", "Submit a job: the spec as `gbroker submit --json` would send it",
          _submit_args, body=True),
    Route("GET", "/v1/jobs/{job_id}", "show", "One of the caller's jobs, with its attempts and events",
          lambda p, q, b: {"job_id": _job_id(p["job_id"])}),
    Route("DELETE", "/v1/jobs/{job_id}", "cancel", "Cancel one of the caller's jobs",
          lambda p, q, b: {"job_ids": [_job_id(p["job_id"])]}),
    Route("POST", "/v1/ops/{op}", None, "Any operation of the CLI, by name, with its arguments as the body",
          _body_args, body=True),
)
OPENAPI_PATH = f"/{API_VERSION}/openapi.json"


@dataclass(frozen=True)
class Routed:
    op: str | None
    """None: the OpenAPI document."""
    args: dict[str, Any]


def route(head: Head, body: bytes, ops: Sequence[str]) -> Routed:
    """The operation and arguments a request asks for, or HttpError."""
    if head.path == OPENAPI_PATH:
        if head.method != "GET":
            raise HttpError(405, f"{head.path} is read with GET", headers={"Allow": "GET"})
        return Routed(None, {})
    allowed = []
    for r in ROUTES:
        params = r.match(head.path)
        if params is None:
            continue
        if r.method != head.method:
            allowed.append(r.method)
            continue
        unknown = sorted(set(head.query) - set(r.query))
        if unknown:
            raise HttpError(400, f"unknown query parameter(s) for {r.method} {r.pattern}: {', '.join(unknown)}",
                            hint=f"it takes: {', '.join(r.query) or 'none'}")
        parsed: Any = None
        if r.body and body.strip():
            if "json" not in head.headers.get("content-type", "application/json"):
                raise HttpError(400, "the body must be JSON", hint="send Content-Type: application/json")
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):
                raise HttpError(400, "the body is not valid JSON") from None
        elif body.strip():
            raise HttpError(400, f"{r.method} {r.pattern} takes no body")
        op = r.op if r.op is not None else params["op"]
        if op not in ops:
            raise HttpError(404, f"unknown operation {op[:64]!r}", hint=f"see {OPENAPI_PATH}")
        return Routed(op, r.args(params, head.query, parsed))
    if allowed:
        raise HttpError(405, f"{head.path} does not take {head.method}", headers={"Allow": ", ".join(allowed)})
    raise HttpError(404, f"no such path {head.path[:200]!r}", hint=f"the API is described at {OPENAPI_PATH}")


def status_of(answer: Mapping[str, Any]) -> int:
    """The HTTP status of a JSON-lines answer (``{"ok": ...}``)."""
    if answer.get("ok"):
        return 200
    err = answer.get("error") or {}
    if err.get("type") == "RequestTooLarge":
        return 413
    if str(err.get("message", "")).startswith("internal error"):
        return 500
    return STATUS_OF_EXIT.get(int(err.get("exit_code", 1)), 400)


def response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> bytes:
    body = (json.dumps(payload, default=str, indent=None) + "\n").encode()
    lines = [f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close", "Cache-Control: no-store",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_payload(exc: BrokerError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint or "",
                      "exit_code": exc.exit_code}}


QUERY_TYPES: dict[str, dict[str, Any]] = {
    "active": {"type": "boolean"}, "all_users": {"type": "boolean"}, "limit": {"type": "integer"},
    "user": {"type": "string"}, "group": {"type": "string"}, "state": {"type": "string"},
    "partition": {"type": "string", "description": "may be given more than once"},
}


def openapi(ops: Sequence[str]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ROUTES`` (``ops``: the operations ``/v1/ops/{op}`` takes)."""
    error = {"description": "refused; the body says why and what to do",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        item: dict[str, Any] = {
            "summary": r.summary,
            "operationId": f"{r.method.lower()}_{(r.op or 'op')}",
            "responses": {"200": {"description": "the operation's result (as the CLI's --json shows it)",
                                  "content": {"application/json": {"schema": {}}}},
                          "400": error, "403": error, "404": error, "409": error, "413": error,
                          "431": error, "500": error, "503": error},
        }
        params = [{"name": name[1:-1], "in": "path", "required": True,
                   "schema": {"type": "string", **({"enum": sorted(ops)} if name == "{op}" else {})}}
                  for name in r.pattern.split("/") if name.startswith("{")]
        params += [{"name": q, "in": "query", "required": False, "schema": QUERY_TYPES[q]} for q in r.query]
        if params:
            item["parameters"] = params
        if r.body:
            body = {"$ref": "#/components/schemas/SubmitRequest"} if r.op == "submit" else {"type": "object"}
            item["requestBody"] = {"required": r.op == "submit", "content": {"application/json": {"schema": body}}}
        paths.setdefault(r.pattern, {})[r.method.lower()] = item
    paths[OPENAPI_PATH] = {"get": {"summary": "This document", "operationId": "get_openapi",
                                   "responses": {"200": {"description": "OpenAPI 3.1",
                                                         "content": {"application/json": {"schema": {}}}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gbroker daemon API", "version": API_VERSION,
                 "description": "HTTP/1.1 on the daemon's UNIX socket. The caller is the Unix user the kernel "
                                "names for the connecting process (SO_PEERCRED); nothing in a request names a "
                                "user. One request per connection."},
        "servers": [{"url": "http://gbroker"}],
        "paths": paths,
        "components": {"schemas": {"Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "properties": {
                "type": {"type": "string"}, "message": {"type": "string"}, "hint": {"type": "string"},
                "exit_code": {"type": "integer"}}}}},
            "SubmitRequest": submit_request_schema(), "JobSpec": job_spec_schema()}},
    }


def submit_request_schema() -> dict[str, Any]:
    """The body of ``POST /v1/jobs`` as ``_submit_args`` reads it: the spec, and the key the daemon checks."""
    from broker.jobs.submit import KEY_RE  # here, not at the top: only the document needs it

    key = {"type": "string", "pattern": anchored(KEY_RE.pattern.removeprefix("^").removesuffix("$")),
           "description": "the idempotency key: the same key sent again returns the job it made the first "
                          "time; leave it out and the daemon makes one ('gb-' and 8-40 lower-case letters or "
                          "digits)"}
    log = {"type": "string", "description": "the job's log, made by the caller in the job's workdir as "
                                            "gbroker-<name>-XXXXXX.out (six random letters or digits); the "
                                            "daemon refuses any other path and opens none. Left out, the "
                                            "daemon makes it, as the caller"}
    return {"type": "object", "required": ["spec"], "additionalProperties": False,
            "properties": {"spec": {"$ref": "#/components/schemas/JobSpec"}, "key": key, "log": log},
            "description": "A job to submit (POST /v1/ops/submit takes the same fields)"}
