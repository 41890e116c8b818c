"""The demo's checks: each claim contrib/dev/demo prints, held against Slurm and gbroker.

    demo_check.py COMMAND ARGS...     (as root, with SLURM_CONF set; see --help)

Every command waits, for a bounded time, for the state it names, reading both
what Slurm says (sinfo, squeue) and what gbroker says (its node tick's view of
a pool in ``gbroker pools --json``, a job's attempts in ``gbroker show
--json``), and exits 1 with a message that says which claim is false, what
was expected and what was seen last. It prints the facts the demo then tells.

Taking a zone out (``zone-out``) drains only powered-down nodes. Slurm drops
the DRAIN flag of a cloud node when its suspend starts (the dev cluster runs
with SlurmctldParameters=idle_on_node_suspend; measured on 22.05 and 24.11):
a drain given while a power-down is pending (``idle!``, e.g. just after
POWER_DOWN_FORCE) is gone a few seconds later, and so is the drain of a
powered-up idle node once Slurm's power saving suspends it (SuspendTime).
A drain given to a powered-down node, or one already powering down, holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

GB = os.environ.get("DEMO_CLI", "/opt/gbroker/venv/bin/gbroker")
SETTLING = frozenset({"power_down", "powering_down", "power_up", "powering_up"})
"""Flags of a node whose power state is on its way somewhere (sinfo StateComplete, lower case)."""
T = TypeVar("T")


class ClaimFalse(Exception):
    """What the demo said did not happen."""


def run(argv: list[str]) -> str:
    """A command's stdout; a failing command is a failed check, with its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise ClaimFalse(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def wait_for(what: str, probe: Callable[[], tuple[T | None, object]], timeout: float) -> T:
    """Ask ``probe`` once a second until it returns a value; it also returns what it saw, for the message."""
    deadline = time.monotonic() + timeout
    while True:
        value, seen = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise ClaimFalse(f"{what}: not within {timeout:.0f}s; last seen: {seen}")
        time.sleep(1)


# --- what Slurm says ---------------------------------------------------------------------------

def node_states(names: Iterable[str]) -> dict[str, tuple[frozenset[str], str]]:
    """Node -> (its StateComplete words, lower case: base and flags; its reason)."""
    out = run(["sinfo", "-h", "-N", "-n", ",".join(names), "-O", "NodeList:0|,StateComplete:0|,Reason:0|"])
    states: dict[str, tuple[frozenset[str], str]] = {}
    for line in out.splitlines():
        name, state, reason, *_ = (line.split("|") + ["", "", ""])[:4]
        if name.strip():
            states[name.strip()] = (frozenset(state.strip().lower().split("+")), reason.strip())
    return states


def partition_nodes(partition: str) -> list[str]:
    return sorted(set(run(["sinfo", "-h", "-N", "-p", partition, "-O", "NodeList:0"]).split()))


def slurm_jobs_on(names: Iterable[str]) -> list[str]:
    return run(["squeue", "-h", "-w", ",".join(names), "-o", "%i"]).split()


def scontrol_state(names: Iterable[str], state: str, reason: str = "") -> None:
    argv = ["scontrol", "update", f"nodename={','.join(sorted(names))}", f"state={state}"]
    run(argv + ([f"reason={reason}"] if reason else []))


def show_states(states: dict[str, tuple[frozenset[str], str]]) -> str:
    return ", ".join(f"{n} {'+'.join(sorted(f))}" for n, (f, _) in sorted(states.items()))


# --- what gbroker says -------------------------------------------------------------------------

def job(job_id: int) -> dict[str, Any]:
    return dict(json.loads(run([GB, "show", str(job_id), "--json"])))


def pool_of(partition: str) -> dict[str, Any]:
    """gbroker's row for the pool on ``partition``: its node tick's census (free GPUs, spot available)."""
    for p in json.loads(run([GB, "pools", "--json"]))["pools"]:
        if p["partition"] == partition:
            return dict(p)
    raise ClaimFalse(f"gbroker pools lists no pool on partition {partition}")


def attempts(j: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["partition"], a["state"]) for a in j["attempts"]]


def wait_job(job_id: int, states: set[str], timeout: float) -> dict[str, Any]:
    def probe() -> tuple[dict[str, Any] | None, object]:
        j = job(job_id)
        return (j if j["state"] in states else None), f"state {j['state']}, attempts {attempts(j)}"

    return wait_for(f"job {job_id} {' or '.join(sorted(states))}", probe, timeout)


