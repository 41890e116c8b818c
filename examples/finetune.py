"""A fine-tune loop that saves its step: resumes where it stopped.

Run under gbroker (see finetune.toml). It "trains" for --steps steps of
--step-seconds each, checkpointing every --every seconds and on the warning
signal. Its last line tells how many steps ran in each attempt, which proves
it resumed from its checkpoints instead of starting again.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from broker.checkpoint import Checkpointer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-seconds", type=float, default=1.0)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    ck = Checkpointer(every_s=args.every)
    state = ck.load() or {"step": 0, "loss": 10.0, "attempts": []}
    attempt = int(os.environ.get("GBROKER_ATTEMPT", "1"))
    state["attempts"].append({"attempt": attempt, "from_step": state["step"]})
    print(f"attempt {attempt}: starting at step {state['step']}", flush=True)
    while state["step"] < args.steps:
        time.sleep(args.step_seconds)
        state["step"] += 1
        state["loss"] = round(state["loss"] * 0.97, 6)
        if ck.due():
            ck.save(state)
            if ck.requested:
                print(f"warning signal: saved at step {state['step']}", flush=True)
    ck.save(state)
    with open(args.out, "w") as f:
        json.dump(state, f)
    print(f"done: {state['step']} steps, attempts {state['attempts']}", flush=True)


if __name__ == "__main__":
    main()
