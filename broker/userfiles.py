"""What the daemon learns from a user's files, learned as that user (principle 10).

The daemon runs as root and never opens, reads or follows a path a user
names. It needs one fact from a job's checkpoint directory: when the job last
saved, to bill the work a reclaim threw away and to know how much of a
running job is safe. That fact is learned by running find(1) *as the job's
owner*, which lists modification times and opens no file: a FIFO, a
directory the user may not read, a huge tree or a hung file system costs that
probe its deadline and nothing else. No lock or transaction is held while a
probe runs, and its output is bounded.

Creating a job's log and removing it again go through the same door
(:class:`UserFiles`), as the user.

What counts as "saved": the modification time of gbroker's manifest
(``gbroker-checkpoint.json``, rewritten at every save by the checkpoint
helper and the framework callbacks); without one, the newest file that looks
like a checkpoint (``*.ckpt``, ``*.pt``, ``*.safetensors``, HF's
``trainer_state.json``...), else the newest file that is not a log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from broker import joblog, proc
from broker.checkpoint import MANIFEST
from broker.errors import BrokerError, SpecError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""A probe that has not finished by then is killed; its answer is 'unknown'."""
PROBE_MAX_OUTPUT = 4 * 1024 * 1024
"""Bytes of listing read per probe (about 40,000 files); beyond that the answer is 'unknown'."""
MAX_DEPTH = 4
"""How deep below a checkpoint directory files are looked at (Lightning nests three levels)."""
REFRESH_S = 30.0
"""How old a running job's known save time may be before it is probed again."""
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors", ".bin", ".npz", ".npy", ".h5",
                       ".pkl", ".msgpack", ".distcp")
CHECKPOINT_NAMES = ("trainer_state.json",)
CHECKPOINT_PREFIXES = ("ckpt", "checkpoint")
LOG_SUFFIXES = (".out", ".err", ".log")
LOG_PREFIXES = ("events.out.tfevents",)


@dataclass(frozen=True)
class SaveFacts:
    """When a job's checkpoint directory shows its last save (epoch seconds)."""

    manifest_at: float | None = None
    """gbroker's manifest was last written."""
    checkpoint_at: float | None = None
    """The newest file that looks like a checkpoint."""
    other_at: float | None = None
    """The newest other file that is not a log."""

    @property
    def saved_at(self) -> float | None:
        for value in (self.manifest_at, self.checkpoint_at, self.other_at):
            if value is not None:
                return value
        return None


def _kind(relpath: str) -> str:
    name = relpath.rsplit("/", 1)[-1]
    low = name.lower()
    if relpath == MANIFEST:
        return "manifest"
    if low.endswith(CHECKPOINT_SUFFIXES) or low in CHECKPOINT_NAMES or low.startswith(CHECKPOINT_PREFIXES) \
            or "/checkpoint" in relpath.lower():
        return "checkpoint"
    if low.endswith(LOG_SUFFIXES) or low.startswith(LOG_PREFIXES) or low.startswith("."):
        return "log"
    return "other"


def parse_listing(raw: bytes, dirs: Iterable[str]) -> dict[str, SaveFacts]:
    """find's ``%T@ %d %H %P`` records (NUL-separated) -> facts per starting directory."""
    best: dict[str, dict[str, float]] = {d: {} for d in dirs}
    fields = raw.split(b"\0")
    for i in range(0, len(fields) - 3, 4):
        try:
            mtime = float(fields[i])
        except ValueError:
            continue
        start = fields[i + 2].decode("utf-8", "surrogateescape")
        rel = fields[i + 3].decode("utf-8", "surrogateescape")
        slot = best.get(start)
        if slot is None:
            continue
        kind = _kind(rel)
        if kind == "manifest" and fields[i + 1] != b"1":
            kind = "other"
        if kind != "log" and mtime > slot.get(kind, float("-inf")):
            slot[kind] = mtime
    return {
        d: SaveFacts(s.get("manifest"), s.get("checkpoint"), s.get("other")) for d, s in best.items()
    }


LOG_CREATE_TIMEOUT_S = 5.0
CHILD_ENV = {"PATH": proc.SAFE_PATH, "LC_ALL": "C"}


