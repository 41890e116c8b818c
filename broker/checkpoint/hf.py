"""Hugging Face ``TrainerCallback`` that records every save in gbroker's manifest and stops cleanly on a signal.

The Trainer calls ``on_save`` after each ``checkpoint-N`` directory is
complete; the callback records it (path and step) in ``gbroker-checkpoint.json``.

The Trainer itself saves nothing on a signal unless ``enable_jit_checkpoint``
is set, and that only handles SIGTERM, waits 3 s before asking for the save,
bypasses ``on_save`` and then returns from ``train()`` normally (exit status 0,
which reads as "finished"). SIGUSR1 kills it. So the callback handles the stop
signals itself (SIGUSR1 and SIGTERM by default): at the next step end (all
ranks agree first) it asks the Trainer for a regular save and for the
training to stop, and when training ends that way it ends the program with
:data:`~broker.checkpoint.RESUME_EXIT` (75), gbroker's "resume me". Saves
made by ``enable_jit_checkpoint`` (when the callback's signals are turned
off) are recorded too.

Importing this module does not import transformers; the class is built on
first access of ``HFCallback``.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterable
from typing import Any

from broker.checkpoint.manifest import RESUME_EXIT, record_finished, record_save

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
_JIT_INCOMPLETE = "checkpoint-is-incomplete.txt"
_STATE = "trainer_state.json"

_built: type | None = None


def _newest_complete(output_dir: str) -> tuple[int, str] | None:
    """The newest ``checkpoint-N`` in `output_dir` that a save finished (state file, no JIT sentinel)."""
    best: tuple[int, str] | None = None
    try:
        entries = os.listdir(output_dir)
    except OSError:
        return None
    for entry in entries:
        match = _CHECKPOINT_DIR.match(entry)
        if not match:
            continue
        path = os.path.join(output_dir, entry)
        if not os.path.isfile(os.path.join(path, _STATE)) or os.path.exists(
            os.path.join(path, _JIT_INCOMPLETE)
        ):
            continue
        step = int(match.group(1))
        if best is None or step > best[0]:
            best = (step, path)
    return best


def _any_rank(flag: bool, args: Any) -> bool:
    """True on every rank when any rank saw the signal (one tiny all-reduce per step when distributed)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return flag
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    tensor = torch.tensor([1 if flag else 0], device=args.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _build() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError(
            "broker.checkpoint.HFCallback needs transformers in this Python "
            "(pip install transformers; on the dev machines use /opt/gbroker/venv-ml/bin/python)"
        ) from exc

    class HFCallback(TrainerCallback):  # type: ignore[misc]
        """Records each ``checkpoint-N`` in ``gbroker-checkpoint.json``; on a stop signal saves, stops, exits 75.

        ``directory``: where the manifest goes (default ``$GBROKER_CHECKPOINT_DIR``;
        with neither, nothing is recorded and the signal handling still works).
        ``stop_signals``: signals that mean "save now and stop" (``()`` leaves
        the signals alone). ``exit_code``: the status a run stopped by a signal
        ends with when training returns (None: ``train()`` returns normally and
        ``stopped_by_signal`` tells).
        """

        def __init__(
            self,
            directory: str | os.PathLike[str] | None = None,
            *,
            stop_signals: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM),
            exit_code: int | None = RESUME_EXIT,
        ) -> None:
            self.directory = directory
            self.stop_signals = tuple(stop_signals)
            self.exit_code = exit_code
            self.last_saved_step: int | None = None
            """Global step of the last checkpoint recorded in this run."""
            self.stopped_by_signal = False
            self._requested = False
            self._previous: dict[int, Any] = {}
            self._found_at_start = -1

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._requested = False
            self.stopped_by_signal = False
            # Checkpoints left by earlier attempts are not this run's saves.
            newest = _newest_complete(args.output_dir)
            self._found_at_start = newest[0] if newest else -1
            if threading.current_thread() is threading.main_thread():
                for sig in self.stop_signals:
                    self._previous[sig] = signal.signal(sig, self._on_signal)

        def _on_signal(self, signum: int, frame: object) -> None:
            self._requested = True

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if getattr(args, "enable_jit_checkpoint", False):
                self._record_jit_save(args, state)
            if not self.stop_signals or self.stopped_by_signal:
                return
            if _any_rank(self._requested, args):
                # The Trainer saves right after this hook (on_save follows), then leaves its loop.
                self.stopped_by_signal = True
                control.should_save = True
                control.should_training_stop = True

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self._record(path, state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if getattr(args, "enable_jit_checkpoint", False):
                self._record_jit_save(args, state)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self._previous = {}
            if self.stopped_by_signal:
                if self.exit_code is not None:
                    raise SystemExit(self.exit_code)
            elif state.is_world_process_zero and state.max_steps and state.global_step >= state.max_steps:
                record_finished(self.directory)

        def _record(self, path: str, state: Any) -> None:
            self.last_saved_step = int(state.global_step)
            if state.is_world_process_zero:
                record_save(
                    path,
                    state.global_step,
                    directory=self.directory,
                    framework="transformers",
                    reason="signal" if self.stopped_by_signal else "save",
                )

        def _record_jit_save(self, args: Any, state: Any) -> None:
            """``enable_jit_checkpoint`` saves without calling ``on_save``: find its directory."""
            newest = _newest_complete(args.output_dir)
            seen = max(self._found_at_start, -1 if self.last_saved_step is None else self.last_saved_step)
            if newest is None or newest[0] <= seen:
                return
            self.last_saved_step = newest[0]
            if state.is_world_process_zero:
                record_save(
                    newest[1],
                    newest[0],
                    directory=self.directory,
                    framework="transformers",
                    reason="signal",
                )

    HFCallback.__module__ = __name__
    HFCallback.__qualname__ = "HFCallback"  # picklable by name
    return HFCallback


def __getattr__(name: str) -> Any:
    global _built
    if name == "HFCallback":
        if _built is None:
            _built = _build()
        return _built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
