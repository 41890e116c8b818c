"""The socket API with real UNIX sockets: identity from the kernel, errors that say what to do."""

import os
import pwd
import subprocess
import sys
import threading

import pytest

from broker.api import ApiServer
from broker.caller import Caller
from broker.client import RemoteError, call
from broker.errors import DaemonUnavailable, NotFound


@pytest.fixture
def server(tmp_path):
    import shutil
    import tempfile

    # pytest's own tmp dirs are private to root; other users must reach this socket.
    tmp_path = __import__("pathlib").Path(tempfile.mkdtemp(prefix="gb-api-"))
    os.chmod(tmp_path, 0o755)
    def whoami(caller: Caller, args):
        return {"uid": caller.uid, "name": caller.name, "admin": caller.is_admin}

    def boom(caller, args):
        raise NotFound("no job 7 of yours", hint="`gbroker history` lists your jobs")

    def bug(caller, args):
        raise ZeroDivisionError("x")

    path = str(tmp_path / "s.sock")
    srv = ApiServer(path, {"whoami": whoami, "boom": boom, "bug": bug, "admin": lambda c, a: c.require_admin("x")},
                    admin_group="gbroker-test-admins-none")
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_identity_comes_from_the_kernel(server):
    me = call(server.path, "whoami", uid=0, name="root-please")  # claims in args are ignored
    assert me["uid"] == os.getuid()


def test_another_user_is_seen_as_that_user(server):
    nobody = pwd.getpwnam("nobody")
    code = (
        f"import sys, json; sys.path.insert(0, {os.getcwd()!r}); from broker.client import call; "
        f"print(json.dumps(call({server.path!r}, 'whoami')))"
    )
    out = subprocess.run([sys.executable, "-c", code], user=nobody.pw_uid, group=nobody.pw_gid,
                         extra_groups=[], capture_output=True, text=True, check=True).stdout
    assert f'"uid": {nobody.pw_uid}' in out and '"admin": false' in out
    r = subprocess.run([sys.executable, "-c", code.replace("'whoami'", "'admin'")], user=nobody.pw_uid,
                       group=nobody.pw_gid, extra_groups=[], capture_output=True, text=True)
    assert r.returncode != 0 and "admins" in r.stderr


def test_a_uid_the_host_has_no_account_for_is_refused(server):
    uid = next(u for u in range(54321, 60000) if not _has_account(u))
    code = (
        f"import sys, json; sys.path.insert(0, {os.getcwd()!r}); from broker.client import call; "
        f"print(json.dumps(call({server.path!r}, 'whoami')))"
    )
    r = subprocess.run([sys.executable, "-c", code], user=uid, group=uid, extra_groups=[], capture_output=True,
                       text=True)
    assert r.returncode != 0 and f"uid {uid} has no account on this host" in r.stderr, r.stderr
    assert str(uid) not in r.stdout


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_errors_keep_message_hint_and_code(server):
    with pytest.raises(RemoteError) as err:
        call(server.path, "boom")
    assert err.value.exit_code == NotFound.exit_code
    assert "history" in (err.value.hint or "")
    with pytest.raises(RemoteError) as err:
        call(server.path, "bug")
    assert "internal error" in err.value.message
    with pytest.raises(RemoteError) as err:
        call(server.path, "nope")
    assert "unknown operation" in err.value.message


def test_daemon_down_says_what_to_do(tmp_path):
    with pytest.raises(DaemonUnavailable) as err:
        call(str(tmp_path / "absent.sock"), "whoami")
    assert "gbroker daemon" in str(err.value) and "Nothing was sent to it." in str(err.value)
    with pytest.raises(DaemonUnavailable) as err:
        call(str(tmp_path / "absent.sock"), "submit")
    assert "Nothing was submitted." in str(err.value)


def test_stale_socket_is_replaced_but_a_live_one_is_not(tmp_path, server):
    from broker.errors import BrokerError

    with pytest.raises(BrokerError):
        ApiServer(server.path, {}, "x")
    stale = tmp_path / "stale.sock"
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    srv = ApiServer(str(stale), {}, "x")
    srv.server_close()


def test_concurrent_callers(server):
    results = []

    def worker():
        results.append(call(server.path, "whoami")["uid"])

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [os.getuid()] * 20


# -- limits: one user cannot starve the others -------------------------------------------------
def _boom(c: Caller, a: dict) -> None:
    raise NotFound("no job 7 of yours", hint="`gbroker history` lists your jobs")


def _bug(c: Caller, a: dict) -> None:
    raise ZeroDivisionError("x")


def _limited(tmp: str, **kw: object) -> ApiServer:
    from broker.api import Limits

    srv = ApiServer(f"{tmp}/lim.sock", {"whoami": lambda c, a: {"uid": c.uid}, "boom": _boom, "bug": _bug},
                    admin_group="gbroker-test-admins-none", limits=Limits(**kw))  # type: ignore[arg-type]
    srv.serve_in_thread()
    return srv


