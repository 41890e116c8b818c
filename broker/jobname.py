"""A job's default name: what a human recognises the job by when it was not named.

Kept out of ``broker.spec`` so ``gbroker submit -- cmd`` can name its log (``broker.joblog``)
without loading the spec parser. May import: nothing of gbroker.
"""

from __future__ import annotations

import re

MAX_NAME_CHARS = 64
INTERPRETERS = frozenset({"python", "python3", "bash", "sh", "zsh", "env", "srun", "mpirun", "torchrun"})
"""Programs that run another: the job is named after what they run (``python train.py`` -> train.py)."""
DEFAULT_KIND = "other"


def base_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def default_name(command: tuple[str, ...] | list[str] | None, script_path: str | None, kind: str) -> str:
    """'train.py' for ['python', 'train.py'], the script's file name; else the kind."""
    source = None
    if command:
        source = command[0]
        base = base_name(source)
        if base.rstrip("0123456789.") in INTERPRETERS and len(command) > 1 and not command[1].startswith("-"):
            source = command[1]
    elif script_path:
        source = script_path
    base = base_name(source) if source else ""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip("-")[:MAX_NAME_CHARS]
    return cleaned or kind
