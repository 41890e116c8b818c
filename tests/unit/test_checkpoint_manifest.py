"""The manifest helpers the framework callbacks and job scripts use (standard library only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from broker.checkpoint import (
    MANIFEST,
    RESUME_EXIT,
    Checkpointer,
    checkpoint_dir,
    last_saved_at,
    latest_checkpoint,
    read_manifest,
    record_save,
)


@pytest.fixture(autouse=True)
def _no_gbroker_env(monkeypatch):
    for name in ("GBROKER_CHECKPOINT_DIR", "GBROKER_ATTEMPT", "GBROKER_RESUME_FROM"):
        monkeypatch.delenv(name, raising=False)


def test_outside_gbroker_nothing_is_written_and_nothing_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoint_dir() is None
    assert record_save(tmp_path / "x.ckpt", 3) is None
    assert latest_checkpoint() is None and read_manifest() is None
    assert list(tmp_path.iterdir()) == []


def test_record_save_then_latest_checkpoint(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    monkeypatch.setenv("GBROKER_CHECKPOINT_DIR", str(ck))
    monkeypatch.setenv("GBROKER_ATTEMPT", "3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.ckpt").write_bytes(b"x")
    first = record_save("run/a.ckpt", 10, framework="lightning")
    assert first is not None
    (tmp_path / "run" / "checkpoint-20").mkdir()
    second = record_save(tmp_path / "run" / "checkpoint-20", 20, reason="signal")
    m = json.loads((ck / MANIFEST).read_text())
    assert m == second
    assert m["seq"] == first["seq"] + 1 == 2 and m["attempt"] == 3 and m["step"] == 20
    assert m["reason"] == "signal" and "framework" not in m
    assert first["path"] == str(tmp_path / "run" / "a.ckpt")  # relative paths are made absolute
    assert latest_checkpoint() == str(tmp_path / "run" / "checkpoint-20")
    assert last_saved_at(ck) == m["saved_at"] >= first["saved_at"]
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp-")]


def test_a_given_directory_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GBROKER_CHECKPOINT_DIR", str(tmp_path / "env"))
    (tmp_path / "f").write_text("x")
    record_save(tmp_path / "f", 1, directory=tmp_path / "mine")
    assert read_manifest(tmp_path / "mine")["step"] == 1
    assert read_manifest() is None
    assert latest_checkpoint(tmp_path / "mine") == str(tmp_path / "f")


def test_a_vanished_checkpoint_warns_and_starts_fresh(tmp_path):
    record_save(tmp_path / "gone.ckpt", 5, directory=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_checkpoint(tmp_path) is None
    assert any("no longer exists" in str(w.message) for w in caught)


def test_remote_paths_are_kept_as_given(tmp_path):
    record_save("s3://bucket/run/last.ckpt", 7, directory=tmp_path)
    assert latest_checkpoint(tmp_path) == "s3://bucket/run/last.ckpt"


def test_checkpointer_manifests_still_resume_and_bill(tmp_path):
    ck = Checkpointer(tmp_path, every_s=3600, signals=())
    ck.save({"step": 1})
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-00000001.json")
    record_save(tmp_path / "ckpt-00000001.json", 1, directory=tmp_path)
    assert ck.load() is None  # a framework manifest names no Checkpointer file
    assert last_saved_at(tmp_path) is not None


def test_garbage_manifest_reads_as_none(tmp_path):
    (tmp_path / MANIFEST).write_text("[1, 2]")
    assert read_manifest(tmp_path) is None and latest_checkpoint(tmp_path) is None
    (tmp_path / MANIFEST).write_text("{not json")
    assert read_manifest(tmp_path) is None
    assert record_save(tmp_path / "x", 1, directory=tmp_path)["seq"] == 1


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "broker.checkpoint", *args], env=env,
                          capture_output=True, text=True, check=False)


def test_command_line_for_job_scripts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env.update(GBROKER_CHECKPOINT_DIR=str(tmp_path), GBROKER_ATTEMPT="2", PYTHONPATH=os.getcwd())
    assert _cli(["latest"], env).stdout == ""
    assert _cli(["stopped-on-signal"], env).returncode == 1
    (tmp_path / "c").write_text("x")
    env["GBROKER_ATTEMPT"] = "1"
    record_save(tmp_path / "c", 4, directory=tmp_path, reason="signal")  # attempt 1 (GBROKER_ATTEMPT unset here)
    assert _cli(["latest"], env).stdout.strip() == str(tmp_path / "c")
    assert _cli(["stopped-on-signal"], env).returncode == 0
    env["GBROKER_ATTEMPT"] = "2"  # an older attempt's signal save does not count
    assert _cli(["stopped-on-signal"], env).returncode == 1
    assert _cli(["bogus"], env).returncode == 2
    assert RESUME_EXIT == os.EX_TEMPFAIL == 75


def test_an_unreadable_attempt_number_counts_as_the_first_for_the_checkpointer_too(tmp_path, monkeypatch):
    import signal

    from broker.checkpoint import Checkpointer

    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        for written in ("", "x"):
            monkeypatch.setenv("GBROKER_ATTEMPT", written)
            assert Checkpointer(str(tmp_path / "ck")).attempt == 1  # as manifest.current_attempt reads it
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