def _raw(path: str, data: bytes, timeout: float = 10) -> bytes:
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def test_idle_connections_beyond_the_per_uid_limit_are_answered_busy_and_cost_no_thread(tmp_path) -> None:
    import json
    import socket
    import tempfile

    tmp = tempfile.mkdtemp(prefix="gb-lim-")
    srv = _limited(tmp, max_per_uid=3, max_connections=8, max_waiting_per_uid=16, read_timeout_s=5)
    idle = []
    try:
        threads0 = threading.active_count()
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX)
            s.connect(srv.path)
            idle.append(s)
        import time

        time.sleep(0.5)
        assert threading.active_count() - threads0 <= 8
        assert srv.open_connections() == {os.getuid(): 3}
        assert srv.waiting_connections() == {os.getuid(): 16}
        late = socket.socket(socket.AF_UNIX)
        late.settimeout(5)
        late.connect(srv.path)
        answer = json.loads(late.recv(65536))  # refused at once, without reading anything
        late.close()
        assert answer["ok"] is False and answer["error"]["type"] == "Busy"
    finally:
        for s in idle:
            s.close()
    # The client retries a busy daemon, so a burst beyond the limit still gets its answers.
    assert call(srv.path, "whoami")["uid"] == os.getuid()
    srv.shutdown()
    srv.server_close()


def test_a_request_that_never_ends_is_dropped_after_the_read_timeout() -> None:
    import socket
    import tempfile
    import time

    srv = _limited(tempfile.mkdtemp(prefix="gb-lim-"), read_timeout_s=0.5)
    s = socket.socket(socket.AF_UNIX)
    s.connect(srv.path)
    s.sendall(b'{"op": "who')
    t = time.monotonic()
    s.settimeout(5)
    assert s.recv(100) == b""  # closed without an answer to half a request
    assert time.monotonic() - t < 2
    assert srv.open_connections() == {}
    srv.shutdown()
    srv.server_close()


def test_too_large_and_too_deep_requests_get_an_answer() -> None:
    import json
    import tempfile

    srv = _limited(tempfile.mkdtemp(prefix="gb-lim-"), max_request_bytes=1024 * 1024)
    big = json.loads(_raw(srv.path, b'{"op": "whoami", "x": "' + b"y" * 3_000_000 + b'"}\n'))
    assert big["ok"] is False and "too large" in big["error"]["message"]
    deep = json.loads(_raw(srv.path, b'{"op": "whoami", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"))
    assert deep["ok"] is False and "nested too deeply" in deep["error"]["message"]
    srv.shutdown()
    srv.server_close()


def _http(path: str, raw: bytes, timeout: float = 10) -> tuple[int, dict, bytes]:
    import json
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(raw)
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    s.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.strip() else {}, head


def test_http_on_the_same_socket_keeps_the_kernels_identity_and_the_limits() -> None:
    import socket
    import tempfile
    import time

    srv = _limited(tempfile.mkdtemp(prefix="gb-http-"), read_timeout_s=0.5, max_request_bytes=1024 * 1024)
    try:
        code, body, _ = _http(srv.path, b"POST /v1/ops/whoami HTTP/1.1\r\nHost: x\r\nX-Remote-User: root\r\n"
                                        b"Content-Type: application/json\r\nContent-Length: 25\r\n\r\n"
                                        b'{"uid": 0, "name": "bob"}')
        assert code == 200 and body["uid"] == os.getuid()  # what the request claims is not who calls
        code, body, _ = _http(srv.path, b"GET /v1/ops/boom HTTP/1.1\r\n\r\n")
        assert code == 405
        code, body, _ = _http(srv.path, b"POST /v1/ops/boom HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        assert code == 404 and body["error"]["hint"] == "`gbroker history` lists your jobs"
        code, body, _ = _http(srv.path, b"POST /v1/ops/bug HTTP/1.1\r\n\r\n")
        assert code == 500 and "internal error" in body["error"]["message"]
        # A body larger than the limit is refused from its Content-Length, before it is read.
        code, body, _ = _http(srv.path, b"POST /v1/ops/whoami HTTP/1.1\r\nContent-Length: 3000000\r\n\r\n")
        assert code == 413 and "too large" in body["error"]["message"]
        # curl's Expect: 100-continue gets its 100 before the body.
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(srv.path)
        s.sendall(b"POST /v1/ops/whoami HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(b"{}")
        assert b"200 OK" in s.recv(1000)
        s.close()
        # Half a head, or half a body, is dropped after the read timeout; nothing stays open.
        for half in (b"GET /v1/ops/whoami HTTP/1.1\r\nHost: x\r\n",
                     b"POST /v1/ops/whoami HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(srv.path)
            s.sendall(half)
            t = time.monotonic()
            s.recv(1000)
            assert time.monotonic() - t < 2
            s.close()
        assert srv.open_connections() == {}
    finally:
        srv.shutdown()
        srv.server_close()
