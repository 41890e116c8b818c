"""The limits every HTTP request meets: numbers in ASCII digits, one Content-Length, a head of at most
64 KiB, an answer for every request (broker/http_fields.py, broker/http_wire.py, broker/api.py), and
the ops listener's slots shared by who connects as the kernel names them (broker/ops/listener.py,
broker/ops/peers.py). Real sockets throughout; the attacks on the real daemon are in
tests/integration/test_attacks_http.py."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from broker import http_wire as hw
from broker.api import ApiServer
from broker.http_fields import HttpError, ascii_digits, content_length, whole_number
from broker.ops import peers
from broker.ops.listener import Slots
from broker.ops.peers import Peer, peer_of, socket_owner


def refusal(fn: Any, *args: Any) -> HttpError:
    with pytest.raises(HttpError) as e:
        fn(*args)
    return e.value


# -- numbers ---------------------------------------------------------------------
def test_a_number_is_ascii_digits_and_nothing_else() -> None:
    assert [ascii_digits(s) for s in ("0", "42", "007", "9" * 18)] == [0, 42, 7, int("9" * 18)]
    # '²' passes str.isdigit() and int() refuses it; '٣' and '３' pass both; all are refused here.
    for raw in ("²", "٣", "３", "1²", "", " 1", "1 ", "+1", "-1", "1_000", "0x1", "1.0", "9" * 19, "1\n"):
        assert ascii_digits(raw) is None, raw
        e = refusal(whole_number, raw, "job id")
        assert e.status == 400 and e.message.startswith("job id ") and "whole number" in e.message, raw
        assert "0-9" in (e.hint or "")
    assert ascii_digits("12345", max_digits=4) is None


def test_content_length_is_one_number_and_never_next_to_a_transfer_encoding() -> None:
    assert content_length([], False) == 0
    assert content_length(["12"], False) == 12
    assert content_length(["12, 12", "12"], False) == 12  # the same length repeated (RFC 9110 8.6)
    for values in (["12", "13"], ["12, 13"], ["1", "2"]):
        e = refusal(content_length, values, False)
        assert e.status == 400 and "different Content-Lengths" in e.message, values
    for values in (["²"], ["\xb2"], ["12,"], [""], ["-1"], ["1e3"]):
        assert refusal(content_length, values, False).status == 400, values
    e = refusal(content_length, ["5"], True)
    assert e.status == 400 and "both Transfer-Encoding and Content-Length" in e.message
    assert refusal(content_length, [], True).status == 411


def test_the_socket_reads_every_content_length_a_head_carries() -> None:
    def length(*lines: str) -> int:
        return hw.parse_head("\r\n".join(["POST /v1/ops/ping HTTP/1.1", *lines]).encode("latin-1")).content_length

    assert length("Content-Length: 2", "content-length: 2") == 2
    assert refusal(length, "Content-Length: 2", "Content-Length: 20").status == 400
    assert refusal(length, "Content-Length: 2", "Transfer-Encoding: chunked").status == 400
    assert refusal(length, "Content-Length: \xb2").status == 400  # '²' in Latin-1, one byte
    route = hw.parse_head(b"GET /v1/jobs/%C2%B2 HTTP/1.1")
    assert route.path == "/v1/jobs/²"
    e = refusal(hw.route, route, b"", ["show"])
    assert e.status == 400 and "job id '²'" in e.message
    assert refusal(hw.route, hw.parse_head(b"GET /v1/jobs?limit=%C2%B2 HTTP/1.1"), b"", ["list"]).status == 400


# -- the head ----------------------------------------------------------------------
def a_head(total: int) -> bytes:
    """A request head of exactly ``total`` bytes, its empty line included."""
    start, end = b"GET /v1/ping HTTP/1.1\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (total - len(start) - len(end)) + end


def test_the_head_limit_holds_to_the_byte_however_the_head_arrives() -> None:
    limit = hw.MAX_HEAD_BYTES
    assert hw.head_length(a_head(limit)) == limit
    assert hw.head_length(a_head(limit) + b"a body") == limit
    assert hw.head_length(b"GET / HTTP/1.1\n\n") == 16  # bare LF lines too
    e = refusal(hw.head_length, a_head(limit + 1))
    assert e.status == 431 and str(limit) in e.message
    assert hw.head_length(a_head(limit)[:-1]) is None  # may still end within the limit
    assert refusal(hw.head_length, a_head(limit + 1)[:limit]).status == 431  # cannot any more
    # The head ends at its first empty line, not at a later CRLF CRLF.
    assert hw.head_length(b"GET / HTTP/1.1\r\nA: b\n\nC: d\r\n\r\n") == len(b"GET / HTTP/1.1\r\nA: b\n\n")


@pytest.fixture
def api() -> Iterator[ApiServer]:
    import shutil

    base = tempfile.mkdtemp(prefix="gb-http-limits-")
    os.chmod(base, 0o755)

    def show(caller: Any, args: dict[str, Any]) -> Any:
        return {"id": args["job_id"]}

    srv = ApiServer(f"{base}/s.sock", {"ping": lambda c, a: {"user": c.name}, "show": show},
                    admin_group="gbroker-test-admins-none")
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    shutil.rmtree(base, ignore_errors=True)


def ask(path: str, raw: bytes) -> tuple[int, bytes]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall(raw)
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    s.close()
    assert buf, "no answer at all"
    return int(buf.split()[1]), buf.partition(b"\r\n\r\n")[2]


def test_the_socket_answers_every_request_and_logs_each_refusal(api: ApiServer,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker.api")
    limit = hw.MAX_HEAD_BYTES
    assert ask(api.path, a_head(limit))[0] == 200
    code, body = ask(api.path, a_head(limit + 1))
    assert code == 431 and b"larger than 65536 bytes" in body
    assert ask(api.path, a_head(82 * 1024))[0] == 431  # in one write (the old code read it whole)
    code, body = ask(api.path, b"POST /v1/ops/ping HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
    assert code == 400 and b"Content-Length" in body
    assert ask(api.path, b"GET /v1/jobs/%C2%B2 HTTP/1.1\r\n\r\n")[0] == 400
    assert ask(api.path, b"GET /v1/jobs/42 HTTP/1.1\r\n\r\n") == (200, b'{"id": 42}\n')
    assert ask(api.path, b"POST /v1/ops/ping HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 20\r\n\r\n{}")[0] \
        == 400
    assert ask(api.path, b"POST /v1/ops/ping HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n"
                         b"\r\n{}")[0] == 400
    refused = [r.getMessage() for r in caplog.records if "HTTP request refused" in r.getMessage()]
    assert any("(431)" in m for m in refused) and any("Content-Length '²'" in m for m in refused), refused
    assert any("job id '²'" in m for m in refused) and any("different Content-Lengths" in m for m in refused)


def test_a_bug_anywhere_in_an_http_request_is_answered_500_and_logged(
        api: ApiServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: Any) -> Any:
        raise ValueError("a bug in routing")

    monkeypatch.setattr(hw, "route", broken)
    code, body = ask(api.path, b"GET /v1/ops/ping HTTP/1.1\r\n\r\n")
    assert code == 500 and b"internal error" in body and b"a bug in routing" in body
    assert any(r.exc_info and "HTTP request from uid" in r.getMessage() for r in caplog.records)
    assert api.open_connections() == {}
    monkeypatch.undo()
    assert ask(api.path, b"GET /v1/ping HTTP/1.1\r\n\r\n")[0] == 200  # it serves on


# -- who is at the other end -----------------------------------------------------
PEER_AS = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_kernel_names_the_user_at_the_other_end_of_a_loopback_connection(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as srv:
        srv.bind((host, 0))
        srv.listen()
        port = srv.getsockname()[1]
        p = subprocess.Popen([sys.executable, "-c", PEER_AS, host, str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, user="alice", cwd="/tmp")
        try:
            conn, _ = srv.accept()
            with conn:
                assert p.stdout is not None
                client_port = int(p.stdout.readline())
                assert peer_of(conn) == Peer(host, 1001)
                assert socket_owner(host, client_port, host, port) == 1001
                # The server's own end of the connection is not the peer's socket: it is root's.
                assert socket_owner(host, port, host, client_port) == 0
            with socket.create_connection((host, port)), srv.accept()[0] as conn:
                assert peer_of(conn).uid == os.getuid()
            assert socket_owner(host, 1, host, port) is None  # no such socket on this host
        finally:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(10)


def test_a_peer_not_named_by_the_kernel_counts_by_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_diag(*_: Any) -> int | None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(peers, "socket_owner", no_diag)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()), srv.accept()[0] as conn:
            peer = peer_of(conn)
    assert peer == Peer("127.0.0.1", None) and peer.key == "address 127.0.0.1"
    assert Peer("127.0.0.1", 1001).key == "uid 1001"


# -- the listener's slots ------------------------------------------------------------
def test_one_peer_holds_at_most_its_share_and_root_keeps_a_reserve() -> None:
    told: list[str] = []
    slots = Slots(total=6, per_peer=2, root_reserve=1, refused=told.append)
    alice, bob, carol, root = (Peer("127.0.0.1", u) for u in (1001, 1002, 1003, 0))
    assert [slots.take(alice) for _ in range(2)] == [None, None]
    assert "from uid 1001 at once (2 at most)" in (slots.take(alice) or "")
    assert [slots.take(bob), slots.take(bob), slots.take(carol), slots.take(carol)] == [None] * 4
    assert slots.take(Peer("10.0.0.5", None)) == "too many connections at once: try again"
    assert slots.take(root) is None  # the reserve
    assert slots.take(root) is not None
    slots.give_back(alice)
    assert slots.take(Peer("10.0.0.5", None)) is None
    assert slots.held() == {"uid 1001": 1, "uid 1002": 2, "uid 1003": 2, "uid 0": 1, "address 10.0.0.5": 1}
    assert told == ["per_peer", "full", "full"]  # alice's third; the stranger, and root past its reserve


def _fake_world() -> Any:
    """The listener's only use of services here is /readyz; the tests below replace it."""
    from broker.ops.stats import DaemonStats

    class Svc:
        pass

    return Svc(), DaemonStats()


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from broker.ops import listener as ops_listener
    from broker.web.app import Response

    monkeypatch.setattr(ops_listener, "registry", lambda svc, stats: None)

    class Web:
        """The dashboard's two posts, answered as a dashboard would (the listener is under test)."""

        def post(self, path: str, headers: Any, body: bytes) -> Response:
            return Response(200, b"form of %d bytes\n" % len(body), "text/plain")

        def get(self, path: str, headers: Any) -> Response:
            return Response(200, b"page\n", "text/plain")

    svc, stats = _fake_world()
    ops = ops_listener.OpsListener(svc, stats, "127.0.0.1", 0, web=Web(), max_connections=4, max_per_peer=2,
                                   root_reserve=1, request_timeout_s=2, head_deadline_s=1.0,
                                   connection_deadline_s=5)
    ops.start()
    yield ops
    ops.stop()