def wait_census(partition: str, field: str, want: int, timeout: float = 60) -> None:
    """gbroker's node tick has seen the pool so: ``field`` (spot_available, free_gpus) is ``want``."""
    def probe() -> tuple[bool | None, object]:
        row = pool_of(partition)
        return (True if row[field] == want else None), f"{row['name']} {field} {row[field]}"

    wait_for(f"gbroker's view of {partition}: {field} {want}", probe, timeout)


# --- the checks --------------------------------------------------------------------------------

def cmd_clean_slate(args: argparse.Namespace) -> str:
    """Start from what a finished run leaves: no job of the daemon's still active, no zone left out.

    An earlier run that was interrupted (Ctrl-C) leaves its jobs running and a zone
    drained; the steps after this one would then tell another story."""
    active = [int(j["id"]) for j in json.loads(run([GB, "status", "--all", "--json"]))]
    if active:
        run([GB, "cancel", *map(str, active)])
        for job_id in active:
            wait_job(job_id, {"cancelled", "completed", "failed", "timeout", "deadline_missed"}, 120)
    handed_back = []
    for partition in args.zones:
        names = partition_nodes(partition)
        out = [n for n, (f, _) in node_states(names).items() if f & {"drain", "down"}]
        if out:
            cmd_zone_back(argparse.Namespace(partition=partition))
            handed_back.append(partition)
    said = [f"cancelled {len(active)} jobs an earlier run left" if active else "",
            f"handed {', '.join(handed_back)} back to the cloud pool" if handed_back else ""]
    return "; ".join(x for x in said if x) or "nothing left by an earlier run"


def cmd_owned_first(args: argparse.Namespace) -> str:
    """The blockers run on the owned pool, and gbroker's census sees it full."""
    for jid in args.jobs:
        j = wait_job(jid, {"running"}, 90)
        if j["attempts"][-1]["partition"] != "owned":
            raise ClaimFalse(f"job {jid} runs on {j['attempts'][-1]['partition']}, not on the owned pool")
    wait_census("owned", "free_gpus", 0)
    return f"jobs {', '.join(map(str, args.jobs))} run on owned; gbroker sees the owned pool full"


def cmd_placed(args: argparse.Namespace) -> str:
    """Where gbroker placed the job (prints '<partition> <capacity>'), one of the allowed partitions."""
    j = job(args.job)
    if j["partition"] not in args.partition.split(","):
        raise ClaimFalse(f"job {args.job} was placed on {j['partition']}, not on {args.partition}: {j['reason']}")
    return f"{j['partition']} {j['capacity']}"


def cmd_running(args: argparse.Namespace) -> str:
    """The job runs (prints '<node> <partition>' of its attempt); with --attempts N, it is on its Nth."""
    def probe() -> tuple[dict[str, Any] | None, object]:
        j = job(args.job)
        ok = j["state"] == "running" and j["attempts"][-1]["nodes"]
        return (j if ok else None), f"state {j['state']}, attempts {attempts(j)}"

    j = wait_for(f"job {args.job} running", probe, args.timeout)
    if args.attempts and len(j["attempts"]) != args.attempts:
        raise ClaimFalse(f"job {args.job} is on attempt {len(j['attempts'])}, not {args.attempts}: {attempts(j)}")
    last = j["attempts"][-1]
    if args.partition and last["partition"] != args.partition:
        raise ClaimFalse(f"job {args.job} runs on {last['partition']}, not {args.partition}")
    return f"{last['nodes']} {last['partition']}"


def cmd_checkpoint(args: argparse.Namespace) -> str:
    """The program saved at least once (a ckpt-*.json in its checkpoint directory): work to resume from."""
    path = Path(args.dir)
    saved = wait_for(f"a checkpoint in {path}", lambda: (sorted(path.glob("ckpt-*.json")) or None, "none"), args.timeout)
    return saved[-1].name


def settle_down(names: list[str], timeout: float = 90) -> None:
    """Every node powered down, none on its way up or down: a drain given now holds.

    A powered-up idle node is powered down first (its drain would go when Slurm
    suspends it); a node with a job is refused (the zone is not ours to take)."""
    busy = slurm_jobs_on(names)
    if busy:
        raise ClaimFalse(f"{','.join(names)} run Slurm jobs {' '.join(busy)}: the zone is not idle")
    up = [n for n, (f, _) in node_states(names).items() if "powered_down" not in f and not f & SETTLING]
    if up:
        scontrol_state(up, "power_down")

    def probe() -> tuple[bool | None, object]:
        states = node_states(names)
        done = all("powered_down" in f and not f & SETTLING for f, _ in states.values())
        return (True if done else None), show_states(states)

    wait_for(f"{','.join(names)} powered down", probe, timeout)


