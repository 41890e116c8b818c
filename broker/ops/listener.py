"""The opt-in TCP listener: ``/metrics`` (Prometheus text), ``/healthz`` and ``/readyz``.

Off unless ``[metrics] listen`` is set; loopback unless ``allow_remote``
says otherwise (``broker.opsconfig``). It serves only what it computes: no
path a request names is opened, nothing is written, and every other path
or method is refused.
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

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class OpsListener:
    def __init__(self, svc: Services, stats: DaemonStats, host: str, port: int) -> None:
        self.svc = svc
        self.stats = stats
        self.registry = registry(svc, stats)
        handler = _handler(self)
        server_cls: Any = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        try:
            self.server: _Server = server_cls((host, port), handler)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ConfigError(f"cannot listen on {shown} for metrics: {exc.strerror or exc}",
                              hint="another program has the port: pick another [metrics] listen, or stop it") from None
        self.thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.server.serve_forever, name="gbroker-ops-http", daemon=True)
        self.thread.start()
        log.info("metrics and health on http://%s:%s (/metrics, /healthz, /readyz)", *self._shown())

    def _shown(self) -> tuple[str, int]:
        host, port = self.address
        return (f"[{host}]" if ":" in host else host), port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(app: OpsListener) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gbroker"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
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
            self._send(405, b"read-only: GET /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("ops http %s: " + fmt, self.client_address[0], *args)

    return Handler
