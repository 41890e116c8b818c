"""The sbatch command line for a job's resources: GPU type, CPUs and memory."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from broker.errors import SpecError
from broker.slurm.backend import SubmitRequest
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import CallCounter, CompletedRun


class FakeRunner:
    def __init__(self) -> None:
        self.counter = CallCounter()
        self.calls: list[list[str]] = []

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None, cwd=None):  # type: ignore[no-untyped-def]
        self.counter.record(argv)
        self.calls.append(argv)
        return CompletedRun(argv, "42\n", "", 0, 0.001)


def request(**kw: object) -> SubmitRequest:
    base: Mapping[str, object] = {
        "script": "#!/bin/bash\ntrue\n", "partition": "spot", "job_name": "gb-j1-1", "comment": "gb-j1",
        "account": "vision", "user": "alice", "workdir": "/home/alice/w", "nodes": 1, "gpus_per_node": 2,
        "time_limit_s": 600,
    }  # fmt: skip
    return SubmitRequest(**{**base, **kw})  # type: ignore[arg-type]


def argv(**kw: object) -> list[str]:
    return CliBackend(FakeRunner(), environ={}).sbatch_argv(request(**kw))


def resource_options(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith(("--gres", "--cpus-per", "--mem"))]


def test_without_resources_the_command_line_is_as_before() -> None:
    assert resource_options(argv()) == ["--gres=gpu:2"]


@pytest.mark.parametrize("kw,expected", [
    ({"gres_type": "a100"}, ["--gres=gpu:a100:2"]),
    ({"gres_type": "h100-80gb"}, ["--gres=gpu:h100-80gb:2"]),
    ({"cpus_per_gpu": 8}, ["--gres=gpu:2", "--cpus-per-gpu=8"]),
    ({"cpus_per_task": 3}, ["--gres=gpu:2", "--cpus-per-task=3"]),
    ({"mem_mb": 1024}, ["--gres=gpu:2", "--mem=1024M"]),
    ({"mem_per_gpu_mb": 512}, ["--gres=gpu:2", "--mem-per-gpu=512M"]),
    ({"gres_type": "l40s", "cpus_per_gpu": 4, "mem_per_gpu_mb": 40960},
     ["--gres=gpu:l40s:2", "--cpus-per-gpu=4", "--mem-per-gpu=40960M"]),
    ({"gpus_per_node": 0, "cpus_per_task": 2, "mem_mb": 100}, ["--cpus-per-task=2", "--mem=100M"]),
])
def test_resources_become_sbatch_options(kw: dict[str, object], expected: list[str]) -> None:
    assert resource_options(argv(**kw)) == expected


def test_submit_runs_that_command_line() -> None:
    fake = FakeRunner()
    assert CliBackend(fake, environ={}).submit(request(gres_type="a100", mem_mb=2048)) == 42
    assert "--gres=gpu:a100:2" in fake.calls[0] and "--mem=2048M" in fake.calls[0]


@pytest.mark.parametrize("kw,fragment", [
    ({"gres_type": "a100\n#SBATCH -p x"}, "gres type"),
    ({"gres_type": "a100;id"}, "gres type"),
    ({"gres_type": "-a"}, "gres type"),
    ({"gres_type": ""}, "gres type"),
    ({"gres_type": "4"}, "gres type"),
    ({"gres_type": "a100", "gpus_per_node": 0}, "at least one GPU"),
    ({"cpus_per_gpu": 0}, "--cpus-per-gpu"),
    ({"cpus_per_task": -1}, "--cpus-per-task"),
    ({"mem_mb": 0}, "--mem"),
    ({"mem_per_gpu_mb": True}, "--mem-per-gpu"),
    ({"mem_mb": 1024, "mem_per_gpu_mb": 512}, "not both"),
    ({"cpus_per_gpu": 1, "cpus_per_task": 1}, "not both"),
])
def test_impossible_resources_never_reach_sbatch(kw: dict[str, object], fragment: str) -> None:
    fake = FakeRunner()
    with pytest.raises(SpecError, match=fragment):
        CliBackend(fake, environ={}).submit(request(**kw))
    assert fake.calls == []
