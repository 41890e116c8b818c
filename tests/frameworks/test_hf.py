"""Hugging Face Trainer (transformers 5.x) under gbroker: examples/hf_finetune.py over three attempts.

1. SIGTERM mid-run: HFCallback makes the Trainer save ``checkpoint-N`` at the
   end of the step, records it (reason "signal"), and the program exits 75.
2. SIGUSR1, which kills a plain Trainer, does the same.
3. Runs to the end. Each attempt resumes at the step the previous one
   recorded last, through ``resume_from_checkpoint=latest_checkpoint()``.
"""

from __future__ import annotations

import os
import signal

from framework_jobs import REPO, result

EXAMPLE = str(REPO / "examples" / "hf_finetune.py")
STEPS = 30


def test_hf_trainer_saves_on_signals_and_resumes(ml_python, start_job, tmp_path):
    argv = [ml_python, EXAMPLE, "--steps", str(STEPS), "--every", "5"]
    ckpt = tmp_path / "ck"
    stops = []
    for attempt, sig in ((1, signal.SIGTERM), (2, signal.SIGUSR1)):
        before = (stops[-1]["step"] if stops else 0)
        job = start_job(argv, attempt)
        saved = job.wait_for_save(before + 5, attempt=attempt)
        assert saved["framework"] == "transformers" and saved["reason"] == "save"
        assert saved["path"] == str(ckpt / f"checkpoint-{saved['step']}")
        job.signal(sig)
        assert job.finish() == 75, job.output()
        m = job.manifest()
        assert m is not None and m["reason"] == "signal" and m["attempt"] == attempt
        assert m["path"] == str(ckpt / f"checkpoint-{m['step']}") and m["step"] > saved["step"]
        assert os.path.isfile(os.path.join(m["path"], "trainer_state.json"))
        r = result(tmp_path, "hf-result.json")["attempts"][-1]
        assert r["stopped_by_signal"] and r["last_step"] == m["step"] and r["resumed_from_step"] == before
        if stops:
            assert r["resumed_from"] == stops[-1]["path"]
        stops.append(m)

    job = start_job(argv, 3)
    assert job.finish() == 0, job.output()
    final = result(tmp_path, "hf-result.json")
    assert [a["attempt"] for a in final["attempts"]] == [1, 2, 3]
    assert final["attempts"][-1]["resumed_from_step"] == stops[-1]["step"]
    assert final["finished"] and final["final_step"] == STEPS
    m3 = job.manifest()
    assert m3 is not None and m3["step"] == STEPS and m3["attempt"] == 3 and m3["reason"] == "save"
