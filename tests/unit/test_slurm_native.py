"""broker.slurm.native's own logic, without Slurm (the dev-cluster proof is
tests/integration/test_native_submit.py)."""

import signal

import pytest

from broker.errors import NotFound, SlurmError
from broker.slurm.backend import SubmitRequest
from broker.slurm.native import Native


class _Lib:
    KILL_JOB_BATCH = 0x8


def _native(version=(22, 5)) -> Native:
    return Native(ffi=None, lib=_Lib(), version=version)


def test_an_account_that_is_gone_is_not_found_before_slurm_is_asked():
    req = SubmitRequest(script="#!/bin/sh\n", partition="spot", job_name="x", comment="", account=None,
                        user="no-such-user-here", workdir="/tmp", nodes=1, gpus_per_node=0, time_limit_s=60)
    with pytest.raises(NotFound, match="no Unix user named 'no-such-user-here'"):
        _native().submit(req, {}, ["sbatch"])  # ffi is None: it would fail at once had it gone further


def test_warning_signals_read_as_sbatch_reads_them():
    n = _native()
    assert n._signal("B:USR1@120", []) == (int(signal.SIGUSR1), 120, 0x8)
    assert n._signal("TERM", []) == (int(signal.SIGTERM), 60, 0)
    assert n._signal("B:SIGUSR2@30", []) == (int(signal.SIGUSR2), 30, 0x8)
    assert n._signal("B:10@5", []) == (10, 5, 0x8)
    for bad in ("B:NOPE@5", "R:USR1@5", "B:USR1@soon"):
        with pytest.raises(SlurmError):
            n._signal(bad, [])


def test_gpu_requests_are_spelled_for_the_release():
    assert _native((22, 5))._gpu_tres == "gres:gpu"
    assert _native((24, 11))._gpu_tres == "gres/gpu"
