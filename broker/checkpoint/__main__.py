"""``python -m broker.checkpoint``: the manifest for job scripts written in bash.

    python -m broker.checkpoint latest        # prints the checkpoint to resume from (nothing: none)
    python -m broker.checkpoint stopped-on-signal
        # exit 0 when this attempt's last save was made on a stop signal, else 1

The second one lets a job script give gbroker status 75 ("resume me") when a
launcher hid it: torchrun and ``accelerate launch`` end with 1 when their
workers end with 75.
"""

from __future__ import annotations

import sys

from broker.checkpoint.manifest import current_attempt, latest_checkpoint, read_manifest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["latest"]:
        path = latest_checkpoint()
        if path:
            print(path)
        return 0
    if args == ["stopped-on-signal"]:
        manifest = read_manifest() or {}
        same_attempt = manifest.get("attempt") == current_attempt()
        return 0 if same_attempt and manifest.get("reason") == "signal" else 1
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
