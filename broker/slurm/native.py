"""Batch submission through libslurm, in the daemon's process: no sbatch per job.

sbatch is a process per submission (the daemon starts it as the user); its
start-up costs several times what the submission RPC itself does. Here the
daemon, which runs as root (or as SlurmUser), sends the same job descriptor
itself, with ``user_id``/``group_id`` set to the submitting user's: slurmctld
accepts a job for another user only from root or SlurmUser, and the job then
belongs to and runs as that user, exactly as one the user submitted.

The daemon still touches no path the user named: the working directory and
the output path are strings in the descriptor, opened by slurmd as the user
when the job starts; the script is sent as text.

What sbatch would add of its own is added here too (the ``SLURM_SUBMIT_*``
variables, the user's HOME/USER/LOGNAME, ...); ``tests/integration/
test_native_submit.py`` submits the same requests both ways on the dev
cluster and compares what Slurm stored and the environment the job saw.

:func:`load` gives None when the module is not built (``python -m
broker.slurm.native_build``), was built for another Slurm release, or this
process already initialised libslurm for another cluster; the backend then
submits with sbatch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import re
import signal
import socket
import threading
from typing import Any

from broker import proc
from broker.errors import SlurmError, SlurmUnavailable
from broker.slurm.backend import SubmitRequest, time_limit_minutes
from broker.slurm.runner import is_unavailable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_initialised_conf: list[str | None] = []  # the SLURM_CONF libslurm was initialised with, once per process


def _version(number: int) -> tuple[int, int]:
    return (number >> 16) & 0xFF, (number >> 8) & 0xFF


def _module() -> tuple[Any, Any] | None:
    """The compiled module's ``ffi`` and ``lib``, or None when it is not built (or cannot load here)."""
    try:
        from broker.slurm._slurm_native import ffi, lib  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:  # not built here, or built against a libslurmfull this machine lacks
        log.debug("libslurm submission not available: %s", exc)
        return None
    return ffi, lib


def built_for() -> tuple[int, int] | None:
    """The Slurm release (major, minor) the module was built for, or None when it is not built."""
    module = _module()
    return None if module is None else _version(int(module[1].SLURM_VERSION_NUMBER))


def load(conf: str | None, sinfo_version: str) -> Native | None:
    """The submitter for the cluster ``conf`` (a slurm.conf path, None for the default), or None.

    ``sinfo_version``: what the cluster's ``sinfo --version`` printed; the module
    must have been built for that release (and links that release's library)."""
    module = _module()
    if module is None:
        return None
    ffi, lib = module
    built = _version(int(lib.SLURM_VERSION_NUMBER))
    m = re.search(r"(\d+)\.(\d+)", sinfo_version)
    cluster = (int(m.group(1)), int(m.group(2))) if m else None
    # sinfo links the same libslurmfull the module does, so this is the library's release too
    # (another release's cluster names its own commands, which then disagree).
    if cluster != built:
        log.info("libslurm submission off: built for Slurm %d.%02d, the cluster's commands say %s (rebuild "
                 "with python -m broker.slurm.native_build)", *built, sinfo_version.strip() or "nothing")
        return None
    with _lock:
        if not _initialised_conf:
            # Slurm's plugins resolve symbols from libslurmfull, so it must be global.
            ctypes.CDLL(ffi.string(lib.gbroker_libslurmfull).decode(), mode=os.RTLD_GLOBAL)
            lib.slurm_init(ffi.NULL if conf is None else conf.encode())
            _initialised_conf.append(conf)
        elif _initialised_conf[0] != conf:
            log.info("libslurm submission off for %s: this process uses it for %s", conf, _initialised_conf[0])
            return None
    return Native(ffi, lib, built)


