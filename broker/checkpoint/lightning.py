"""Lightning callback that records every checkpoint save in gbroker's manifest.

Lightning writes checkpoints from three places: ``ModelCheckpoint``, a user's
``trainer.save_checkpoint(...)``, and, on Slurm with ``auto_requeue``, its
requeue-signal handler (``hpc_ckpt_N.ckpt`` in ``default_root_dir``). All of
them go through ``Trainer.save_checkpoint``; the hooks Lightning offers
(``on_save_checkpoint``) run *before* the file is written and do not know its
path. So the callback wraps the trainer's ``save_checkpoint`` for the length
of ``fit`` and records the file once the call has returned, i.e. once the
checkpoint is complete (with a synchronous CheckpointIO, Lightning's default).

It also makes the stop signals end a run the way gbroker expects:

* SIGTERM: Lightning already turns it into ``SIGTERMException`` at the next
  batch, which exits with status 0 and saves nothing. The callback saves an
  ``hpc_ckpt_N.ckpt`` first (unless this step is already saved) and makes the
  exit status :data:`~broker.checkpoint.RESUME_EXIT` (75).
* The warning signal (SIGUSR1 by default) when Lightning does not handle it
  (it only does on Slurm with ``auto_requeue``): without a handler it kills
  the process. The callback catches it, and at the next batch end (all ranks
  agree first) saves, then stops the same way as on SIGTERM.

Importing this module does not import Lightning; the class is built on first
access of ``LightningCallback``.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from broker.checkpoint.manifest import RESUME_EXIT, record_finished, record_save

_HPC_NAME = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")

_built: type | None = None


def next_hpc_path(root: str | os.PathLike[str]) -> str:
    """``root/hpc_ckpt_<N+1>.ckpt``: Lightning's own name, so its Slurm auto-resume finds it too."""
    numbers = [0]
    try:
        for entry in os.listdir(root):
            match = _HPC_NAME.match(entry)
            if match:
                numbers.append(int(match.group(1)))
    except OSError:
        pass
    return os.path.join(os.fspath(root), f"hpc_ckpt_{max(numbers) + 1}.ckpt")


def _lightning() -> tuple[Any, type[BaseException]]:
    """The Lightning package and its SIGTERMException (``lightning`` or ``pytorch_lightning``)."""
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.utilities.exceptions import SIGTERMException
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[no-redef]
            from pytorch_lightning.utilities.exceptions import (  # type: ignore[no-redef]
                SIGTERMException,
            )
        except ImportError as exc:
            raise ImportError(
                "broker.checkpoint.LightningCallback needs Lightning in this Python "
                "(pip install lightning; on the dev machines use /opt/gbroker/venv-ml/bin/python)"
            ) from exc
    return pl, SIGTERMException


def _build() -> type:
    pl, sigterm_exception = _lightning()

    class LightningCallback(pl.Callback):  # type: ignore[misc,name-defined]
        """Records each checkpoint Lightning saves in ``gbroker-checkpoint.json``; saves and exits 75 on a stop signal.

        ``directory``: where the manifest goes (default ``$GBROKER_CHECKPOINT_DIR``;
        with neither, nothing is recorded and the signal handling still works).
        ``stop_signals``: signals that mean "save now and stop" when Lightning
        has no handler of its own for them. ``exit_code``: the status a run
        stopped by a signal ends with (None keeps Lightning's 0).
        ``save_on_sigterm``: save before stopping on SIGTERM.
        """

        def __init__(
            self,
            directory: str | os.PathLike[str] | None = None,
            *,
            stop_signals: Iterable[int] = (signal.SIGUSR1,),
            exit_code: int | None = RESUME_EXIT,
            save_on_sigterm: bool = True,
        ) -> None:
            super().__init__()
            self.directory = directory
            self.stop_signals = tuple(stop_signals)
            self.exit_code = exit_code
            self.save_on_sigterm = save_on_sigterm
            self.last_saved_step: int | None = None
            """Global step of the last checkpoint saved in this run."""
            self.stopped_by_signal = False
            self._requested = False
            self._stopping = False
            self._previous: dict[int, Any] = {}

        # -- recording every save ------------------------------------------------

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if "save_checkpoint" in vars(trainer):
                return
            original = trainer.save_checkpoint

            def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
                original(filepath, *args, **kwargs)
                self._saved(trainer, filepath)

            trainer.save_checkpoint = save_checkpoint

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            vars(trainer).pop("save_checkpoint", None)
            self._restore_signals()

        def _saved(self, trainer: Any, filepath: Any) -> None:
            self.last_saved_step = int(trainer.global_step)
            if not trainer.is_global_zero:
                return
            by_signal = self._stopping or bool(_HPC_NAME.match(Path(str(filepath)).name))
            record_save(
                filepath,
                trainer.global_step,
                directory=self.directory,
                framework="lightning",
                reason="signal" if by_signal else "save",
            )

        # -- the warning signal when Lightning does not take it ----------------

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if threading.current_thread() is not threading.main_thread():
                return
            for sig in self.stop_signals:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._previous[sig] = signal.signal(sig, self._on_signal)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            # Lightning calls this only when fit ran to its end (a stop raises instead).
            finished = getattr(getattr(trainer, "fit_loop", None), "done", True)
            if trainer.is_global_zero and finished and not self._stopping and not getattr(trainer, "interrupted", False):
                record_finished(self.directory)

        def _on_signal(self, signum: int, frame: object) -> None:
            self._requested = True

        def _restore_signals(self) -> None:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self._previous = {}

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if not self._previous:
                return
            # Every rank must stop at the same batch: the save below is collective.
            if not trainer.strategy.reduce_boolean_decision(self._requested, all=False):
                return
            self._stopping = True
            trainer.save_checkpoint(next_hpc_path(trainer.default_root_dir))
            raise sigterm_exception()

        # -- stopping: save, then the exit status --------------------------------

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if not isinstance(exception, sigterm_exception):
                return
            self.stopped_by_signal = True
            self._stopping = True
            if self.save_on_sigterm and self.last_saved_step != trainer.global_step:
                try:
                    trainer.save_checkpoint(next_hpc_path(trainer.default_root_dir))
                except Exception as exc:  # the last recorded save stays the resume point
                    warnings.warn(f"could not save on SIGTERM: {exc}", RuntimeWarning, stacklevel=2)
            if self.exit_code is not None:
                exception.code = self.exit_code  # type: ignore[attr-defined]

    LightningCallback.__module__ = __name__
    LightningCallback.__qualname__ = "LightningCallback"  # picklable by name
    return LightningCallback


def __getattr__(name: str) -> Any:
    global _built
    if name == "LightningCallback":
        if _built is None:
            _built = _build()
        return _built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
