"""The opt-in TCP listener: ``/metrics`` (Prometheus text), ``/healthz``, ``/readyz`` and the dashboard.

Off unless ``[metrics] listen`` is set; loopback unless ``allow_remote``
says otherwise (``broker.opsconfig``). It serves only what it computes: no
path a request names is opened, nothing is written (but the dashboard's
sessions: a sign-in's session row and note on its token, a sign-out's end), and every other path or method is refused. The dashboard's
pages (``broker/web/``) are served when the daemon hands it one.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.errors import ConfigError
from broker.ops.health import readiness
from broker.ops.metrics import registry
from broker.ops.stats import DaemonStats
from broker.state import Services
from broker.web.app import SECURITY_HEADERS, Dashboard, Response, serves

log = logging.getLogger(__name__)


MAX_CONNECTIONS = 32
"""Connections served at once; more are answered 503 at once, so idle ones cannot pile up
threads and file descriptors in the daemon (any local user can connect)."""
REQUEST_TIMEOUT_S = 10.0
"""A connection that sends nothing (or a body slower than this between bytes) is closed."""
CONNECTION_DEADLINE_S = 30.0
"""A connection still open this long after it was accepted is closed, however it trickles bytes."""
_BUSY_TEXT = b"too many connections at once: try again\n"
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class OpsListener:
    def __init__(self, svc: Services, stats: DaemonStats, host: str, port: int,
                 web: Dashboard | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 connection_deadline_s: float = CONNECTION_DEADLINE_S) -> None:
        self.svc = svc
        self.stats = stats
        self.web = web
        self.registry = registry(svc, stats)
        handler = _handler(self, request_timeout_s, connection_deadline_s)
        server_cls: Any = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        try:
            self.server: _Server = server_cls((host, port), handler)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ConfigError(f"cannot listen on {shown} for metrics: {exc.strerror or exc}",
                              hint="another program has the port: pick another [metrics] listen, or stop it") from None
        self.server.slots = threading.BoundedSemaphore(max_connections)
        self.thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.server.serve_forever, name="gbroker-ops-http", daemon=True)
        self.thread.start()
        log.info("metrics and health on http://%s:%s (/metrics, /healthz, /readyz%s)", *self._shown(),
                 ", the dashboard at /" if self.web is not None else "")

    def _shown(self) -> tuple[str, int]:
        host, port = self.address
        return (f"[{host}]" if ":" in host else host), port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(app: OpsListener, timeout_s: float, deadline_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gbroker"
        sys_version = ""
        timeout = timeout_s  # the socket's: a silent client is dropped, never waited for

        def setup(self) -> None:
            super().setup()
            # A client that trickles a byte before each timeout would keep its slot for ever.
            self._deadline = threading.Timer(deadline_s, self._cut)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self) -> None:
            self._deadline.cancel()
            try:
                super().finish()
            except OSError:
                pass  # the deadline cut it

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if app.web is not None and serves(path):
                self._web(lambda web: web.get(self.path, self.headers))
            elif path == "/metrics":
                try:
                    body = generate_latest(app.registry)
                except Exception as exc:
                    log.exception("metrics scrape failed")
                    self._send(500, f"metrics failed: {exc}\n".encode(), "text/plain; charset=utf-8")
                    return
                self._send(200, body, CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/readyz":
                r = readiness(app.svc, app.stats)
                self._send(200 if r.ready else 503, (json.dumps(r.as_dict(), sort_keys=True) + "\n").encode(),
                           "application/json")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(405, b"", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if app.web is not None and path in ("/login", "/logout"):
                length = self.headers.get("Content-Length", "0")
                if not length.isdigit() or int(length) > 65536:
                    self._send(413, b"the form is too large\n", "text/plain; charset=utf-8")
                    return
                try:
                    body = self.rfile.read(int(length))
                except TimeoutError:
                    self.close_connection = True
                    return
                self._web(lambda web: web.post(path, self.headers, body))
                return
            self._send(405, b"read-only: GET /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        def do_PUT(self) -> None:  # noqa: N802
            self._send(405, b"read-only: GET /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        do_DELETE = do_PATCH = do_PUT  # noqa: N815

        def _web(self, answer: Any) -> None:
            assert app.web is not None
            try:
                r: Response = answer(app.web)
            except Exception:
                log.exception("dashboard request %s %s failed", self.command, self.path[:200])
                r = Response(500, b"internal error: the daemon's log says why\n", "text/plain; charset=utf-8")
            self._send(r.status, r.body, r.ctype, {**SECURITY_HEADERS, **r.headers})

        def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("ops http %s: " + fmt, self.client_address[0], *args)

    return Handler