def cmd_zone_out(args: argparse.Namespace) -> str:
    """Take a zone out (all its nodes but --keep) in a way that holds, and see gbroker's view say so."""
    names = [n for n in partition_nodes(args.partition) if n not in args.keep]
    settle_down(names)
    scontrol_state(names, "drain", args.reason)
    states = node_states(names)
    lost = [n for n, (f, _) in states.items() if "drain" not in f]
    if lost:
        raise ClaimFalse(f"the drain of {','.join(lost)} did not hold: {show_states(states)}")
    kept_usable = len([n for n in args.keep if n in partition_nodes(args.partition)])
    wait_census(args.partition, "spot_available", kept_usable)
    return f"{','.join(names)} drained ({show_states(states)}); gbroker sees {kept_usable} usable in {args.partition}"


def cmd_zone_held(args: argparse.Namespace) -> str:
    """The zone is still out: every node drained or down in Slurm, none usable in gbroker's view."""
    names = partition_nodes(args.partition)
    states = node_states(names)
    usable = [n for n, (f, _) in states.items() if not f & {"drain", "down"}]
    if usable:
        raise ClaimFalse(f"zone {args.partition} is not out: {show_states(states)}")
    row = pool_of(args.partition)
    if row["spot_available"] != 0:
        raise ClaimFalse(f"gbroker sees {row['spot_available']} usable nodes in {args.partition}: {show_states(states)}")
    return f"{args.partition}: {show_states(states)}"


def cmd_zone_back(args: argparse.Namespace) -> str:
    """Hand the zone back to the cloud pool; no job of ours is on it, so nothing is reclaimed by this."""
    names = partition_nodes(args.partition)
    busy = slurm_jobs_on(names)
    if busy:
        raise ClaimFalse(f"{','.join(names)} run Slurm jobs {' '.join(busy)}: powering them down would reclaim them")
    scontrol_state(names, "power_down_force")

    def probe() -> tuple[bool | None, object]:
        states = node_states(names)
        ok = all(not f & {"drain", "down"} for f, _ in states.values())
        return (True if ok else None), show_states(states)

    wait_for(f"{args.partition} back in service", probe, 60)
    wait_census(args.partition, "spot_available", len(names))
    return f"{args.partition} back: gbroker sees {len(names)} usable nodes"


def cmd_reclaimed(args: argparse.Namespace) -> str:
    """The job was reclaimed on --node (the demo's reclaim), resumed elsewhere from its checkpoint, completed."""
    j = wait_job(args.job, {"completed", "failed", "cancelled"}, args.timeout)
    runs = j["attempts"]
    first, last = runs[0], runs[-1]
    problems = []
    if j["state"] != "completed":
        problems.append(f"it ended {j['state']}")
    if (first["nodes"], first["state"]) != (args.node, "reclaimed") or j["reclaims"] != 1:
        problems.append(f"its first attempt was not the one reclaimed on {args.node}")
    if last["partition"] == first["partition"] or last["capacity"] != "spot":
        problems.append("it did not resume in the other zone")
    from_step = resumed_from(args.result)
    if from_step <= 0:
        problems.append(f"its last attempt started at step {from_step}, not from a checkpoint")
    if problems:
        raise ClaimFalse(f"job {args.job}: {'; '.join(problems)}: {runs_of(j)}")
    return f"reclaimed on {args.node}, resumed on {last['partition']} ({last['nodes']}) from step {from_step}"


