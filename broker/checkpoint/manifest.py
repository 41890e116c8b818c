"""gbroker's checkpoint manifest: the one file the daemon reads about a job's saves.

``gbroker-checkpoint.json`` in the job's checkpoint directory says when the job
last saved (``saved_at``, epoch seconds), in which attempt (``attempt``, from
GBROKER_ATTEMPT) and how many saves came before (``seq``). The daemon bills the
work lost to a reclaim as the end of the attempt minus ``saved_at``, so the
manifest is written only after a checkpoint is complete, and atomically.

Two kinds of writers share the format:

* :class:`broker.checkpoint.Checkpointer` adds ``file``: the name of its own
  JSON state file in the same directory;
* the framework callbacks (Lightning, Hugging Face) add ``path`` (the absolute
  path of the checkpoint file or directory the framework wrote), ``step`` (the
  global step it holds), ``framework`` and ``reason``: ``"signal"`` when the
  save was made because a stop or warning signal came (the program then ends
  with :data:`RESUME_EXIT` to be resumed), ``"save"`` for any other save.

Standard library only: the daemon and every job import it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

MANIFEST = "gbroker-checkpoint.json"

RESUME_EXIT = 75
"""Exit status (EX_TEMPFAIL) that tells gbroker: "I saved; run my next attempt from there"."""
STOPPED_MARKER = ".gbroker-stopped-"
"""A save made because a stop signal came leaves ``<dir>/.gbroker-stopped-<attempt>``: gbroker's
batch script then ends the run as "resume me" even when a launcher (torchrun, accelerate) turned
the program's 75 into 1."""
FINISHED_MARKER = ".gbroker-finished-"
"""A program that has done all its work leaves ``<dir>/.gbroker-finished-<attempt>``
(:func:`record_finished`): when the time-limit warning reaches its launcher while it is
shutting down (torchrun then ends with status 1), gbroker's batch script still ends the run
as completed rather than out of time."""


def checkpoint_dir(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory given, else GBROKER_CHECKPOINT_DIR, else None (not under gbroker)."""
    path = directory if directory is not None else os.environ.get("GBROKER_CHECKPOINT_DIR")
    return Path(path) if path else None


def current_attempt() -> int:
    """This run's attempt number (GBROKER_ATTEMPT), 1 outside gbroker or when unreadable."""
    try:
        return int(os.environ.get("GBROKER_ATTEMPT", "1"))
    except ValueError:
        return 1


def read_manifest(directory: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The manifest in `directory` (default GBROKER_CHECKPOINT_DIR), or None when there is none."""
    base = checkpoint_dir(directory)
    if base is None:
        return None
    try:
        data = json.loads((base / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record_save(
    path: str | os.PathLike[str],
    step: int,
    *,
    directory: str | os.PathLike[str] | None = None,
    framework: str = "",
    reason: str = "save",
) -> dict[str, Any] | None:
    """Record that a complete checkpoint now lies at `path`, holding global step `step`.

    Call it after the checkpoint is fully written, from one process only (rank
    zero). Returns the manifest written, or None when there is no checkpoint
    directory (outside gbroker and none given): then nothing is written.
    """
    base = checkpoint_dir(directory)
    if base is None:
        return None
    base.mkdir(parents=True, exist_ok=True)
    prev = read_manifest(base) or {}
    try:
        seq = int(prev.get("seq", 0)) + 1
    except (TypeError, ValueError):
        seq = 1
    manifest: dict[str, Any] = {
        "saved_at": time.time(),
        "seq": seq,
        "attempt": current_attempt(),
        "step": int(step),
        "path": _absolute(path),
        "reason": reason,
    }
    if framework:
        manifest["framework"] = framework
    _atomic_write(base / MANIFEST, json.dumps(manifest).encode())
    if reason == "signal":
        (base / f"{STOPPED_MARKER}{manifest['attempt']}").touch()
    return manifest


def record_finished(directory: str | os.PathLike[str] | None = None) -> bool:
    """Record that the program has done all its work in this attempt (call it from rank zero).

    Returns False when there is no checkpoint directory (outside gbroker and none given).
    """
    base = checkpoint_dir(directory)
    if base is None:
        return False
    base.mkdir(parents=True, exist_ok=True)
    (base / f"{FINISHED_MARKER}{current_attempt()}").touch()
    return True


def _absolute(path: str | os.PathLike[str]) -> str:
    """An absolute local path (the job's directory may change); URLs (s3://...) as given."""
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(text)


def latest_checkpoint(directory: str | os.PathLike[str] | None = None) -> str | None:
    """The newest checkpoint to resume from, as the framework wants it, or None.

    Pass it straight on: ``trainer.fit(model, ckpt_path=latest_checkpoint())``
    (Lightning, a ``.ckpt`` file) or
    ``trainer.train(resume_from_checkpoint=latest_checkpoint())`` (Hugging
    Face, a ``checkpoint-N`` directory). None means "start fresh": no manifest
    yet (a first attempt), no checkpoint directory (outside gbroker), or the
    recorded checkpoint is gone (a warning says so, since the run then starts
    over). GBROKER_RESUME_FROM names the directory, which neither framework
    accepts; this names the checkpoint inside it.
    """
    manifest = read_manifest(directory)
    if not manifest:
        return None
    base = checkpoint_dir(directory)
    assert base is not None
    if manifest.get("path"):
        if "://" in str(manifest["path"]):
            return str(manifest["path"])  # remote storage: the framework checks it
        found = Path(str(manifest["path"]))
    elif manifest.get("file"):
        found = base / str(manifest["file"])
    else:
        return None
    if not found.exists():
        warnings.warn(
            f"gbroker's manifest names {found}, which no longer exists; starting without a checkpoint",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return str(found)


def last_saved_at(directory: str | os.PathLike[str]) -> float | None:
    """When the job in `directory` last saved (epoch seconds), for lost-work accounting."""
    try:
        return float(json.loads((Path(directory) / MANIFEST).read_text())["saved_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write, fsync, rename: a reader sees the old file or the new one, never half of one."""
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
