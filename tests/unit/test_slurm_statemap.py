"""The one Slurm-state table: every job and node state string, and the unknown case."""

from __future__ import annotations

import logging

import pytest

from broker.slurm import statemap
from broker.slurm.statemap import job_state, node_state, parse_node_state
from broker.states import AttemptState as A
from broker.states import NodeState as N

# Every job state Slurm 22.05/24.11 prints (job_state_string), with what it must mean to us.
EXPECTED_JOB_STATES = {
    "PENDING": A.PENDING,
    "RESV_DEL_HOLD": A.PENDING,
    "CONFIGURING": A.RUNNING,
    "RUNNING": A.RUNNING,
    "COMPLETING": A.RUNNING,
    "RESIZING": A.RUNNING,
    "SIGNALING": A.RUNNING,
    "STAGE_OUT": A.RUNNING,
    "SUSPENDED": A.RUNNING,
    "STOPPED": A.RUNNING,
    "COMPLETED": A.COMPLETED,
    "FAILED": A.FAILED,
    "OUT_OF_MEMORY": A.FAILED,
    "SPECIAL_EXIT": A.FAILED,
    "CANCELLED": A.CANCELLED,
    "REVOKED": A.CANCELLED,
    "TIMEOUT": A.TIMEOUT,
    "DEADLINE": A.TIMEOUT,
    "NODE_FAIL": A.RECLAIMED,
    "BOOT_FAIL": A.RECLAIMED,
    "PREEMPTED": A.PREEMPTED,
    "REQUEUED": A.PREEMPTED,
    "REQUEUE_FED": A.PREEMPTED,
    "REQUEUE_HOLD": A.PREEMPTED,
}


@pytest.mark.parametrize(("raw", "want"), sorted(EXPECTED_JOB_STATES.items()))
def test_every_job_state(raw: str, want: A) -> None:
    assert job_state(raw) is want


def test_table_covers_exactly_the_known_states() -> None:
    assert set(statemap.JOB_STATES) == set(EXPECTED_JOB_STATES)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("CANCELLED by 0", A.CANCELLED),
        ("CANCELLED by 1001", A.CANCELLED),
        ("  RUNNING \n", A.RUNNING),
        ("running", A.RUNNING),
        ("PD", A.PENDING),
        ("CG", A.RUNNING),
        ("NF", A.RECLAIMED),
        ("PR", A.PREEMPTED),
        ("CD", A.COMPLETED),
        ("OOM", A.FAILED),
    ],
)
def test_job_state_variants(raw: str, want: A) -> None:
    assert job_state(raw) is want