def resumed_from(result: str) -> int:
    """The step the program's last attempt started from (examples/finetune.py's result file)."""
    try:
        return int(json.loads(Path(result).read_text())["attempts"][-1]["from_step"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ClaimFalse(f"{result}: no result to read ({exc})") from exc


def runs_of(j: dict[str, Any]) -> str:
    return ", ".join(f"{a['partition']} on {a['nodes'] or '-'} ({a['state']})" for a in j["attempts"])


def cmd_moved_back(args: argparse.Namespace) -> str:
    """On-demand first, then moved (not reclaimed) to spot, completed there from its checkpoint."""
    j = wait_job(args.job, {"completed", "failed", "cancelled"}, args.timeout)
    want = [(args.source, "moved"), (args.to, "completed")]
    said = [e["message"] for e in j["events"] if e["kind"] == "fallback"]
    if attempts(j) != want or j["reclaims"] != 0:
        raise ClaimFalse(f"job {args.job}: attempts {runs_of(j)}, {j['reclaims']} reclaims; expected {want}, none")
    if not any(f"requeued to {args.to}" in m for m in said):
        raise ClaimFalse(f"job {args.job}: no move to {args.to} among its fallback events: {said}")
    from_step = resumed_from(args.result)
    if from_step <= 0:
        raise ClaimFalse(f"job {args.job}: its run on {args.to} started at step {from_step}, not from a checkpoint")
    return f"{runs_of(j)}; resumed from step {from_step}; the daemon: {said[-1]}"


def cmd_ended(args: argparse.Namespace) -> str:
    j = wait_job(args.job, {args.state}, args.timeout)
    return f"job {args.job} {j['state']}"


def cmd_frames(args: argparse.Namespace) -> str:
    """The array completed with every frame written; prints the nodes its tasks ran on."""
    j = wait_job(args.job, {"completed", "failed", "cancelled"}, args.timeout)
    frames = len(list(Path(args.dir).glob("frame-*")))
    if j["state"] != "completed" or frames != args.count:
        raise ClaimFalse(f"render job {args.job} ended {j['state']} with {frames} frames written, not {args.count}")
    return " ".join(sorted({a["nodes"] for a in j["attempts"] if a["nodes"]}))


def cmd_dashboard(args: argparse.Namespace) -> str:
    """The jobs page (read on stdin) lists exactly the user's jobs, this run's among them; prints the count."""
    page = sys.stdin.read()
    shown = {int(x) for x in _job_links(page)}
    theirs = {int(j["id"]) for j in json.loads(run([GB, "history", "--json", "--limit", "10000", "-u", args.user]))}
    if shown != theirs or not set(args.jobs) <= shown:
        raise ClaimFalse(f"{args.user}'s jobs page lists {sorted(shown)}; her jobs are {sorted(theirs)}, "
                         f"this run's {args.jobs}")
    return str(len(shown))


def _job_links(page: str) -> list[str]:
    return re.findall(r'href="/jobs/([0-9]+)"', page)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], str], *spec: tuple[tuple[str, ...], dict[str, Any]]) -> None:
        p = sub.add_parser(name, help=(fn.__doc__ or "").split("\n")[0])
        for flags, kw in spec:
            p.add_argument(*flags, **kw)
        p.set_defaults(fn=fn)

    jid = (("job",), {"type": int})
    wait = (("--timeout",), {"type": float, "default": 300})
    add("clean-slate", cmd_clean_slate, (("zones",), {"nargs": "*"}))
    add("owned-first", cmd_owned_first, (("jobs",), {"type": int, "nargs": "+"}))
    add("placed", cmd_placed, jid, (("--partition",), {"required": True}))
    add("running", cmd_running, jid, wait, (("--attempts",), {"type": int, "default": 0}),
        (("--partition",), {"default": ""}))
    add("checkpoint", cmd_checkpoint, (("dir",), {}), wait)
    add("zone-out", cmd_zone_out, (("partition",), {}), (("--reason",), {"required": True}),
        (("--keep",), {"action": "append", "default": []}))
    add("zone-held", cmd_zone_held, (("partition",), {}))
    add("zone-back", cmd_zone_back, (("partition",), {}))
    add("reclaimed", cmd_reclaimed, jid, wait, (("--node",), {"required": True}), (("--result",), {"required": True}))
    add("moved-back", cmd_moved_back, jid, wait, (("--from",), {"dest": "source", "required": True}),
        (("--to",), {"required": True}), (("--result",), {"required": True}))
    add("ended", cmd_ended, jid, wait, (("--state",), {"required": True}))
    add("frames", cmd_frames, jid, wait, (("--dir",), {"required": True}), (("--count",), {"type": int, "default": 40}))
    add("dashboard", cmd_dashboard, (("--user",), {"required": True}), (("jobs",), {"type": int, "nargs": "+"}))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(args.fn(args))
    except ClaimFalse as exc:
        print(f"demo: claim false ({args.cmd}): {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
