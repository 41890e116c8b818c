"""A plain PyTorch DDP fine-tune under torchrun that gbroker can stop, bill exactly and resume.

For training loops without Lightning or the HF Trainer: the loop saves with
``torch.save`` and records each save with ``broker.checkpoint.record_save``,
and resumes from ``latest_checkpoint()``.

Signals under torchrun: the workers run in their own sessions, so a signal
sent to the job's process group reaches only the torchrun launcher. torchrun
forwards SIGTERM (and SIGINT, SIGHUP, SIGQUIT) to every worker; it forwards
SIGUSR1 only when told (``--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``),
and without that a SIGUSR1 kills the launcher and leaves the workers running
unaware. Each worker here takes SIGUSR1 and SIGTERM as "save now and stop";
the ranks agree at the next step (one all-reduce), rank 0 saves, and all
exit 75. torchrun reports that as exit status 1 (it reports any worker's
non-zero status so), which is why the manifest also says ``"reason": "signal"``
and why finetune_job.sh turns torchrun's 1 back into 75 when it does.

Run (2 CPU workers, gloo):
    /opt/gbroker/venv-ml/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 examples/torchrun_finetune.py
Each step is paced (``--step-seconds`` or FINETUNE_STEP_SECONDS); rank 0
appends one entry per attempt to ``torchrun-result.json`` in the working directory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from broker.checkpoint import RESUME_EXIT, checkpoint_dir, latest_checkpoint, record_finished, record_save  # noqa: E402
from examples._results import record_attempt, step_seconds  # noqa: E402

_stop_requested = False


def _request_stop(signum: int, frame: object) -> None:
    global _stop_requested
    _stop_requested = True


def _save(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, directory: str, reason: str) -> None:
    """Rank 0 writes the checkpoint, then records it; the file is complete before the manifest names it."""
    path = os.path.join(directory, f"step-{step:06d}.pt")
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)
    record_save(path, step, framework="torch", reason=reason)
    for old in sorted(p for p in os.listdir(directory) if p.startswith("step-") and p.endswith(".pt"))[:-2]:
        os.unlink(os.path.join(directory, old))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-seconds", type=float, default=step_seconds())
    ap.add_argument("--every", type=int, default=5, help="save a checkpoint every N steps")
    ap.add_argument("--out", default="torchrun-result.json")
    args = ap.parse_args()

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, _request_stop)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    directory = str(checkpoint_dir() or "torchrun-run")
    os.makedirs(directory, exist_ok=True)

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    resume = latest_checkpoint()
    if resume:
        state = torch.load(resume, weights_only=True)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = int(state["step"])
    start = step
    if rank == 0:
        print(f"attempt {os.environ.get('GBROKER_ATTEMPT', '1')}: starting at step {step}", flush=True)

    generator = torch.Generator().manual_seed(rank)
    stopped = False
    while step < args.steps:
        time.sleep(args.step_seconds)
        x = torch.randn(8, 16, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        if rank == 0:
            print(f"step {step}", flush=True)  # progress in the job log
        # Every rank learns whether any rank was signalled, so they stop at the same step.
        flag = torch.tensor([1 if _stop_requested else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stopped = bool(flag.item())
        if rank == 0 and (stopped or step % args.every == 0 or step == args.steps):
            _save(model.module, optim, step, directory, "signal" if stopped else "save")
        if stopped:
            break

    if rank == 0:
        record_attempt(args.out, resumed_from_step=start, last_step=step, total_steps=args.steps,
                       stopped_by_signal=stopped, resumed_from=resume)
        print(f"{'stopped on a signal' if stopped else 'done'}: step {step}", flush=True)
        if not stopped:
            record_finished()  # all the work is done, whatever the launcher's exit says
    dist.barrier()
    dist.destroy_process_group()
    if stopped:
        sys.exit(RESUME_EXIT)


if __name__ == "__main__":
    main()
