"""A render job made of independent pieces (frame ranges): restarts freely.

Each frame is "rendered" to its own file; a frame already on disk is skipped,
so a reclaimed attempt loses at most the frame it was drawing. This is the
`pieces` checkpoint style: no signal handling needed.

As an array (``pieces = "1-40"``) every task renders the frames gbroker gives
it (GBROKER_PIECE_FIRST to GBROKER_PIECE_LAST); without, the --frames range.
Every frame written is noted in ``renders.log`` next to the frames.
"""

import argparse
import hashlib
import os
import socket
import time
from pathlib import Path


def render(frame: int) -> bytes:
    # Stand-in for a renderer: deterministic bytes per frame.
    return hashlib.sha256(f"frame-{frame}".encode()).hexdigest().encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", default="1-40", help="frame range, e.g. 1-240 (an array's task gets its own)")
    ap.add_argument("--seconds-per-frame", type=float, default=0.5)
    args = ap.parse_args()
    first, last = (int(x) for x in args.frames.split("-"))
    step = 1
    if os.environ.get("GBROKER_PIECE_FIRST"):
        first, last = int(os.environ["GBROKER_PIECE_FIRST"]), int(os.environ["GBROKER_PIECE_LAST"])
        step = int(os.environ.get("GBROKER_PIECE_STEP", "1"))
    out = Path(os.environ.get("GBROKER_CHECKPOINT_DIR", "frames"))
    out.mkdir(parents=True, exist_ok=True)
    done = skipped = 0
    for frame in range(first, last + 1, step):
        target = out / f"frame-{frame:05d}.png"
        if target.exists():
            skipped += 1
            continue
        time.sleep(args.seconds_per_frame)
        tmp = target.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_bytes(render(frame))
        os.replace(tmp, target)
        with open(out / "renders.log", "a") as note:  # one line per frame written, for anyone counting
            note.write(f"{frame} {socket.gethostname()} {os.environ.get('GBROKER_ATTEMPT', '1')}\n")
        done += 1
    print(f"rendered {done} frames, {skipped} were already done", flush=True)


if __name__ == "__main__":
    main()
