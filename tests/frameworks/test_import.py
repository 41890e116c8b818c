"""``import broker.checkpoint`` needs neither torch nor a framework: the daemon imports it."""

from __future__ import annotations

import subprocess
import sys

from framework_jobs import REPO


def test_import_without_torch_is_fast_and_lazy():
    code = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "import broker.checkpoint as c\n"
        "took = time.perf_counter() - t\n"
        "heavy = [m for m in ('torch', 'lightning', 'transformers', 'accelerate') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert took < 0.5, took\n"
        "assert callable(c.latest_checkpoint) and callable(c.last_saved_at) and c.RESUME_EXIT == 75\n"
        "for name, need in (('LightningCallback', 'Lightning'), ('HFCallback', 'transformers')):\n"
        "    try:\n"
        "        getattr(c, name)\n"
        "    except ImportError as exc:\n"
        "        assert need in str(exc) and 'venv-ml' in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError(name + ' built without its framework')\n"
    )
    # The test runner's venv has no torch: that is the point.
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_callbacks_build_in_the_fine_tuning_venv(ml_python):
    code = (
        "import pickle, lightning.pytorch as pl, transformers\n"
        "from broker.checkpoint import HFCallback, LightningCallback\n"
        "assert issubclass(LightningCallback, pl.Callback)\n"
        "assert issubclass(HFCallback, transformers.TrainerCallback)\n"
        "assert pickle.loads(pickle.dumps(LightningCallback())).exit_code == 75\n"
        "assert pickle.loads(pickle.dumps(HFCallback())).exit_code == 75\n"
    )
    proc = subprocess.run([ml_python, "-c", code], cwd=REPO, capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