class UserFiles:
    """Everything the daemon does with users' files, done as the user, with deadlines.

    Tests swap in a fake (the way they swap in a recorded Slurm backend); the
    real one runs coreutils programs as the owner through ``broker.proc``.
    """

    def create_log(self, owner: str, workdir: str, name: str) -> str:
        """Create a job log as ``owner`` under a name nobody could have guessed; its path.

        mktemp(1) creates the file with O_EXCL (never through a symlink or over
        a file someone planted), mode 0600. Raises SpecError when the owner may
        not create it there.
        """
        template = joblog.mktemp_template(workdir, name)
        result = proc.run(["mktemp", f"--suffix={joblog.SUFFIX}", "--", template], env=CHILD_ENV,
                          timeout_s=LOG_CREATE_TIMEOUT_S, user=proc.identity(owner), max_output=8192)
        path = result.out.strip()
        if result.returncode != 0 or not path.startswith("/"):
            why = "timed out" if result.timed_out else (result.err.strip().rsplit(": ", 1)[-1] or "failed")
            raise SpecError(
                f"workdir {workdir}: cannot create the job's log there as {owner} ({why})",
                hint="submit from a directory of yours, or set workdir to one you can write",
            )
        return path

    def remove(self, owner: str, path: str) -> None:
        """Remove a file this daemon created for ``owner``, as ``owner``; best effort."""
        try:
            proc.run(["rm", "-f", "--", path], env=CHILD_ENV, timeout_s=LOG_CREATE_TIMEOUT_S,
                     user=proc.identity(owner))
        except BrokerError as exc:
            log.warning("could not remove %s: %s", path, exc.message)

    def probe(self, owner: str, dirs: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, SaveFacts] | None:
        """Facts for each of ``owner``'s directories, or None when the probe could not finish.

        A directory that does not exist (or the owner may not list) gives empty
        facts: nothing is known to be saved there.
        """
        wanted = sorted({d for d in dirs if d.startswith("/")})
        if not wanted:
            return {}
        argv = ["find", "-H", *wanted, "-maxdepth", str(MAX_DEPTH), "-type", "f",
                "-printf", r"%T@\0%d\0%H\0%P\0"]
        try:
            result = proc.run(argv, env=CHILD_ENV, timeout_s=timeout_s, user=proc.identity(owner),
                              max_output=PROBE_MAX_OUTPUT)
        except BrokerError as exc:
            log.warning("checkpoint probe as %s failed: %s", owner, exc.message)
            return None
        if result.timed_out or result.truncated:
            log.info("checkpoint probe as %s %s", owner,
                     "timed out" if result.timed_out else "listed too many files")
            return None
        return parse_listing(result.stdout, wanted)

    def probe_many(self, requests: Mapping[str, list[str]],
                   timeout_s: float = PROBE_TIMEOUT_S) -> dict[tuple[str, str], SaveFacts]:
        """One probe per owner, all at once; (owner, dir) -> facts for those that answered in time."""
        out: dict[tuple[str, str], SaveFacts] = {}
        if not requests:
            return out
        pool = ThreadPoolExecutor(max_workers=min(8, len(requests)), thread_name_prefix="gbroker-probe")
        try:
            futures = {owner: pool.submit(self.probe, owner, dirs, timeout_s) for owner, dirs in requests.items()}
            # Each probe ends by its deadline, or its child is left to a reaper (proc.REAP_WAIT_S);
            # past both, and the queue ahead of it, an owner's answer is not waited for.
            rounds = -(-len(requests) // min(8, len(requests)))
            done, late = wait(futures.values(), timeout=rounds * (timeout_s + proc.REAP_WAIT_S) + 1.0)
            for owner, fut in futures.items():
                if fut in late:
                    log.warning("checkpoint probe as %s did not answer in time; its saves are not known this time",
                                owner)
                    continue
                for d, f in (fut.result() or {}).items():
                    out[(owner, d)] = f
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return out


class SaveWatcher:
    """The last known save time of running jobs, refreshed in the background.

    The reconcile tick asks ``latest`` and never waits: a stale or missing
    answer starts a probe in this object's own thread, whose result the next
    tick sees. One probe per owner at a time, so a hostile directory delays
    only its owner's answers.
    """

    def __init__(self, files: UserFiles, refresh_s: float = REFRESH_S, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.files = files
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._known: dict[tuple[str, str], tuple[float, SaveFacts | None]] = {}
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gbroker-saves")

    def latest(self, owner: str, directory: str) -> SaveFacts | None:
        """What is known now (maybe nothing); asks for a fresher answer when due."""
        key = (owner, directory)
        with self._lock:
            seen = self._known.get(key)
            due = seen is None or time.monotonic() - seen[0] >= self.refresh_s
            if due and owner not in self._busy:
                self._busy.add(owner)
                wanted = sorted({d for (o, d) in self._known if o == owner} | {directory})
                self._pool.submit(self._refresh, owner, wanted)
        return seen[1] if seen else None

    def remember(self, owner: str, facts: Mapping[str, SaveFacts]) -> None:
        now = time.monotonic()
        with self._lock:
            for d, f in facts.items():
                self._known[(owner, d)] = (now, f)

    def forget(self, owner: str, directory: str) -> None:
        with self._lock:
            self._known.pop((owner, directory), None)

    def _refresh(self, owner: str, dirs: list[str]) -> None:
        try:
            facts = self.files.probe(owner, dirs, self.timeout_s)
            if facts is not None:
                self.remember(owner, facts)
        finally:
            with self._lock:
                self._busy.discard(owner)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
