"""A render job made of independent pieces (frame ranges): restarts freely.

Each frame is "rendered" to its own file; a frame already on disk is skipped,
so a reclaimed attempt loses at most the frame it was drawing. This is the
`pieces` checkpoint style: no signal handling needed.
"""

import argparse
import hashlib
import os
import time
from pathlib import Path


def render(frame: int) -> bytes:
    # Stand-in for a renderer: deterministic bytes per frame.
    return hashlib.sha256(f"frame-{frame}".encode()).hexdigest().encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", default="1-40", help="frame range, e.g. 1-240")
    ap.add_argument("--seconds-per-frame", type=float, default=0.5)
    args = ap.parse_args()
    first, last = (int(x) for x in args.frames.split("-"))
    out = Path(os.environ.get("GBROKER_CHECKPOINT_DIR", "frames"))
    out.mkdir(parents=True, exist_ok=True)
    done = skipped = 0
    for frame in range(first, last + 1):
        target = out / f"frame-{frame:05d}.png"
        if target.exists():
            skipped += 1
            continue
        time.sleep(args.seconds_per_frame)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(render(frame))
        os.replace(tmp, target)
        done += 1
    print(f"rendered {done} frames, {skipped} were already done", flush=True)


if __name__ == "__main__":
    main()
