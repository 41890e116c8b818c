"""Users' files, as the user: the job log, and what a checkpoint directory shows, never read as root."""

from __future__ import annotations

import os
import pwd
import tempfile
import time
from pathlib import Path

import pytest

from broker import proc
from broker.errors import SpecError
from broker.userfiles import SaveFacts, SaveWatcher, UserFiles, parse_listing

files = UserFiles()


def user_dir(user: str, mode: int = 0o755) -> Path:
    path = Path(tempfile.mkdtemp(prefix="gb-uf-"))
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(mode)
    return path


def test_listing_prefers_the_manifest_then_checkpoints_and_ignores_logs() -> None:
    raw = b"".join(
        b"\0".join([t, d, b"/ck", rel]) + b"\0"
        for t, d, rel in [
            (b"100.5", b"1", b"gbroker-checkpoint.json"),
            (b"300", b"4", b"lightning_logs/version_0/checkpoints/epoch=1.ckpt"),
            (b"900", b"1", b"train.log"),
            (b"950", b"3", b"lightning_logs/version_0/events.out.tfevents.1"),
            (b"400", b"2", b"sub/gbroker-checkpoint.json"),
        ]
    )
    facts = parse_listing(raw, ["/ck", "/other"])
    assert facts["/ck"] == SaveFacts(manifest_at=100.5, checkpoint_at=300.0, other_at=400.0)
    assert facts["/ck"].saved_at == 100.5
    assert facts["/other"] == SaveFacts()
    assert SaveFacts(checkpoint_at=3.0, other_at=9.0).saved_at == 3.0


def test_probe_runs_as_the_owner_opens_no_file_and_a_fifo_cannot_block_it() -> None:
    ck = user_dir("alice")
    os.mkfifo(ck / "gbroker-checkpoint.json")  # a manifest that would block any reader
    (ck / "model.pt").write_bytes(b"x")
    os.utime(ck / "model.pt", (1_000_000, 1_000_000))
    root_only = Path(tempfile.mkdtemp())  # alice may not list it
    (root_only / "gbroker-checkpoint.json").write_text("{}")
    t = time.monotonic()
    facts = files.probe("alice", [str(ck), str(root_only), "/no/such/dir"])
    assert time.monotonic() - t < 2
    assert facts is not None
    assert facts[str(ck)] == SaveFacts(checkpoint_at=1_000_000.0)
    assert facts[str(root_only)] == SaveFacts(), "root's view leaked into alice's probe"
    assert facts["/no/such/dir"] == SaveFacts()


def test_a_probe_past_its_deadline_is_unknown() -> None:
    big = user_dir("alice")
    for i in range(3000):
        (big / f"f{i}").touch()
    assert files.probe("alice", [str(big)], timeout_s=0.0001) is None


def test_the_log_is_created_by_its_owner_and_never_through_a_planted_symlink() -> None:
    shared = user_dir("root", 0o1777)
    victim = user_dir("alice") / "thesis.txt"
    victim.write_text("precious")
    bob = pwd.getpwnam("bob")
    for guess in ("gbroker-train-AAAAAA.out", "gbroker-train.out"):
        (shared / guess).symlink_to(victim)
        os.lchown(shared / guess, bob.pw_uid, bob.pw_gid)
    path = Path(files.create_log("alice", str(shared), "train"))
    assert path.parent == shared and path.name.startswith("gbroker-train-") and path.suffix == ".out"
    assert not path.is_symlink() and path.stat().st_uid == pwd.getpwnam("alice").pw_uid
    assert path.stat().st_mode & 0o777 == 0o600
    assert victim.read_text() == "precious"
    files.remove("alice", str(path))
    assert not path.exists()


def test_a_directory_the_owner_cannot_write_refuses_the_log() -> None:
    with pytest.raises(SpecError) as err:
        files.create_log("alice", tempfile.mkdtemp(), "train")
    assert "cannot create the job's log" in err.value.message and "alice" in err.value.message


def test_the_watcher_never_waits_and_learns_in_the_background() -> None:
    ck = user_dir("alice")
    (ck / "state.ckpt").touch()
    watcher = SaveWatcher(files, refresh_s=60)
    assert watcher.latest("alice", str(ck)) is None  # nothing known yet; a probe starts
    deadline = time.monotonic() + 5
    while watcher.latest("alice", str(ck)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    facts = watcher.latest("alice", str(ck))
    assert facts is not None and facts.checkpoint_at is not None
    watcher.close()


def test_a_probe_that_never_answers_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    stuck = threading.Event()

    class Files(UserFiles):
        def probe(self, owner, dirs, timeout_s=0):  # type: ignore[no-untyped-def]
            if owner == "bob":
                stuck.wait(30)  # a probe thread that never comes back (its child would not die)
                return None
            return {d: "facts" for d in dirs}

    monkeypatch.setattr(proc, "REAP_WAIT_S", 0.2)
    t = time.monotonic()
    try:
        out = Files().probe_many({"alice": ["/a"], "bob": ["/b"]}, timeout_s=0.2)
    finally:
        stuck.set()
    assert out == {("alice", "/a"): "facts"} and time.monotonic() - t < 3
