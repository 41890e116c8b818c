"""Build the small C module through which the daemon submits batch jobs with libslurm.

``python -m broker.slurm.native_build`` compiles ``_slurm_native`` (a cffi
module) against this machine's Slurm headers (Debian: ``libslurm-dev``) and
its ``libslurmfull``, next to this file. It is optional: without it, or when
it was built for another Slurm release than the one running,
:mod:`broker.slurm.native` is not usable and the daemon submits with sbatch.

The job descriptor is declared by field name only (``...;``): the compiler
takes the real layout from ``slurm/slurm.h``, so nothing here depends on one
release's struct layout. Only fields that both 22.05 and later releases have
are named.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MODULE = "_slurm_native"

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
            "/usr/lib64/slurm", "/usr/lib/slurm")
"""Where distributions put ``libslurmfull.so`` (the library sbatch itself links)."""

CDEF = """
typedef struct {
    char *account; char *array_inx; char *comment; char *cpus_per_tres;
    char **environment; uint32_t env_size; char *features; uint32_t group_id;
    char *mem_per_tres; char *name; uint32_t num_tasks; uint8_t open_mode;
    char *partition; uint32_t priority; uint16_t requeue; char *script;
    uint32_t time_limit; char *tres_per_node; uint32_t user_id;
    uint16_t warn_flags; uint16_t warn_signal; uint16_t warn_time; char *work_dir;
    uint16_t cpus_per_task; uint32_t min_cpus; uint32_t min_nodes; uint32_t max_nodes;
    uint16_t ntasks_per_node; uint64_t pn_min_memory; char *std_out;
    ...;
} job_desc_msg_t;
typedef struct {
    uint32_t job_id; uint32_t error_code; char *job_submit_user_msg;
    ...;
} submit_response_msg_t;
void slurm_init(const char *conf);
void slurm_init_job_desc_msg(job_desc_msg_t *job_desc_msg);
int slurm_submit_batch_job(job_desc_msg_t *job_desc_msg, submit_response_msg_t **resp);
void slurm_free_submit_response_response_msg(submit_response_msg_t *msg);
int slurm_get_errno(void);
char *slurm_strerror(int errnum);
long slurm_api_version(void);
#define SLURM_VERSION_NUMBER ...
#define OPEN_MODE_APPEND ...
#define KILL_JOB_BATCH ...
static const char *const gbroker_libslurmfull;
"""


def find_lib_dir() -> str | None:
    for d in LIB_DIRS:
        if os.path.exists(os.path.join(d, "libslurmfull.so")):
            return d
    return None


def build(out_dir: Path, lib_dir: str, include_dir: str = "/usr/include") -> Path:
    """Compile the module into ``out_dir``; the path of the shared object."""
    from cffi import FFI  # only the build needs cffi's compiler side

    ffi = FFI()
    ffi.cdef(CDEF)
    lib_path = os.path.join(lib_dir, "libslurmfull.so")
    ffi.set_source(
        MODULE,
        "#include <slurm/slurm.h>\n#include <slurm/slurm_errno.h>\n"
        f"static const char *const gbroker_libslurmfull = {lib_path!r};\n".replace("'", '"'),
        libraries=["slurmfull"], library_dirs=[lib_dir], runtime_library_dirs=[lib_dir],
        include_dirs=[include_dir],
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return Path(ffi.compile(tmpdir=str(out_dir), verbose=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broker.slurm.native_build",
        description="Build the libslurm submission module against this machine's Slurm "
                    "(needs a C compiler and the Slurm headers, Debian: libslurm-dev).",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="where to put the module (default: next to this file)")
    parser.add_argument("--lib-dir", help="the directory holding libslurmfull.so (default: searched)")
    args = parser.parse_args(argv)
    lib_dir = args.lib_dir or find_lib_dir()
    if lib_dir is None:
        print("libslurmfull.so not found in " + ", ".join(LIB_DIRS) + "; install Slurm (Debian: slurm-client) "
              "or give --lib-dir", file=sys.stderr)
        return 2
    if not os.path.exists("/usr/include/slurm/slurm.h"):
        print("/usr/include/slurm/slurm.h not found; install the Slurm headers (Debian: libslurm-dev)",
              file=sys.stderr)
        return 2
    try:
        path = build(args.out, lib_dir)
    except Exception as exc:  # noqa: BLE001 - a compiler error is reported, not raised
        print(f"building {MODULE} failed: {exc}", file=sys.stderr)
        return 1
    for junk in args.out.glob(f"{MODULE}.[co]"):
        junk.unlink()
    print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
