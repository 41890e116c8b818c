"""The small helper user programs import to checkpoint and resume.

Standard library only, so any Python job can import it::

    from broker.checkpoint import Checkpointer

    ck = Checkpointer()                 # GBROKER_CHECKPOINT_DIR from the job's environment
    state = ck.load() or {"step": 0}    # the latest checkpoint, or None on a first start
    while state["step"] < 1000:
        state["step"] += 1
        train_one_step()
        if ck.due():                    # a warning signal came, or every `every_s` seconds
            ck.save(state)
    ck.save(state)

How it fits gbroker: the batch script asks Slurm for a warning signal (SIGUSR1)
before the time limit and forwards it to the program; ``due()`` turns true
then. A spot reclaim gives no warning at all (the node just dies), so
``due()`` is also true every ``every_s`` seconds: the work lost to a reclaim is
at most that much. Each save is atomic (write, fsync, rename) and records a
small manifest, ``gbroker-checkpoint.json``, that the daemon reads to account
for the work lost since the last save.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

MANIFEST = "gbroker-checkpoint.json"
KEEP = 2


class Checkpointer:
    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        every_s: float = 60.0,
        signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGTERM),
    ) -> None:
        path = directory or os.environ.get("GBROKER_CHECKPOINT_DIR")
        if not path:
            raise RuntimeError(
                "no checkpoint directory: pass one, or run under gbroker (GBROKER_CHECKPOINT_DIR)"
            )
        self.dir = Path(path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.every_s = every_s
        self.attempt = int(os.environ.get("GBROKER_ATTEMPT", "1"))
        self._requested = False
        self._last_save = time.monotonic()
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._requested = True

    @property
    def requested(self) -> bool:
        """True once a warning signal arrived (the job will stop soon)."""
        return self._requested

    def due(self) -> bool:
        return self._requested or time.monotonic() - self._last_save >= self.every_s

    def manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir / MANIFEST).read_text())
        except (OSError, ValueError):
            return None

    def load(self) -> Any:
        """The latest saved state, or None when there is none."""
        m = self.manifest()
        if not m:
            return None
        try:
            return json.loads((self.dir / m["file"]).read_text())
        except (OSError, ValueError, KeyError):
            return None

    def save(self, state: Any) -> Path:
        """Save `state` (JSON-able) atomically and update the manifest."""
        prev = self.manifest() or {}
        seq = int(prev.get("seq", 0)) + 1
        name = f"ckpt-{seq:08d}.json"
        _atomic_write(self.dir / name, json.dumps(state).encode())
        manifest = {"file": name, "seq": seq, "saved_at": time.time(), "attempt": self.attempt}
        _atomic_write(self.dir / MANIFEST, json.dumps(manifest).encode())
        for old in sorted(self.dir.glob("ckpt-*.json"))[:-KEEP]:
            old.unlink(missing_ok=True)
        self._last_save = time.monotonic()
        return self.dir / name


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def last_saved_at(directory: str | os.PathLike[str]) -> float | None:
    """When the job in `directory` last saved (epoch seconds), for lost-work accounting."""
    try:
        return float(json.loads((Path(directory) / MANIFEST).read_text())["saved_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
