import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from broker.checkpoint import MANIFEST, Checkpointer, last_saved_at


def test_save_load_keeps_two_and_manifest(tmp_path):
    ck = Checkpointer(tmp_path, every_s=3600, signals=())
    assert ck.load() is None
    for step in range(5):
        ck.save({"step": step})
    assert ck.load() == {"step": 4}
    assert len(list(tmp_path.glob("ckpt-*.json"))) == 2
    m = json.loads((tmp_path / MANIFEST).read_text())
    assert m["seq"] == 5
    assert abs(last_saved_at(tmp_path) - time.time()) < 5


def test_due_on_signal_and_timer(tmp_path):
    ck = Checkpointer(tmp_path, every_s=3600, signals=(signal.SIGUSR1,))
    assert not ck.due()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert ck.requested and ck.due()
    ck2 = Checkpointer(tmp_path, every_s=0.0, signals=())
    assert ck2.due()


def test_needs_a_directory(monkeypatch):
    monkeypatch.delenv("GBROKER_CHECKPOINT_DIR", raising=False)
    try:
        Checkpointer(signals=())
    except RuntimeError as exc:
        assert "GBROKER_CHECKPOINT_DIR" in str(exc)
    else:
        raise AssertionError("expected an error")


def test_a_killed_program_resumes_from_its_last_save(tmp_path):
    """A real process saves, is SIGKILLed (like a reclaimed node), and a new one resumes."""
    prog = tmp_path / "p.py"
    prog.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from broker.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path / 'ck')!r}, every_s=0.05)
        s = ck.load() or {{"n": 0}}
        print(s["n"], flush=True)
        while s["n"] < 10**6:
            s["n"] += 1
            time.sleep(0.01)
            if ck.due():
                ck.save(s)
    """))
    p = subprocess.Popen([sys.executable, str(prog)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "0"
    time.sleep(1.0)
    p.kill()
    p.wait()
    p2 = subprocess.Popen([sys.executable, str(prog)], stdout=subprocess.PIPE, text=True)
    resumed = int(p2.stdout.readline())
    p2.kill()
    p2.wait()
    assert resumed > 10