@pytest.mark.parametrize("raw", ["", "EXPLODED", "COMPLETED_ISH", "?", "DONE"])
def test_unknown_job_state_is_unknown_with_warning(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.slurm.statemap"):
        assert job_state(raw) is A.UNKNOWN
    assert any("unknown Slurm job state" in r.message for r in caplog.records)


def test_no_unknown_string_becomes_completed() -> None:
    for raw in ["COMPLETE", "COMPLETEDX", "SUCCESS", "OK", "EXIT", "0"]:
        assert job_state(raw) is not A.COMPLETED


# ---------------------------------------------------------------- nodes


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        # compact (sinfo %t) and long (%T) bases
        ("idle", N.IDLE),
        ("IDLE", N.IDLE),
        ("alloc", N.ALLOCATED),
        ("allocated", N.ALLOCATED),
        ("alloc+", N.ALLOCATED),
        ("mix", N.ALLOCATED),
        ("mixed", N.ALLOCATED),
        ("comp", N.ALLOCATED),
        ("completing", N.ALLOCATED),
        ("down", N.DOWN),
        ("drain", N.DOWN),
        ("drained", N.DOWN),
        ("drng", N.ALLOCATED),
        ("draining", N.ALLOCATED),
        ("fail", N.DOWN),
        ("failg", N.ALLOCATED),
        ("failing", N.ALLOCATED),
        ("futr", N.DOWN),
        ("future", N.DOWN),
        ("inval", N.DOWN),
        ("maint", N.DOWN),
        ("unk", N.UNKNOWN),
        ("unknown", N.UNKNOWN),
        ("cloud", N.POWERED_DOWN),
        ("pow_dn", N.POWERING_DOWN),
        ("power_down", N.POWERING_DOWN),
        ("pow_up", N.POWERING_UP),
        ("powering_up", N.POWERING_UP),
        ("powring_dn", N.POWERING_DOWN),
        ("powering_down", N.POWERING_DOWN),
        ("powered_dn", N.POWERED_DOWN),
        ("powered_down", N.POWERED_DOWN),
        ("boot", N.POWERING_UP),
        ("reboot^", N.POWERING_UP),
        ("plnd", N.ALLOCATED),
        ("resv", N.IDLE),
        ("npc", N.ALLOCATED),
        ("blocked", N.ALLOCATED),
        # suffix flags
        ("idle~", N.POWERED_DOWN),
        ("IDLE~", N.POWERED_DOWN),
        ("idle#", N.POWERING_UP),
        ("alloc#", N.ALLOCATED),
        ("mix#", N.ALLOCATED),
        ("idle%", N.POWERING_DOWN),
        ("idle!", N.POWERING_DOWN),
        ("idle*", N.DOWN),
        ("down*", N.DOWN),
        ("down~", N.DOWN),
        ("drain~", N.DOWN),
        ("drng*", N.DOWN),  # not responding wins over "still busy"
        ("alloc*", N.DOWN),
        ("idle$", N.DOWN),
        ("mix$", N.ALLOCATED),
        ("idle@", N.POWERING_UP),
        ("idle^", N.POWERING_UP),
        ("mix-", N.ALLOCATED),
        # complete form (sinfo StateComplete, scontrol State=)
        ("idle+cloud+powered_down", N.POWERED_DOWN),
        ("IDLE+CLOUD+POWERED_DOWN", N.POWERED_DOWN),
        ("idle+cloud+powering_up", N.POWERING_UP),
        ("idle+cloud+powering_down", N.POWERING_DOWN),
        ("idle+cloud+power_down", N.POWERING_DOWN),
        ("idle+cloud", N.IDLE),
        ("mixed+cloud", N.ALLOCATED),
        ("mixed+cloud+powered_down", N.ALLOCATED),  # 24.11/26.05: given a job before its resume
        ("allocated+cloud+powering_up", N.ALLOCATED),
        ("down+cloud+not_responding", N.DOWN),
        ("down+cloud+powered_down", N.DOWN),
        ("idle+drain", N.DOWN),
        ("mixed+drain", N.ALLOCATED),
        ("idle+not_responding", N.DOWN),
        ("idle+cloud+powered_down+not_responding", N.POWERED_DOWN),
        ("unknown+cloud+powered_down", N.POWERED_DOWN),
        ("idle+invalid_reg", N.DOWN),
    ],
)
def test_node_states(raw: str, want: N) -> None:
    assert node_state(raw) is want


def test_every_suffix_is_understood() -> None:
    for suffix in "*~#!%$@^-":
        parsed = parse_node_state("idle" + suffix)
        assert parsed.flags == {statemap.NODE_SUFFIXES[suffix]}
        assert parsed.state is not N.UNKNOWN


def test_parsed_flags() -> None:
    p = parse_node_state("idle+cloud+powered_down")
    assert p.powered_down and not p.powering_up and not p.drain
    assert p.flags == {"CLOUD", "POWERED_DOWN"}
    assert parse_node_state("idle#").powering_up
    assert parse_node_state("idle!").powering_down
    assert parse_node_state("drain*").drain and parse_node_state("drain*").not_responding


@pytest.mark.parametrize("raw", ["exploded", "idle?", "zzz~", ""])
def test_unknown_node_state(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.slurm.statemap"):
        assert node_state(raw) is N.UNKNOWN
    assert caplog.records


def test_unknown_node_flag_warns_but_keeps_base(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.slurm.statemap"):
        assert node_state("idle+sparkly") is N.IDLE
    assert any("SPARKLY" in r.message for r in caplog.records)