class Native:
    """``submit`` a validated request; thread-safe (cffi releases the GIL during the RPC)."""

    def __init__(self, ffi: Any, lib: Any, version: tuple[int, int]) -> None:
        self.ffi, self.lib, self.version = ffi, lib, version
        # 23.02 renamed TRES requests from "gres:gpu" to "gres/gpu".
        self._gpu_tres = "gres:gpu" if version < (23, 2) else "gres/gpu"
        self._host = socket.gethostname()

    def submit(self, req: SubmitRequest, env: dict[str, str], argv: list[str]) -> int:
        """Queue ``req`` as ``req.user`` (or this process's user) with ``env`` as the job's
        environment; the job id. ``argv`` is the equivalent sbatch command, for messages."""
        ffi, lib = self.ffi, self.lib
        if req.user is not None:
            # NotFound, with a hint, for an account that is gone; Slurm finds the job's groups itself.
            pw = proc.passwd_entry(req.user)
        else:
            pw = pwd.getpwuid(os.getuid())
        uid, gid, name, home = pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir
        keep: list[Any] = []  # the C strings, alive until the call returns

        def c(text: str) -> Any:
            buf = ffi.new("char[]", text.encode())
            keep.append(buf)
            return buf

        d = ffi.new("job_desc_msg_t *")
        lib.slurm_init_job_desc_msg(d)
        d.user_id, d.group_id = uid, gid
        d.script = c(req.script)
        d.name, d.partition, d.comment, d.work_dir = c(req.job_name), c(req.partition), c(req.comment), c(req.workdir)
        d.min_nodes = d.max_nodes = req.nodes
        d.ntasks_per_node = req.ntasks_per_node
        d.num_tasks = req.nodes * req.ntasks_per_node
        d.time_limit = time_limit_minutes(req.time_limit_s)
        d.requeue = 1 if req.requeue else 0
        d.open_mode = lib.OPEN_MODE_APPEND
        if req.account:
            d.account = c(req.account)
        if req.gpus_per_node > 0:
            typed = f"{req.gres_type}:" if req.gres_type else ""
            d.tres_per_node = c(f"{self._gpu_tres}:{typed}{req.gpus_per_node}")
        if req.cpus_per_gpu is not None:
            d.cpus_per_tres = c(f"{self._gpu_tres}:{req.cpus_per_gpu}")
        if req.mem_per_gpu_mb is not None:
            d.mem_per_tres = c(f"{self._gpu_tres}:{req.mem_per_gpu_mb}")
        if req.cpus_per_task is not None:
            d.cpus_per_task = req.cpus_per_task
            d.min_cpus = d.num_tasks * req.cpus_per_task  # as sbatch does
        if req.mem_mb is not None:
            d.pn_min_memory = req.mem_mb
        if req.output:
            d.std_out = c(req.output)
        if req.hold:
            d.priority = 0
        if req.constraint:
            d.features = c(req.constraint)
        if req.signal:
            d.warn_signal, d.warn_time, d.warn_flags = self._signal(req.signal, argv)
        if req.array is not None:
            d.array_inx = c(req.array)
        job_env = {
            **env,
            "HOME": home, "USER": name, "LOGNAME": name,
            # What sbatch sets of its own for the job:
            "SLURM_JOB_NAME": req.job_name, "SLURM_NTASKS_PER_NODE": str(req.ntasks_per_node),
            "SLURM_OPEN_MODE": "a", "SLURM_PRIO_PROCESS": str(os.getpriority(os.PRIO_PROCESS, 0)),
            "SLURM_SUBMIT_DIR": req.workdir, "SLURM_SUBMIT_HOST": self._host,
        }
        entries = [c(f"{k}={v}") for k, v in job_env.items()]
        env_array = ffi.new("char *[]", [*entries, ffi.NULL])
        d.environment, d.env_size = env_array, len(entries)

        resp = ffi.new("submit_response_msg_t **")
        rc = lib.slurm_submit_batch_job(d, resp)
        if rc != 0:
            errno = lib.slurm_get_errno()
            text = ffi.string(lib.slurm_strerror(errno)).decode(errors="replace")
            stderr = f"libslurm: error: Batch job submission failed: {text} (Slurm error {errno})\n"
            if is_unavailable(text):
                raise SlurmUnavailable(f"Slurm did not answer the submission: {text}", argv=argv, stderr=stderr)
            raise SlurmError(f"Slurm refused the submission: {text}", argv=argv, returncode=1, stderr=stderr)  # sbatch's 1
        try:
            job_id = int(resp[0].job_id)
            if resp[0].job_submit_user_msg != ffi.NULL:
                log.info("job %s: %s", job_id, ffi.string(resp[0].job_submit_user_msg).decode(errors="replace"))
        finally:
            lib.slurm_free_submit_response_response_msg(resp[0])
        return job_id

    def _signal(self, spec: str, argv: list[str]) -> tuple[int, int, int]:
        """``[B:|R:]SIG[@seconds]`` (sbatch's --signal) as warn_signal, warn_time, warn_flags."""
        flags = 0
        head, _, lead = spec.partition("@")
        where, colon, name = head.rpartition(":")
        if colon and where == "B":
            flags = int(self.lib.KILL_JOB_BATCH)
        elif colon:
            raise SlurmError(f"signal {spec!r}: only the B: form is used by gbroker", argv=argv)
        try:
            number = int(name) if name.isdigit() else int(signal.Signals["SIG" + name.removeprefix("SIG")])
            seconds = int(lead) if lead else 60
        except (KeyError, ValueError):
            raise SlurmError(f"not a signal specification: {spec!r}", argv=argv) from None
        return number, seconds, flags
