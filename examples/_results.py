"""The small JSON result file every fine-tuning example keeps in its working directory.

One entry per attempt (GBROKER_ATTEMPT): the step it resumed from, the step it
reached, and whether a stop signal ended it. Tests and people read it to see
that a job resumed from its checkpoint instead of starting over.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def step_seconds(default: float = 0.25) -> float:
    """How long each training step is made to take (FINETUNE_STEP_SECONDS), so a test can interrupt one."""
    return float(os.environ.get("FINETUNE_STEP_SECONDS", default))


def record_attempt(
    out: str | os.PathLike[str],
    *,
    resumed_from_step: int,
    last_step: int,
    total_steps: int,
    stopped_by_signal: bool,
    resumed_from: str | None,
) -> dict[str, Any]:
    """Append this attempt to the result file `out` (written whole, then renamed into place)."""
    path = Path(out)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        result = {"attempts": []}
    result["attempts"].append(
        {
            "attempt": int(os.environ.get("GBROKER_ATTEMPT", "1")),
            "resumed_from_step": resumed_from_step,
            "resumed_from": resumed_from,
            "last_step": last_step,
            "steps_done": last_step - resumed_from_step,
            "stopped_by_signal": stopped_by_signal,
            "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        }
    )
    result["final_step"] = last_step
    result["finished"] = last_step >= total_steps
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)
    return result
