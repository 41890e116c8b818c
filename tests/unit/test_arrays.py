"""Arrays: the pieces grammar and its ranges, the spec fields, the piece state machine, the batch
script's piece lines, and an array on the fake Slurm end to end: per-piece recovery and retries,
the ledger's charges per task run (useful and lost), the progress line, chains."""

from __future__ import annotations

import shlex
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from array_fakes import array_world, submit_array
from broker.db.array_models import ArrayPiece
from broker.db.ledger_models import Charge, LedgerRun
from broker.db.store import IllegalTransition
from broker.errors import SpecError
from broker.jobs import lifecycle
from broker.jobs.handlers import cancel_jobs, show_job
from broker.jobs.submit import submit
from broker.pieces import PiecesError, bar, compress, parse_pieces, progress_line, slurm_array
from broker.slurm.cli_backend import CliBackend
from broker.slurm.script import ArrayPart, array_lines, render_batch_script
from broker.spec import parse_spec, spec_from_dict, spec_to_dict
from broker.states import PIECE_ALLOWED, PIECE_FINAL, PieceState, can_move_piece
from ledger_fakes import ROOT, World, caller

NOW = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)


# -- the grammar -------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "indices", "limit"), [
    ("1-5", (1, 2, 3, 4, 5), None),
    ("1-9:4", (1, 5, 9), None),
    ("1,5,9-11", (1, 5, 9, 10, 11), None),
    ("0-3%2", (0, 1, 2, 3), 2),
    ("7", (7,), None),
    ("3,1,3,2", (1, 2, 3), None),
])
def test_pieces_read_slurms_array_grammar(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    p = parse_pieces(text)
    assert (p.indices, p.limit) == (indices, limit)


@pytest.mark.parametrize("text", ["", "1-", "5-1", "a-b", "1-4:0", "1-4%", "1-4%0", "1;2", "1-4 --wrap=x",
                                  "1-200000", "1-4%\u00b2"])
def test_pieces_refuse_what_is_not_an_array(text: str) -> None:
    with pytest.raises(PiecesError):
        parse_pieces(text)


def test_a_chunk_never_runs_an_index_that_was_not_asked_for() -> None:
    for text, chunk in (("1-400:5", 3), ("1-10", 4), ("2,4,6,8", 2), ("1,5,9-12", 1)):
        p = parse_pieces(text, chunk)
        for first, last in p.chunks():
            assert set(range(first, last + 1, p.step)) == set(p.members(first)), (text, chunk, first, last)
    assert not parse_pieces("1-10,15-24", 4).evenly_spaced  # refused with chunk by the spec parser


def test_chunks_cut_the_indices_in_order_and_keep_the_step() -> None:
    p = parse_pieces("1-10", chunk=4)
    assert p.chunks() == [(1, 4), (5, 8), (9, 10)] and p.members(5) == (5, 6, 7, 8) and p.step == 1
    q = parse_pieces("1-19:3", chunk=2)
    assert q.chunks() == [(1, 4), (7, 10), (13, 16), (19, 19)] and q.step == 3
    assert slurm_array([a for a, _ in q.chunks()], 2) == "1,7,13,19%2"


@pytest.mark.parametrize(("indices", "text"), [
    ([], ""), ([4], "4"), ([1, 2, 3, 5, 7, 8], "1-3,5,7-8"), (range(1, 121), "1-120"),
    ([*range(1, 121), *range(125, 301)], "1-120,125-300"), ([3, 1, 2, 2], "1-3"),
])
def test_compress_gives_ranges(indices: Any, text: str) -> None:
    assert compress(indices) == text
    if text:
        assert parse_pieces(text).indices == tuple(sorted(set(indices)))


def test_progress_line_and_bar() -> None:
    assert progress_line({"done": 312, "running": 16, "failed": 2, "pending": 70}, 400) == \
        "312/400 done, 16 running, 70 pending, 2 failed"
    assert progress_line({}, 40) == "0/40 done"
    assert bar(15, 30, width=10) == "[#####.....]  50%"


# -- the spec ----------------------------------------------------------------------------------
def spec(**kw: Any) -> Any:
    data = {"time_limit": "5m", "group": "vision", "command": ["python3", "sim.py"], **kw}
    return parse_spec(data, now=NOW)


def test_a_sweep_file_is_read_on_the_cli_side_and_sent_as_lines(tmp_path: Any) -> None:
    points = tmp_path / "points.txt"
    points.write_text("# alpha sweep\n--alpha 0.1\n\n--alpha '0.2 0.3' --tag \"$(reboot)\"\n")
    s = spec(sweep=str(points))
    assert s.sweep == (("--alpha", "0.1"), ("--alpha", "0.2 0.3", "--tag", "$(reboot)")) and s.pieces == "1-2"
    sent = spec_to_dict(s)
    assert sent["sweep"] == ["--alpha 0.1", "--alpha '0.2 0.3' --tag '$(reboot)'"] and "pieces" not in sent
    assert spec_from_dict(sent) == s
    # The daemon never reads a path.
    with pytest.raises(SpecError, match="the client must send the file's lines"):
        spec_from_dict({**sent, "sweep": str(points)})


@pytest.mark.parametrize(("fields", "message"), [
    ({"pieces": "1-"}, "pieces: '1-' is not an index"),
    ({"pieces": ["1-4"]}, "pieces: must be a string"),
    ({"chunk": 4}, "chunk: only an array has chunks"),
    ({"pieces": "1-4", "sweep": ["a", "b"]}, "give pieces or a sweep, not both"),
    ({"sweep": ["--a 'unclosed"]}, "sweep line 1: \"--a 'unclosed\" cannot be split"),
    ({"sweep": []}, "sweep: must be a file path or a non-empty list"),
    ({"after": ["x"]}, "after: 'x' is not a job number"),
    ({"after": 0}, "after: 0 is not a job number"),
    ({"sweep": ["--x 1", "--x 2", "--x 3"], "chunk": 2}, "chunk: a sweep runs one piece per line"),
    ({"pieces": "1-10,15-24", "chunk": 4}, "chunk: chunk 4 needs evenly spaced pieces"),
])
def test_array_fields_are_checked_with_a_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as exc:
        spec(**fields)
    assert message in exc.value.message, exc.value.message


def test_pieces_chunk_and_after_round_trip() -> None:
    s = spec(pieces="1-400:2%16", chunk=10, after=[3, 4, 3])
    assert s.after == (3, 4) and s.array().limit == 16 and len(s.array().chunks()) == 20
    assert spec_from_dict(spec_to_dict(s)) == s


# -- the batch script ----------------------------------------------------------------------------
def run_script(part: ArrayPart, task: int, command: list[str]) -> str:
    script = render_batch_script(job_id=1, attempt=1, checkpoint_dir="/tmp/gb-arrays-test-ck", command=command,
                                 array=part)
    env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": str(task)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout


def test_each_task_gets_its_piece_its_chunk_and_its_sweep_arguments_as_data() -> None:
    part = ArrayPart(step=3, lasts=((1, 7),), sweep=((1, ("--x", "$(echo pwned)")), (10, ("--x", "a b"))))
    show = ["bash", "-c", 'echo "$GBROKER_PIECE $GBROKER_PIECE_FIRST $GBROKER_PIECE_LAST $GBROKER_PIECE_STEP"; '
            'printf "<%s>" "$@"; echo', "prog"]
    out = run_script(part, 1, show)
    assert "1 1 7 3\n<--x><$(echo pwned)>" in out  # the sweep's text is an argument, never run
    assert "10 10 10 3\n<--x><a b>" in run_script(part, 10, show)
    lines = "\n".join(array_lines(part))
    assert "set -- --x '$(echo pwned)'" in lines and shlex.quote("a b") in lines


def test_pieces_that_save_state_get_a_directory_each() -> None:
    out = run_script(ArrayPart(own_checkpoint=True), 4, ["bash", "-c", 'echo "ck=$GBROKER_CHECKPOINT_DIR"'])
    assert "ck=/tmp/gb-arrays-test-ck/piece-4" in out


def test_sbatch_gets_the_array_option() -> None:
    from broker.slurm.backend import SubmitRequest

    req = SubmitRequest(script="#!/bin/bash\n", partition="spot", job_name="gb-x-a1", comment="gb-x", account="v",
                        user=None, workdir="/tmp", nodes=1, gpus_per_node=1, time_limit_s=60, array="1-40%8")
    assert CliBackend().sbatch_argv(req)[-1] == "--array=1-40%8"
    with pytest.raises(SpecError):
        CliBackend().sbatch_argv(SubmitRequest(**{**req.__dict__, "array": "1-40 --wrap=x"}))


# -- the piece state machine -------------------------------------------------------------------------
def test_every_piece_state_has_a_row_and_final_ones_move_nowhere() -> None:
    assert set(PIECE_ALLOWED) == set(PieceState)
    for final in PIECE_FINAL:
        assert [s for s in PieceState if s != final and can_move_piece(final, s)] == []
    assert can_move_piece(PieceState.RUNNING, PieceState.PENDING)  # requeued after a reclaim
    assert can_move_piece(PieceState.RUNNING, PieceState.WAITING)  # waits for a retry batch


def test_a_done_piece_never_runs_again() -> None:
    p = ArrayPiece(job_id=1, idx=3, last=3, state=PieceState.DONE, batch=1, runs=1, failures=0, reclaims=0,
                   nodes="", reason="", updated_at=NOW)
    with pytest.raises(IllegalTransition):
        lifecycle.piece_seen(p, PieceState.RUNNING, NOW, nodes="spot1", started_at=NOW)


# -- an array on the fake Slurm ------------------------------------------------------------------------
@pytest.fixture
def world(db_url: str) -> World:
    return array_world(db_url)


def pieces(w: World, job_id: int) -> dict[int, ArrayPiece]:
    with w.svc.sessions() as s:
        return {p.idx: p for p in s.execute(select(ArrayPiece).where(ArrayPiece.job_id == job_id)).scalars()}


def test_admission_estimates_the_whole_array(world: World) -> None:
    one = submit_array(world, pieces="1")
    forty = submit_array(world, pieces="1-40")
    with world.svc.sessions() as s:
        from broker.db.models import Job

        e1, e40 = (s.get(Job, j["id"]).estimate_micros for j in (one, forty))  # type: ignore[union-attr]
    assert e1 > 0 and e40 == 40 * e1


def test_a_reclaim_reruns_only_its_piece_a_failure_is_retried_and_every_run_is_charged(world: World) -> None:
    w = world
    job = submit_array(w, pieces="1-4", max_retries=1)
    assert job["pieces"]["line"] == "0/4 done, 4 waiting" and w.slurm.calls["sbatch"] == 1
    (req,) = w.slurm.requests
    assert req.array == "1-4" and req.job_name.endswith("-a1") and ".piece-%a.out" in (req.output or "")
    w.tick()
    array_id = next(iter(w.slurm.arrays))
    job_id = job["id"]
    t = {i: w.slurm.task(array_id, i) for i in range(1, 5)}
    for i, node in ((1, "spot1"), (2, "spot2"), (3, "spot3")):
        w.slurm.start(t[i], node)
    w.advance(30)
    w.tick()
    shown = show_job(w.svc, ROOT, job_id)
    assert shown["state"] == "running" and shown["pieces"]["line"] == "0/4 done, 3 running, 1 pending"
    assert shown["array"]["by_state"] == {"running": "1-3", "pending": "4"}
    # spot2 is reclaimed: Slurm requeues task 2 (same Slurm id); piece 1 completes, piece 3 fails.
    w.slurm.reclaim(t[2])
    w.slurm.finish(t[1])
    w.slurm.finish(t[3], exit_code=1)
    w.advance(5)
    w.tick()
    p = pieces(w, job_id)
    assert (p[1].state, p[2].state, p[3].state, p[4].state) == ("done", "pending", "waiting", "pending")
    assert p[2].reclaims == 1 and p[2].runs == 1 and p[3].failures == 1 and p[3].batch == 2
    assert w.slurm.calls.get("start_now", 0) >= 1
    retry = [a for a in w.slurm.arrays if a != array_id]
    assert len(retry) == 1 and w.slurm.requests[-1].array == "3"
    t3 = w.slurm.task(retry[0], 3)
    # Everything else runs to the end; piece 1 never runs again.
    for jid, node in ((t[2], "spot4"), (t[4], "spot1"), (t3, "spot3")):
        w.slurm.start(jid, node)
    w.advance(20)
    w.tick()
    for jid in (t[2], t[4], t3):
        w.slurm.finish(jid)
    w.advance(1)
    w.tick()
    w.tick()
    done = show_job(w.svc, ROOT, job_id)
    assert done["state"] == "completed" and done["pieces"]["line"] == "4/4 done", done["reason"]
    states = sorted(a["state"] for a in done["attempts"])
    assert states == ["completed"] * 4 + ["failed", "reclaimed"]
    reclaimed = next(a for a in done["attempts"] if a["state"] == "reclaimed")
    assert reclaimed["lost_s"] == 30 and reclaimed["slurm_job_id"] == t[2]
    assert len(w.slurm.jobs_by_id[t[1]].runs) == 1  # the finished piece was not rerun
    # The ledger: one LedgerRun per task run, the reclaimed one lost, amounts add up to the runs.
    with w.svc.sessions() as s:
        runs = list(s.execute(select(LedgerRun).where(LedgerRun.job_id == job_id)).scalars())
        charges = list(s.execute(select(Charge).where(Charge.job_id == job_id)).scalars())
    assert sorted((r.slurm_job_id, r.run_index) for r in runs) == sorted(
        [(t[1], 0), (t[2], 0), (t[2], 1), (t[3], 0), (t[4], 0), (t3, 0)])
    assert sum(r.total_micros for r in runs) == sum(c.amount_micros for c in charges) > 0
    lost = [c for c in charges if c.tag == "lost"]
    assert {c.slurm_job_id for c in lost} == {t[2]} and sum(c.seconds for c in lost) == 30
    # 2 GPUs at $3.60 per GPU-hour: 2,000 micro-units a second; three runs of 30 s (done, reclaimed,
    # failed), three of 20 s (the reclaimed piece again, piece 4, the retry of piece 3).
    assert sorted(r.elapsed_s for r in runs) == [20, 20, 20, 30, 30, 30]
    assert sum(r.total_micros for r in runs) == 2 * 1000 * 150


def test_the_failed_pieces_are_reported_and_the_others_kept(world: World) -> None:
    w = world
    job = submit_array(w, pieces="1-3", max_retries=0)
    w.tick()
    array_id = next(iter(w.slurm.arrays))
    for i in (1, 2, 3):
        w.slurm.start(w.slurm.task(array_id, i))
    w.advance(10)
    w.tick()
    w.slurm.finish(w.slurm.task(array_id, 1))
    w.slurm.finish(w.slurm.task(array_id, 2), exit_code=3)
    w.slurm.finish(w.slurm.task(array_id, 3))
    w.tick()
    done = show_job(w.svc, ROOT, job["id"])
    assert done["state"] == "failed" and done["reason"] == "2/3 done, 1 failed; failed pieces: 2"
    failed = [p for p in done["array"]["pieces"] if p["state"] == "failed"]
    assert [(p["piece"], p["exit_code"], p["failures"]) for p in failed] == [(2, 3, 1)]
    assert "failed 1 times, last exit 3" in failed[0]["reason"] and failed[0]["log"].endswith(".piece-2.out")
    assert len(w.slurm.arrays) == 1  # no retries left: no second batch


def test_an_unchanged_array_costs_one_squeue_and_nothing_more(world: World) -> None:
    w = world
    job = submit_array(w, pieces="1-50")
    w.tick()
    w.tick()
    before = dict(w.slurm.calls)
    for _ in range(3):
        w.tick()
    assert w.slurm.calls.get("squeue", 0) - before.get("squeue", 0) == 3
    assert w.slurm.calls.get("sacct", 0) == before.get("sacct", 0)
    assert show_job(w.svc, ROOT, job["id"])["pieces"]["line"] == "0/50 done, 50 pending"


def test_cancelling_an_array_cancels_its_slurm_array_and_every_piece_left(world: World) -> None:
    w = world
    job = submit_array(w, pieces="1-3")
    w.tick()
    array_id = next(iter(w.slurm.arrays))
    w.slurm.start(w.slurm.task(array_id, 1))
    w.slurm.finish(w.slurm.task(array_id, 1))
    w.tick()
    cancel_jobs(w.svc, caller("alice"), [job["id"]])
    assert all(w.slurm.jobs_by_id[w.slurm.task(array_id, i)].done for i in (2, 3))
    p = pieces(w, job["id"])
    assert (p[1].state, p[2].state, p[3].state) == ("done", "cancelled", "cancelled")


def test_a_chain_waits_in_gbroker_and_is_cancelled_with_what_it_waits_for(world: World) -> None:
    w = world
    first = submit(w.svc, caller("alice"), {"name": "sim", "group": "vision", "time_limit": "5m",
                                            "command": ["true"], "workdir": "/tmp"})
    then = submit(w.svc, caller("alice"), {"name": "render", "group": "vision", "time_limit": "5m",
                                           "command": ["true"], "workdir": "/tmp", "after": [first["id"]]})
    assert then["slurm_job_id"] is None and then["note"] == f"waiting for job {first['id']} to complete"
    sbatches = w.slurm.calls["sbatch"]
    w.tick()
    w.tick()
    assert w.slurm.calls["sbatch"] == sbatches  # held in gbroker: never in Slurm while it waits
    w.slurm.start(first["slurm_job_id"])
    w.slurm.finish(first["slurm_job_id"])
    w.tick()
    w.tick()
    assert w.slurm.calls["sbatch"] == sbatches + 1
    assert show_job(w.svc, ROOT, then["id"])["attempts"][0]["slurm_job_id"] is not None
    # Someone else's job cannot be waited for.
    from broker.caller import Caller
    from broker.errors import NotFound

    bob = Caller(uid=caller().uid + 4242, gid=caller().gid, pid=1, name="bob", is_admin=False)
    with pytest.raises(NotFound, match=f"after: no job {first['id']} of yours"):
        submit(w.svc, bob, {"name": "x", "group": "vision", "time_limit": "5m", "command": ["true"],
                                      "workdir": "/tmp", "after": [first["id"]]})
    # A cancelled first link cancels the next, with the reason.
    a = submit(w.svc, caller("alice"), {"name": "a", "group": "vision", "time_limit": "5m", "command": ["true"],
                                        "workdir": "/tmp"})
    b = submit_array(w, pieces="1-2", after=[a["id"]])
    cancel_jobs(w.svc, caller("alice"), [a["id"]])
    w.tick()
    gone = show_job(w.svc, ROOT, b["id"])
    assert gone["state"] == "cancelled" and gone["reason"] == f"cancelled: job {a['id']} it waits for ended " \
        f"cancelled (cancelled by alice)"
    assert gone["pieces"]["line"] == "0/2 done, 2 cancelled"
    # A job that already ended other than completed cannot be waited for: refused, not stored.
    from broker.errors import SpecError

    with pytest.raises(SpecError, match=f"after: job {a['id']} already ended cancelled"):
        submit(w.svc, caller("alice"), {"name": "c", "group": "vision", "time_limit": "5m", "command": ["true"],
                                        "workdir": "/tmp", "after": [a["id"]]})


def test_the_policy_sends_a_piece_reclaimed_too_often_to_on_demand(world: World) -> None:
    """The simple policy moves a job to on-demand after max_spot_reclaims (2 here) reclaims; for an
    array it is asked about the pieces Slurm requeued, with their own reclaims."""
    w = world
    job = submit_array(w, pieces="1-2")
    w.tick()
    array_id = next(iter(w.slurm.arrays))
    t1, t2 = w.slurm.task(array_id, 1), w.slurm.task(array_id, 2)
    for n in (1, 2):
        w.slurm.start(t1, f"spot{n}")
        w.advance(10)
        w.tick()
        w.slurm.reclaim(t1)
        w.tick()
    assert w.slurm.jobs_by_id[t1].partition == "ondemand" and w.slurm.jobs_by_id[t2].partition == "spot"
    moved = [e for e in show_job(w.svc, ROOT, job["id"])["events"] if e["kind"] == "moved"]
    assert [e["message"] for e in moved] == ["pieces 1 requeued on ondemand (policy: reclaimed 2 times)"]
    for jid in (t1, t2):
        w.slurm.start(jid, "od1" if jid == t1 else "spot3")
    w.advance(10)
    for jid in (t1, t2):
        w.slurm.finish(jid)
    w.tick()
    w.tick()
    with w.svc.sessions() as s:
        runs = {(r.slurm_job_id, r.run_index): r for r in s.execute(
            select(LedgerRun).where(LedgerRun.job_id == job["id"])).scalars()}
    assert [runs[(t1, i)].partition for i in range(3)] == ["spot", "spot", "ondemand"]
    assert runs[(t1, 2)].total_micros == 2 * 2000 * 10 and runs[(t1, 0)].lost_s == 10


def test_an_array_submitted_before_a_crash_is_adopted_by_its_key_not_submitted_again(world: World) -> None:
    from ledger_fakes import Crash

    w = world
    w.crash.armed.add("after_sbatch")
    with pytest.raises(Crash):
        submit_array(w, pieces="1-3")
    assert w.slurm.calls["sbatch"] == 1
    w.restart()
    w.svc.backend = w.slurm
    w.tick()
    w.tick()
    assert w.slurm.calls["sbatch"] == 1 and len(w.slurm.arrays) == 1
    (job,) = [j for j in show_job(w.svc, ROOT, 1)["array"]["batches"]]
    assert job["slurm_array_id"] == next(iter(w.slurm.arrays))
    shown = show_job(w.svc, ROOT, 1)
    assert shown["pieces"]["line"] == "0/3 done, 3 pending"
    assert any(e["kind"] == "adopted" for e in shown["events"])


def test_an_array_is_adopted_by_its_key_even_when_another_users_array_of_that_name_is_listed_first(
        world: World) -> None:
    import dataclasses

    from ledger_fakes import Crash

    w = world
    w.crash.armed.add("after_sbatch")
    with pytest.raises(Crash):
        submit_array(w, pieces="1-3")
    (ours,) = w.slurm.arrays
    # bob submits an array under the same name (anyone may pass --job-name); squeue lists it first.
    planted = w.slurm.submit(dataclasses.replace(w.slurm.requests[0], user="bob"))
    first = {k: v for k, v in w.slurm.jobs_by_id.items() if w.slurm.task_of.get(k, (0,))[0] == planted}
    w.slurm.jobs_by_id = {**first, **{k: v for k, v in w.slurm.jobs_by_id.items() if k not in first}}
    w.restart()
    w.svc.backend = w.slurm
    w.tick()
    w.tick()
    assert w.slurm.calls["sbatch"] == 2, "submitted a second time"
    (batch,) = show_job(w.svc, ROOT, 1)["array"]["batches"]
    assert batch["slurm_array_id"] == ours


def test_an_array_stored_before_the_chunk_checks_is_read_back_as_it_was() -> None:
    from broker.spec import spec_from_dict

    base = {"name": "a", "group": "vision", "time_limit": "5m", "command": ["true"], "workdir": "/tmp"}
    for extra in ({"pieces": "1-10,15-24", "chunk": 4}, {"sweep": ["--x 1", "--x 2", "--x 3"], "chunk": 2}):
        assert spec_from_dict({**base, **extra}).chunk == extra["chunk"]
