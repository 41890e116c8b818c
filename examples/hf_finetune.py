"""A tiny Hugging Face Trainer fine-tune that gbroker can stop, bill exactly and resume.

What a researcher adds to an existing Trainer script, and nothing else:

* ``HFCallback()`` last in ``callbacks=[...]``: it records every
  ``checkpoint-N`` the Trainer saves in gbroker's manifest, and on SIGUSR1 or
  SIGTERM makes the Trainer save at the end of the current step, stop, and
  the program end with status 75 ("resume me");
* ``resume_from_checkpoint=latest_checkpoint()`` in ``trainer.train``: None on
  a first attempt, the newest ``checkpoint-N`` directory on the next ones;
* ``save_steps`` small enough that a spot reclaim (no warning) loses little.

The model is a GPT-2 of two small layers built from a config with random
weights (nothing is downloaded), trained on random tokens, CPU only; each step
is paced (``--step-seconds``, or FINETUNE_STEP_SECONDS). It appends one
entry per attempt to ``hf-result.json`` in its working directory. Run it with
/opt/gbroker/venv-ml/bin/python (see hf_finetune.toml).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from broker.checkpoint import HFCallback, latest_checkpoint  # noqa: E402
from examples._results import record_attempt, step_seconds  # noqa: E402


class Pace(TrainerCallback):
    """Makes each step take `seconds`, standing in for a real model's step time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            print(f"step {state.global_step}", flush=True)  # progress in the job log


class ResultFile(TrainerCallback):
    """Writes the attempt's entry when training ends. Listed before HFCallback, which may end the program."""

    def __init__(self, out: str, total: int, resumed_from: str | None, gbroker: Any) -> None:
        self.out, self.total, self.resumed_from, self.gbroker = out, total, resumed_from, gbroker
        self.start = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = state.global_step
        print(f"attempt {os.environ.get('GBROKER_ATTEMPT', '1')}: starting at step {self.start}", flush=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            record_attempt(self.out, resumed_from_step=self.start, last_step=state.global_step,
                           total_steps=self.total, stopped_by_signal=self.gbroker.stopped_by_signal,
                           resumed_from=self.resumed_from)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-seconds", type=float, default=step_seconds())
    ap.add_argument("--every", type=int, default=5, help="save a checkpoint every N steps")
    ap.add_argument("--out", default="hf-result.json")
    ap.add_argument("--output-dir", default=os.environ.get("GBROKER_CHECKPOINT_DIR", "hf-run"))
    args = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, config.vocab_size, (512, 16))
    data = [{"input_ids": row, "labels": row} for row in tokens]

    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=5e-4,
        save_strategy="steps",
        save_steps=args.every,
        save_total_limit=2,
        logging_steps=10,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    resume = latest_checkpoint()
    gbroker = HFCallback()
    trainer = Trainer(model=model, args=training, train_dataset=data,
                      callbacks=[Pace(args.step_seconds), ResultFile(args.out, args.steps, resume, gbroker), gbroker])
    trainer.train(resume_from_checkpoint=resume)
    print(f"done: step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