def post(ops: Any, raw: bytes) -> tuple[int, bytes]:
    with socket.create_connection(ops.address, timeout=10) as s:
        s.sendall(raw)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    assert buf, "no answer at all"
    return int(buf.split()[1]), buf.partition(b"\r\n\r\n")[2]


def test_the_listener_answers_a_bad_form_length_and_a_bug(listener: Any, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from broker.ops import listener as ops_listener

    caplog.set_level(logging.INFO, logger="broker.ops.listener")
    assert post(listener, b"POST /login HTTP/1.1\r\nContent-Length: 5\r\n\r\ntoken") == (200, b"form of 5 bytes\n")
    code, body = post(listener, b"POST /login HTTP/1.1\r\nContent-Length: \xb2\r\n\r\ntoken")
    assert code == 400 and "Content-Length '²'".encode() in body
    assert post(listener, b"POST /login HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\ntoken")[0] == 400
    assert post(listener, b"POST /logout HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")[0] \
        == 400
    assert post(listener, b"POST /login HTTP/1.1\r\nContent-Length: 65537\r\n\r\n")[0] == 413
    assert any("refused (400): Content-Length '²'" in r.getMessage() for r in caplog.records)

    def broken(*_: Any) -> Any:
        raise RuntimeError("readiness broke")

    monkeypatch.setattr(ops_listener, "readiness", broken)
    code, body = post(listener, b"GET /readyz HTTP/1.1\r\n\r\n")
    assert code == 500 and b"daemon's log" in body
    assert any(r.exc_info and "GET /readyz failed" in r.getMessage() for r in caplog.records)


def test_the_listener_holds_the_head_limit_over_all_its_lines(listener: Any) -> None:
    """http.server bounds each header line and their number, not their sum: 90 lines of 1,000
    bytes is a head of 90 KB, past the 64 KiB every gbroker listener takes."""
    line = b"X-Pad: " + b"a" * 991 + b"\r\n"  # 1,000 bytes
    code, body = post(listener, b"GET /healthz HTTP/1.1\r\n" + line * 90 + b"\r\n")
    assert code == 431 and b"over 65536 bytes" in body
    assert post(listener, b"GET /healthz HTTP/1.1\r\n" + line * 60 + b"\r\n")[0] == 200
    # A form's body is not the head's: a 60 KB form after a short head is read as it is.
    form = b"token=" + b"x" * 60_000
    assert post(listener, b"POST /login HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(form), form)) == \
        (200, b"form of %d bytes\n" % len(form))


SLOW_AS = r"""
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
for s in socks:
    s.sendall(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
print("open", flush=True)
sys.stdin.read()
"""


def test_one_users_slow_connections_take_their_share_and_a_bounded_time(listener: Any) -> None:
    base = f"http://127.0.0.1:{listener.address[1]}"
    p = subprocess.Popen([sys.executable, "-c", SLOW_AS, "127.0.0.1", str(listener.address[1]), "3"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user="alice", cwd="/tmp")
    try:
        assert p.stdout is not None and p.stdout.readline() == "open\n"
        until = time.monotonic() + 5
        while (listener.server.slots.held().get("uid 1001", 0) < 2 or not listener.stats.connections_refused) \
                and time.monotonic() < until:
            time.sleep(0.01)
        assert listener.server.slots.held() == {"uid 1001": 2}  # her third was answered 503
        assert listener.stats.connections_refused == {"per_peer": 1}  # and counted (the metric's figure)
        with urllib.request.urlopen(base + "/healthz", timeout=5) as r:  # root, on the shared slots
            assert r.status == 200
        # Her heads never end: the head deadline (1 s here) gives the slots back.
        until = time.monotonic() + 4
        while listener.server.slots.held() and time.monotonic() < until:
            time.sleep(0.05)
        assert listener.server.slots.held() == {}
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(10)
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
        assert r.status == 200


def test_the_dashboard_reads_its_numbers_the_same_way() -> None:
    from broker.errors import BrokerError
    from broker.web.app import _page_number

    assert _page_number("page=3") == 3 and _page_number("") == 1
    for raw in ("%C2%B2", "%D9%A3", "0", "1" * 10):  # '²' broke int() (500), '٣' was read as 3
        with pytest.raises(BrokerError, match="give a whole number from 1"):
            _page_number(f"page={raw}")
