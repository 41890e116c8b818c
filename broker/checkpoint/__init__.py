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

Lightning and Hugging Face jobs keep their frameworks' own checkpoints and add
one callback that records each save in the same manifest, and resume from
:func:`latest_checkpoint`::

    from broker.checkpoint import LightningCallback, latest_checkpoint
    trainer = L.Trainer(callbacks=[LightningCallback(), ModelCheckpoint(...)], ...)
    trainer.fit(model, ckpt_path=latest_checkpoint())

    from broker.checkpoint import HFCallback, latest_checkpoint
    trainer = Trainer(..., callbacks=[HFCallback()])
    trainer.train(resume_from_checkpoint=latest_checkpoint())

The callback classes are built on first use (``LightningCallback`` imports
Lightning, ``HFCallback`` imports transformers), so importing this package
needs neither framework: the daemon imports it too.

In the base layer (docs/ARCHITECTURE.md). May import: the standard library
and its own modules only, nothing else of gbroker: it runs inside users'
jobs, whose Python may have none of gbroker's dependencies.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from broker.checkpoint.manifest import (
    MANIFEST,
    RESUME_EXIT,
    _atomic_write,
    checkpoint_dir,
    current_attempt,
    last_saved_at,
    latest_checkpoint,
    read_manifest,
    record_finished,
    record_save,
)

__all__ = [
    "KEEP",
    "MANIFEST",
    "RESUME_EXIT",
    "Checkpointer",
    "HFCallback",
    "LightningCallback",
    "checkpoint_dir",
    "last_saved_at",
    "latest_checkpoint",
    "read_manifest",
    "record_finished",
    "record_save",
]

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
        self.attempt = current_attempt()
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


def __getattr__(name: str) -> Any:
    """Build a framework callback class on first use, so this package imports without them."""
    if name == "LightningCallback":
        from broker.checkpoint.lightning import LightningCallback

        return LightningCallback
    if name == "HFCallback":
        from broker.checkpoint.hf import HFCallback

        return HFCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
