"""The time-limit warning is asked of Slurm only when it cannot arrive at the job's start."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.jobs.submit import request_for, warning_lead_s
from broker.spec import parse_spec
from policies import Capacity

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)


def spec(time_limit: str, **extra: object):  # type: ignore[no-untyped-def]
    data = {"name": "w", "group": "vision", "time_limit": time_limit, "command": ["sleep", "5"], **extra}
    return parse_spec(data, now=NOW)


def request(sp):  # type: ignore[no-untyped-def]
    return request_for(sp, job_id=7, key="gb-0123456789ab", attempt_number=1, partition="spot",
                       capacity=Capacity.SPOT, owner_name="alice", log_path=None)


def test_long_job_gets_the_warning_it_asked_for() -> None:
    sp = spec("1h", warning_signal="USR1")
    assert warning_lead_s(sp) == 120
    req = request(sp)
    assert req.signal == "B:USR1@120"
    assert "GBROKER_WARNING_SECONDS=120" in req.script


def test_short_job_gets_no_warning_that_could_come_at_its_start() -> None:
    # 1 minute, the default lead of half of it: Slurm may send it up to 60 s early, i.e. at once.
    sp = spec("1m", checkpoint={"style": "signal", "dir": "/ck"})
    assert sp.signal_lead_s == 30 and warning_lead_s(sp) is None
    req = request(sp)
    assert req.signal is None
    assert "GBROKER_WARNING_SECONDS" not in req.script
    # Exactly a minute between the lead and the limit is enough.
    assert warning_lead_s(spec("3m", signal_lead_s=120, warning_signal="USR1")) == 120


def test_a_warning_written_out_that_cannot_be_given_is_refused_not_dropped() -> None:
    import pytest

    from broker.errors import SpecError

    for extra in ({"warning_signal": "USR1"}, {"signal_lead_s": 121, "warning_signal": "USR2"}):
        with pytest.raises(SpecError, match="Slurm may send it up to 60s early"):
            spec("1m" if "signal_lead_s" not in extra else "3m", **extra)
    with pytest.raises(SpecError, match="signal_lead_s: there is no warning signal for it to lead"):
        spec("1h", signal_lead_s=900)


def test_only_a_job_that_asks_gets_a_warning() -> None:
    """An unasked signal kills most programs (default Lightning, the HF Trainer, plain scripts)."""
    plain = request(spec("1h"))
    assert plain.signal is None and "export GBROKER_WARNING_SIGNAL" not in plain.script
    saves = request(spec("1h", checkpoint={"style": "signal", "dir": "/ck"}))
    assert saves.signal == "B:USR1@120" and "PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in saves.script
    term = request(spec("1h", warning_signal="sigterm", signal_lead_s=300))
    assert term.signal == "B:TERM@300" and "PET_SIGNALS_TO_HANDLE" not in term.script
    off = request(spec("1h", checkpoint={"style": "signal", "dir": "/ck"}, warning_signal="none"))
    assert off.signal is None


def test_tasks_per_node() -> None:
    assert request(spec("1h")).ntasks_per_node == 1
    assert request(spec("1h", gpus_per_node=4, tasks_per_node="gpu")).ntasks_per_node == 4
    assert request(spec("1h", tasks_per_node=2)).ntasks_per_node == 2
