"""A tiny Lightning fine-tune that gbroker can stop, bill exactly and resume.

What a researcher adds to an existing Lightning script, and nothing else:

* ``LightningCallback()`` in the trainer's callbacks: it records every
  checkpoint Lightning writes in gbroker's manifest, and on a stop signal
  saves and ends the program with status 75 ("resume me");
* ``ckpt_path=latest_checkpoint()`` in ``trainer.fit``: None on a first
  attempt, the newest checkpoint on the next ones;
* a ``ModelCheckpoint`` that saves every few steps (a spot reclaim gives no
  warning: what was not saved is lost).

The model is a small MLP on synthetic data, CPU only; each step is paced
(``--step-seconds``, or FINETUNE_STEP_SECONDS) so a test can interrupt
it. It appends one entry per attempt to ``lightning-result.json`` in its
working directory. Run it with /opt/gbroker/venv-ml/bin/python (see
lightning_finetune.toml).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from broker.checkpoint import LightningCallback, latest_checkpoint  # noqa: E402
from examples._results import record_attempt, step_seconds  # noqa: E402


class Regressor(L.LightningModule):
    """Stands in for a pretrained model being fine-tuned: two linear layers."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.step_s = step_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_s)
        if self.trainer.is_global_zero:
            print(f"step {self.global_step + 1}", flush=True)  # progress in the job log
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class ResultFile(L.Callback):
    """Writes the attempt's entry in the result file when fit ends, however it ends."""

    def __init__(self, out: str, total: int, resumed_from: str | None) -> None:
        self.out, self.total, self.resumed_from = out, total, resumed_from
        self.start = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = trainer.global_step
        print(f"attempt {os.environ.get('GBROKER_ATTEMPT', '1')}: starting at step {self.start}", flush=True)

    def _write(self, trainer: L.Trainer, stopped: bool) -> None:
        if trainer.is_global_zero:
            record_attempt(self.out, resumed_from_step=self.start, last_step=trainer.global_step,
                           total_steps=self.total, stopped_by_signal=stopped, resumed_from=self.resumed_from)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, stopped=False)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._write(trainer, stopped=isinstance(exception, SystemExit))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-seconds", type=float, default=step_seconds())
    ap.add_argument("--every", type=int, default=5, help="save a checkpoint every N steps")
    ap.add_argument("--out", default="lightning-result.json")
    ap.add_argument("--root", default=os.environ.get("GBROKER_CHECKPOINT_DIR", "lightning-run"),
                    help="Lightning's default_root_dir (checkpoints go under it)")
    ap.add_argument("--auto-requeue", action=argparse.BooleanOptionalAction, default=True,
                    help="under Slurm, let Lightning save and requeue the job itself on the warning "
                    "(its default); --no-auto-requeue leaves the warning to LightningCallback")
    args = ap.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 1))
    resume = latest_checkpoint()
    plugins = [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() and not args.auto_requeue else None
    trainer = L.Trainer(
        default_root_dir=args.root,
        plugins=plugins,
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ResultFile(args.out, args.steps, resume),
            ModelCheckpoint(dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=args.every,
                            save_top_k=1, save_last=False),
            LightningCallback(),
        ],
    )
    trainer.fit(Regressor(args.step_seconds), DataLoader(data, batch_size=8, shuffle=True), ckpt_path=resume)
    print(f"done: step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
