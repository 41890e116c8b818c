"""The opt-in TCP listener: ``/metrics`` (Prometheus text), ``/healthz``, ``/readyz`` and the dashboard.

Off unless ``[metrics] listen`` is set; loopback unless ``allow_remote``
says otherwise (``broker.opsconfig``). It serves only what it computes: no
path a request names is opened, nothing is written (but the dashboard's
sessions: a sign-in's session row and note on its token, a sign-out's end),
and every other path or method is refused. The dashboard's pages
(``broker/web/``) are served when the daemon hands it one.

Any local user can connect, and every local client is 127.0.0.1, so slots are
shared by who connects as the kernel names them (``broker.ops.peers``): one
user (one address, for a client not on this host) holds at most
``MAX_PER_PEER`` of the ``MAX_CONNECTIONS``, root has ``ROOT_RESERVE`` more
that nobody else may take, and a connection holds its slot for a bounded
time (its head within ``HEAD_DEADLINE_S``, all of it within
``CONNECTION_DEADLINE_S``). A user who opens slow connections without end
is answered 503 for the ones past their share; everyone else is served.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.errors import ConfigError
from broker.http_fields import MAX_HEAD_BYTES, HttpError, content_length
from broker.ops.health import readiness
from broker.ops.metrics import registry
from broker.ops.peers import Peer, peer_of
from broker.ops.stats import DaemonStats
from broker.state import Services
from broker.web.app import SECURITY_HEADERS, Dashboard, Response, serves

log = logging.getLogger(__name__)


MAX_CONNECTIONS = 32
"""Connections served at once; more are answered 503 at once, so idle ones cannot pile up
threads and file descriptors in the daemon (any local user can connect)."""
MAX_PER_PEER = 8
"""Connections one user (or one remote address) may have served at once: a quarter of the slots,
more than a browser and a scraper need together."""
ROOT_RESERVE = 4
"""Slots past ``MAX_CONNECTIONS`` only root's connections may take: the admin's and systemd's own
checks are answered even while several users together hold every shared slot."""
REQUEST_TIMEOUT_S = 10.0
"""A connection that sends nothing (or a body slower than this between bytes) is closed."""
HEAD_DEADLINE_S = 10.0
"""The request line and headers must have arrived this long after the connection was accepted
(a client sends them in one go; a byte every few seconds is an attack on the slots)."""
CONNECTION_DEADLINE_S = 30.0
"""A connection still open this long after it was accepted is closed, however it trickles bytes."""
LISTEN_BACKLOG = 128
"""Connections the kernel queues before they are accepted (socketserver's default is 5: a burst
of an attacker's connects would drop others' SYNs)."""
FORM_MAX_BYTES = 65536


class HeadTooLarge(Exception):
    """The request line and headers passed ``MAX_HEAD_BYTES`` before their blank line."""


class _HeadBudget:
    """The connection's reader, counting what the head takes: http.server bounds each line
    (64 KiB) and their number (100), not their sum, so one head could hold 6.4 MB. One
    request per connection (HTTP/1.0 answers): the first blank line after the request
    line ends the head, and what follows is the body's, read as it is."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.left, self.lines, self.in_head = inner, limit, 0, True

    def readline(self, size: int = -1) -> bytes:
        if not self.in_head:
            return bytes(self.inner.readline(size))
        want = self.left + 1 if size < 0 else min(size, self.left + 1)
        line = bytes(self.inner.readline(want))
        self.left -= len(line)
        if self.left < 0:
            raise HeadTooLarge()
        self.lines += 1
        if self.lines > 1 and line in (b"\r\n", b"\n"):
            self.in_head = False
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def busy(text: str) -> bytes:
    """A complete 503 answer, sent from the accepting thread before any request is read."""
    body = text.encode() + b"\n"
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


ROOT_KEY = Peer("", 0).key


class Slots:
    """Connections served now, counted per peer (``Peer.key``): at most ``per_peer`` for one, at
    most ``total`` in all, and ``root_reserve`` more that root's connections take first."""

    def __init__(self, total: int, per_peer: int, root_reserve: int,
                 refused: Callable[[str], None] = lambda why: None) -> None:
        self.total, self.per_peer, self.root_reserve = total, per_peer, root_reserve
        self.refused = refused
        """Told each refusal's kind: ``per_peer`` (one peer's share) or ``full`` (every shared slot taken)."""
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    def take(self, peer: Peer) -> str | None:
        """Take a slot for ``peer``; None when taken, else why not (the 503's text)."""
        with self._lock:
            if self._held[peer.key] >= self.per_peer:
                self.refused("per_peer")
                return (f"too many connections from {peer.key} at once ({self.per_peer} at most): "
                        "try again when one has ended")
            if not (peer.uid == 0 and self._held[peer.key] < self.root_reserve) and self._shared() >= self.total:
                self.refused("full")
                return "too many connections at once: try again"
            self._held[peer.key] += 1
            return None

    def _shared(self) -> int:
        """Slots in use out of ``total``: everyone's, but root's first ``root_reserve``."""
        root = self._held.get(ROOT_KEY, 0)
        return sum(self._held.values()) - min(root, self.root_reserve)

    def give_back(self, peer: Peer) -> None:
        with self._lock:
            self._held[peer.key] -= 1
            if self._held[peer.key] <= 0:
                del self._held[peer.key]

    def held(self) -> dict[str, int]:
        """Peer key -> connections served now."""
        with self._lock:
            return dict(self._held)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    slots: Slots

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a thread of its own if its peer has a slot, else 503 at once."""
        peer = peer_of(request)
        refused = self.slots.take(peer)
        if refused is not None:
            log.debug("ops http %s: 503, %s", peer.key, refused)
            try:
                request.sendall(busy(refused))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._serve, args=(request, client_address, peer), daemon=True)
        try:
            thread.start()
        except BaseException:
            self.slots.give_back(peer)
            self.shutdown_request(request)
            raise

    def _serve(self, request: Any, client_address: Any, peer: Peer) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self.slots.give_back(peer)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failure outside the handlers' own guard goes to the daemon's log, not to stderr."""
        log.exception("ops http %s: the connection failed", client_address[0] if client_address else "?")


