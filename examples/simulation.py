"""A simulation that checkpoints its state (a 1-D heat equation), and resumes.

The state (time step and temperature field) is saved with the gbroker helper
on the warning signal and every --every seconds.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from broker.checkpoint import Checkpointer  # noqa: E402


def step(u: list[float], alpha: float = 0.25) -> list[float]:
    return [u[0]] + [u[i] + alpha * (u[i - 1] - 2 * u[i] + u[i + 1]) for i in range(1, len(u) - 1)] + [u[-1]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--pause", type=float, default=0.005, help="seconds per step (stand-in for real work)")
    ap.add_argument("--out", default="heat.json")
    args = ap.parse_args()
    ck = Checkpointer(every_s=args.every)
    state = ck.load() or {"t": 0, "u": [100.0] + [0.0] * (args.cells - 1)}
    print(f"starting at step {state['t']}", flush=True)
    while state["t"] < args.steps:
        state["u"] = step(state["u"])
        state["t"] += 1
        time.sleep(args.pause)
        if ck.due():
            ck.save(state)
    ck.save(state)
    with open(args.out, "w") as f:
        json.dump({"t": state["t"], "mid": state["u"][args.cells // 2]}, f)
    print(f"done at step {state['t']}", flush=True)


if __name__ == "__main__":
    main()
