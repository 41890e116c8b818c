"""CliBackend.start_submit with the real runner and a stand-in sbatch (a script that queues
"a job" only if it reads a script on stdin, as sbatch refuses an empty one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.errors import SlurmError
from broker.slurm.backend import SubmitRequest
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import Runner


@pytest.fixture
def backend(tmp_path: Path) -> tuple[CliBackend, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    queued = tmp_path / "queued"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"""#!/bin/sh
script=$(cat)
[ -n "$script" ] || {{ echo "sbatch: error: Batch script is empty!" >&2; exit 1; }}
printf '%s' "$script" > {queued}
echo 4242
""")
    os.chmod(sbatch, 0o755)
    return CliBackend(Runner(bin_dir=str(bin_dir))), queued


def request(**kw: object) -> SubmitRequest:
    fields: dict[str, object] = dict(script="#!/bin/sh\ntrue\n", partition="spot", job_name="gb-0123456789ab-1",
                                     comment="gb-0123456789ab", account="vision", user=None, workdir="/tmp",
                                     nodes=1, gpus_per_node=1, time_limit_s=600)
    fields.update(kw)
    return SubmitRequest(**fields)  # type: ignore[arg-type]


def test_the_started_sbatch_queues_the_script_it_is_given(backend: tuple[CliBackend, Path]) -> None:
    cli, queued = backend
    started = cli.start_submit(request(script="unused"))
    assert started is not None and started.argv == cli.sbatch_argv(request())
    assert not queued.exists()
    assert started.finish("#!/bin/sh\necho real\n") == 4242
    assert queued.read_text() == "#!/bin/sh\necho real"
    started.abort()  # after finish: nothing


def test_an_aborted_sbatch_queues_nothing(backend: tuple[CliBackend, Path]) -> None:
    cli, queued = backend
    started = cli.start_submit(request())
    assert started is not None
    started.abort()
    assert not queued.exists()


def test_an_empty_script_is_refused_as_sbatch_refuses_it(backend: tuple[CliBackend, Path]) -> None:
    cli, queued = backend
    started = cli.start_submit(request())
    assert started is not None
    with pytest.raises(SlurmError, match="empty"):
        started.finish("")
    assert not queued.exists()


def test_a_request_sbatch_would_refuse_is_not_started(backend: tuple[CliBackend, Path]) -> None:
    cli, _ = backend
    assert cli.start_submit(request(partition="spot\nod")) is None