class OpsListener:
    def __init__(self, svc: Services, stats: DaemonStats, host: str, port: int,
                 web: Dashboard | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 max_per_peer: int = MAX_PER_PEER, root_reserve: int = ROOT_RESERVE,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, head_deadline_s: float = HEAD_DEADLINE_S,
                 connection_deadline_s: float = CONNECTION_DEADLINE_S) -> None:
        self.svc = svc
        self.stats = stats
        self.web = web
        self.registry = registry(svc, stats)
        handler = _handler(self, request_timeout_s, min(head_deadline_s, connection_deadline_s),
                           connection_deadline_s)
        server_cls: Any = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        try:
            self.server: _Server = server_cls((host, port), handler)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ConfigError(f"cannot listen on {shown} for metrics: {exc.strerror or exc}",
                              hint="another program has the port: pick another [metrics] listen, or stop it") from None
        self.server.slots = Slots(max_connections, max_per_peer, root_reserve, stats.connection_refused)
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


def _handler(app: OpsListener, timeout_s: float, head_s: float, deadline_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gbroker"
        sys_version = ""
        timeout = timeout_s  # the socket's: a silent client is dropped, never waited for

        def setup(self) -> None:
            super().setup()
            self.rfile = _HeadBudget(self.rfile, MAX_HEAD_BYTES)  # type: ignore[assignment]
            # A client that trickles a byte before each timeout would keep its slot for ever.
            self._accepted = time.monotonic()
            self._head_in, self._over = threading.Event(), threading.Event()
            self._answered = False
            threading.Thread(target=self._watch, name="gbroker-ops-deadline", daemon=True).start()

        def _watch(self) -> None:
            """Cut the connection when its head is not in by ``head_s``, or at ``deadline_s`` in all."""
            if not self._head_in.wait(head_s):
                self._cut()
            elif not self._over.wait(max(0.0, deadline_s - (time.monotonic() - self._accepted))):
                self._cut()

        def _cut(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def parse_request(self) -> bool:
            parsed = super().parse_request()
            self._head_in.set()
            return parsed

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except HeadTooLarge:
                log.info("ops http %s: refused (431): the request head is over %d bytes", self.client_address[0],
                         MAX_HEAD_BYTES)
                self.close_connection = True
                self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
                self._send(431, f"the request head is over {MAX_HEAD_BYTES} bytes\n".encode(),
                           "text/plain; charset=utf-8")

        def finish(self) -> None:
            self._head_in.set()
            self._over.set()
            try:
                super().finish()
            except OSError:
                pass  # the deadline cut it

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._guarded(self._get)

        def do_POST(self) -> None:  # noqa: N802
            self._guarded(self._post)

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(405, b"", "text/plain")

        def do_PUT(self) -> None:  # noqa: N802
            self._send(405, b"read-only: GET /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        do_DELETE = do_PATCH = do_PUT  # noqa: N815

        def _guarded(self, answer: Callable[[], None]) -> None:
            """Every request gets an answer: a refusal its status (400, 411, 413) and a log line, a
            bug 500 and its traceback in the log (never a connection closed without a word)."""
            try:
                answer()
            except HttpError as exc:
                log.info("ops http %s: %s %s refused (%s): %s", self.client_address[0], self.command,
                         self.path[:200], exc.status, exc.message)
                self._send(exc.status, f"{exc.message}: {exc.hint}\n".encode() if exc.hint else
                           f"{exc.message}\n".encode(), "text/plain; charset=utf-8")
            except OSError as exc:  # the client went away, or the deadline cut it
                log.debug("ops http %s: connection lost: %s", self.client_address[0], exc)
                self.close_connection = True
            except Exception:
                log.exception("ops http %s: %s %s failed", self.client_address[0], self.command, self.path[:200])
                if not self._answered:
                    self._send(500, b"internal error: the daemon's log says why\n", "text/plain; charset=utf-8")

        def _get(self) -> None:
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

        def _post(self) -> None:
            path = self.path.split("?", 1)[0]
            if app.web is not None and path in ("/login", "/logout"):
                length = content_length(self.headers.get_all("Content-Length") or [],
                                        "Transfer-Encoding" in self.headers)
                if length > FORM_MAX_BYTES:
                    self._send(413, b"the form is too large\n", "text/plain; charset=utf-8")
                    return
                try:
                    body = self.rfile.read(length)
                except TimeoutError:
                    self.close_connection = True
                    return
                self._web(lambda web: web.post(path, self.headers, body))
                return
            self._send(405, b"read-only: GET /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        def _web(self, answer: Any) -> None:
            assert app.web is not None
            try:
                r: Response = answer(app.web)
            except Exception:
                log.exception("dashboard request %s %s failed", self.command, self.path[:200])
                r = Response(500, b"internal error: the daemon's log says why\n", "text/plain; charset=utf-8")
            self._send(r.status, r.body, r.ctype, {**SECURITY_HEADERS, **r.headers})

        def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
            self._answered = True
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
