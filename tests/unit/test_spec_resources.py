"""What a job asks of a node (GPU type and memory, CPUs, memory) and the #SBATCH lines that set it.

Every #SBATCH line is either read into a job field or refused by name, with its
line number and what to write instead; a line that disagrees with the job file
or the flags is refused naming both.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker import sbatch_lines
from broker.errors import SpecError
from broker.pools import GpuRequest, Pool, fits
from broker.spec import JobSpec, SpecProblems, parse_spec, spec_from_dict, spec_to_dict

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)


def job(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"group": "vision", "time_limit": "2h", "command": ["python", "train.py"]}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def with_script(*lines: str, **changes: Any) -> dict[str, Any]:
    text = "#!/bin/bash\n" + "".join(f"{ln}\n" for ln in lines) + "srun python train.py\n"
    return job(command=None, script=text, **changes)


def parse(data: dict[str, Any]) -> JobSpec:
    return parse_spec(data, now=NOW)


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse(data)
    return str(info.value)


# --------------------------------------------------------------------------- the job file's fields


def test_a_job_that_asks_for_nothing_has_no_resource_fields() -> None:
    spec = parse(job())
    assert (spec.gpu_types, spec.gpu_mem_gb, spec.cpus_per_gpu, spec.cpus_per_task, spec.mem_mb,
            spec.mem_per_gpu_mb) == ((), None, None, None, None, None)
    assert spec.gpu_request() == GpuRequest(gpus_per_node=1, nodes=1)


def test_every_resource_field_is_read() -> None:
    spec = parse(job(gpu=["a100", "h100"], gpu_mem_gb=40, cpus_per_gpu=8, mem_per_gpu="32G", gpus_per_node=4,
                     nodes=2, interruptible=False))
    assert spec.gpu_types == ("a100", "h100")
    assert (spec.gpu_mem_gb, spec.cpus_per_gpu, spec.mem_per_gpu_mb, spec.mem_mb) == (40, 8, 32 * 1024, None)
    assert spec.gpu_request() == GpuRequest(gpus_per_node=4, nodes=2, gpu_types=("a100", "h100"), gpu_mem_gb=40,
                                            cpus_per_node=32, mem_per_node_mb=4 * 32 * 1024, interruptible=False)


def test_one_gpu_type_as_a_string_and_per_node_memory_and_cpus_per_task() -> None:
    spec = parse(job(gpu="a100", mem="64G", cpus_per_task=6, tasks_per_node="gpu", gpus_per_node=2))
    assert spec.gpu_types == ("a100",)
    assert spec.gpu_request().cpus_per_node == 12  # 6 per task, one task per GPU
    assert spec.gpu_request().mem_per_node_mb == 64 * 1024


def test_the_request_fits_pools_by_type_and_memory() -> None:
    req = parse(job(gpu=["a100", "h100"], gpu_mem_gb=80)).gpu_request()
    assert fits(Pool("a", "p", "spot", gpu_type="a100", gpu_mem_gb=80), req) is None
    assert "l40s" in (fits(Pool("l", "p", "spot", gpu_type="l40s", gpu_mem_gb=48), req) or "")
    assert "40 GB" in (fits(Pool("s", "p", "spot", gpu_type="a100", gpu_mem_gb=40), req) or "")
    # A type in any spelling: sbatch gets the pool's own (gres_type_for).
    assert fits(Pool("a", "p", "spot", gpu_type="a100", gpu_mem_gb=80), parse(job(gpu="A100")).gpu_request()) is None
    assert fits(Pool("a", "p", "spot", gpu_type="A100"), parse(job(gpu="a100")).gpu_request()) is None


@pytest.mark.parametrize("written,mb", [
    ("32G", 32768), ("32g", 32768), ("32GB", 32768), ("512M", 512), ("2048", 2048), (2048, 2048), ("1T", 1048576),
    ("512K", 1), ("1025K", 2), (" 4G ", 4096),
])
def test_sizes_are_read_as_sbatch_reads_them(written: str | int, mb: int) -> None:
    assert parse(job(mem=written)).mem_mb == mb
    assert parse(job(mem_per_gpu=written)).mem_per_gpu_mb == mb


BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    ("gpu type newline", job(gpu="a100\nh100"), ["gpu", "'\\n'", "letters, digits"]),
    ("gpu type shell", job(gpu="a100;rm -rf ~"), ["gpu", "';'"]),
    ("gpu type subshell", job(gpu=["a100", "$(id)"]), ["gpu[1]", "'$'"]),
    ("gpu type colon", job(gpu="a100:2"), ["gpu", "':'"]),
    ("gpu type comma", job(gpu="a100,h100"), ["gpu", "','"]),
    ("gpu type space", job(gpu="a 100"), ["gpu", "' '"]),
    ("gpu type digits", job(gpu="2"), ["gpu", "only digits"]),
    ("gpu type leading dash", job(gpu="-x"), ["gpu", "starts with '-'"]),
    ("gpu type empty", job(gpu=""), ["gpu", "empty"]),
    ("gpu type too long", job(gpu="a" * 65), ["gpu", "longer than 64"]),
    ("gpu type duplicate", job(gpu=["a100", "h100", "a100"]), ["gpu", "'a100' twice"]),
    ("gpu type duplicate case", job(gpu=["a100", "A100"]), ["gpu", "twice"]),
    ("gpu empty list", job(gpu=[]), ["gpu", "leave gpu out for any type"]),
    ("gpu number", job(gpu=100), ["gpu", "a whole number"]),
    ("gpu list of numbers", job(gpu=[100]), ["gpu[0]"]),
    ("gpu too many", job(gpu=[f"t{i}" for i in range(17)]), ["gpu", "more than 16"]),
    ("gpu_mem_gb zero", job(gpu_mem_gb=0), ["gpu_mem_gb", "at least 1"]),
    ("gpu_mem_gb negative", job(gpu_mem_gb=-40), ["gpu_mem_gb", "at least 1"]),
    ("gpu_mem_gb absurd", job(gpu_mem_gb=4096), ["gpu_mem_gb", "at most 1024"]),
    ("gpu_mem_gb string", job(gpu_mem_gb="40G"), ["gpu_mem_gb", "whole number"]),
    ("gpu_mem_gb float", job(gpu_mem_gb=40.0), ["gpu_mem_gb", "whole number"]),
    ("cpus_per_gpu zero", job(cpus_per_gpu=0), ["cpus_per_gpu", "at least 1"]),
    ("cpus_per_gpu bool", job(cpus_per_gpu=True), ["cpus_per_gpu", "whole number"]),
    ("cpus_per_gpu absurd", job(cpus_per_gpu=5000), ["cpus_per_gpu", "at most 1024"]),
    ("cpus_per_gpu x gpus absurd", job(cpus_per_gpu=200, gpus_per_node=8), ["cpus_per_gpu", "1600 CPUs", "1024"]),
    ("cpus_per_task negative", job(cpus_per_task=-1), ["cpus_per_task", "at least 1"]),
    ("cpus_per_task x tasks absurd", job(cpus_per_task=100, tasks_per_node=16), ["cpus_per_task", "1600 CPUs"]),
    ("cpus both ways", job(cpus_per_gpu=4, cpus_per_task=4), ["cpus_per_gpu/cpus_per_task", "not both"]),
    ("mem both ways", job(mem="64G", mem_per_gpu="16G"), ["mem_per_gpu/mem", "not both"]),
    ("mem zero", job(mem="0"), ["mem", "more than zero", "all of a node's memory"]),
    ("mem zero int", job(mem=0), ["mem", "more than zero"]),
    ("mem negative", job(mem="-1G"), ["mem", "not a size"]),
    ("mem decimal", job(mem="1.5G"), ["mem", "1536M"]),
    ("mem unit", job(mem="12X"), ["mem", "not a size"]),
    ("mem bytes", job(mem="512B"), ["mem", "not a size"]),
    ("mem absurd", job(mem="17T"), ["mem", "16 TiB"]),
    ("mem huge digits", job(mem="9" * 40), ["mem", "not a size"]),
    ("mem bool", job(mem=True), ["mem", "size"]),
    ("mem list", job(mem=["1G"]), ["mem", "size"]),
    ("mem_per_gpu newline", job(mem_per_gpu="1G\n#SBATCH -p x"), ["mem_per_gpu", "not a size"]),
    ("mem_per_gpu x gpus absurd", job(mem_per_gpu="4T", gpus_per_node=8), ["mem_per_gpu", "16 TiB per node"]),
]


@pytest.mark.parametrize("data,fragments", [pytest.param(d, f, id=i) for i, d, f in BAD])
def test_impossible_resources_are_refused_naming_the_field(data: dict[str, Any], fragments: list[str]) -> None:
    text = refusal(data)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def test_new_fields_survive_the_wire_and_the_store() -> None:
    spec = parse(job(gpu=["h100", "a100"], gpu_mem_gb=80, cpus_per_gpu=4, mem_per_gpu="40G", gpus_per_node=2))
    wire = json.loads(json.dumps(spec_to_dict(spec)))
    assert wire["gpu"] == ["h100", "a100"] and wire["mem_per_gpu"] == "40960M"
    assert spec_from_dict(wire, now=NOW) == spec == spec_from_dict(wire)
    spec = parse(job(mem="1T", cpus_per_task=2))
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))), now=NOW) == spec


def test_a_spec_stored_before_these_fields_still_loads() -> None:
    stored = {"name": "old", "kind": "other", "group": "vision", "gpus_per_node": 1, "nodes": 1,
              "time_limit": "3600s", "interruptible": True, "checkpoint": {"style": "none"}, "env": {},
              "max_retries": 2, "signal_lead_s": 120,
              # Admitted when #SBATCH lines were not read: it ran with 1 GPU, whatever the lines said.
              "script": {"text": "#!/bin/bash\n#SBATCH --gres=gpu:4\n#SBATCH --mail-user=a@b\nhostname\n"}}
    spec = spec_from_dict(stored)
    assert (spec.gpus_per_node, spec.gpu_types, spec.mem_mb, spec.cpus_per_gpu) == (1, (), None, None)
    # At submit time (with now) the same lines are read, and refused.
    with pytest.raises(SpecError, match="--mail-user"):
        spec_from_dict(stored, now=NOW)


# --------------------------------------------------------------------------- #SBATCH lines read


@pytest.mark.parametrize("line,field,value", [
    ("#SBATCH --gres=gpu:2", "gpus_per_node", 2),
    ("#SBATCH --gres gpu:2", "gpus_per_node", 2),
    ("#SBATCH --gres=gpu", "gpus_per_node", 1),
    ("#SBATCH --gres=gpu:a100", "gpu_types", ("a100",)),
    ("#SBATCH --gres=gpu:a100:3", "gpu_types", ("a100",)),
    ("#SBATCH --gres=gpu:a100:3", "gpus_per_node", 3),
    ("#SBATCH --gpus-per-node=2", "gpus_per_node", 2),
    ("#SBATCH --gpus-per-node h100:4", "gpu_types", ("h100",)),
    ("#SBATCH --gpus-per-node h100:4", "gpus_per_node", 4),
    ("#SBATCH --nodes=3", "nodes", 3),
    ("#SBATCH -N 3", "nodes", 3),
    ("#SBATCH -N3", "nodes", 3),
    ("#SBATCH --ntasks-per-node=4", "tasks_per_node", 4),
    ("#SBATCH --ntasks-per-n=4", "tasks_per_node", 4),  # sbatch takes unambiguous abbreviations
    ("#SBATCH --cpus-per-task=4", "cpus_per_task", 4),
    ("#SBATCH -c 4", "cpus_per_task", 4),
    ("#SBATCH -c4", "cpus_per_task", 4),
    ("#SBATCH --cpus-per-gpu 6", "cpus_per_gpu", 6),
    ("#SBATCH --mem=1G", "mem_mb", 1024),
    ("#SBATCH --mem 1500", "mem_mb", 1500),
    ("#SBATCH --mem-per-gpu=512M", "mem_per_gpu_mb", 512),
    ("#SBATCH --time=90", "time_limit_s", 5400),  # a bare number is minutes, as in sbatch
    ("#SBATCH --time 1-00:00:00", "time_limit_s", 86400),
    ("#SBATCH -t 2:00:00", "time_limit_s", 7200),
    ("#SBATCH -t30", "time_limit_s", 1800),
    ("#SBATCH --job-name=render-7", "name", "render-7"),
    ("#SBATCH -J 'render-7'", "name", "render-7"),
    ("#SBATCH -Jrender-7", "name", "render-7"),
    ("#SBATCH --mem=1G  # a comment", "mem_mb", 1024),
    ("#SBATCH   --mem=1G", "mem_mb", 1024),
])
def test_each_supported_line_sets_its_field(line: str, field: str, value: object) -> None:
    spec = parse(with_script(line, time_limit=None if field == "time_limit_s" else "2h"))
    assert getattr(spec, field) == value


def test_several_options_on_one_line_and_several_lines() -> None:
    spec = parse(with_script("#SBATCH -N 2 --ntasks-per-node=4 -c 2", "", "# a comment between",
                             "#SBATCH --gres=gpu:a100:4 --mem-per-gpu=20G", "#SBATCH -J big -t 4:00:00",
                             time_limit=None))
    assert (spec.nodes, spec.tasks_per_node, spec.cpus_per_task, spec.gpus_per_node) == (2, 4, 2, 4)
    assert (spec.gpu_types, spec.mem_per_gpu_mb, spec.name, spec.time_limit_s) == (("a100",), 20480, "big", 14400)
    assert spec.gpu_request() == GpuRequest(gpus_per_node=4, nodes=2, gpu_types=("a100",), cpus_per_node=8,
                                            mem_per_node_mb=4 * 20480)


def test_lines_and_the_job_agreeing_is_fine() -> None:
    spec = parse(with_script("#SBATCH --gres=gpu:a100:2", "#SBATCH --mem=1024M", "#SBATCH --time=2:00:00",
                             gpus_per_node=2, gpu=["a100"], mem="1G", time_limit="2h"))
    assert (spec.gpus_per_node, spec.mem_mb, spec.time_limit_s) == (2, 1024, 7200)


def test_the_daemon_reads_the_lines_again() -> None:
    """A client that leaves the line's field out (or changes it) cannot get past the daemon's own reading."""
    data = with_script("#SBATCH --mem=1G", "#SBATCH --cpus-per-task=2")
    assert spec_from_dict(data, now=NOW).mem_mb == 1024
    with pytest.raises(SpecError, match=r"mem: the job gives 2G, but script line 2 \('#SBATCH --mem=1G'\)"):
        spec_from_dict(data | {"mem": "2G"}, now=NOW)
    spec = parse(data)
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))), now=NOW) == spec


CONFLICTS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("gpus", with_script("#SBATCH --gres=gpu:2", gpus_per_node=4),
     ["gpus_per_node: the job gives 4, but script line 2 ('#SBATCH --gres=gpu:2') asks for 2", "one place"]),
    ("gpu type", with_script("#SBATCH --gres=gpu:a100:1", gpu=["a100", "h100"]),
     ["gpu: the job gives a100 or h100, but script line 2", "asks for a100"]),
    ("nodes", with_script("#SBATCH -N 2", nodes=3), ["nodes: the job gives 3", "'#SBATCH -N 2'"]),
    ("time", with_script("#SBATCH --time=30"), ["time_limit: the job gives 2h", "'#SBATCH --time=30'"]),
    ("name", with_script("#SBATCH -J other", name="mine"), ["name: the job gives mine", "asks for other"]),
    ("mem", with_script("#SBATCH --mem=2G", mem="1G"), ["mem: the job gives 1G", "asks for 2G"]),
    ("cpus", with_script("#SBATCH -c 4", cpus_per_task=2), ["cpus_per_task: the job gives 2", "'#SBATCH -c 4'"]),
    ("tasks", with_script("#SBATCH --ntasks-per-node=4", tasks_per_node="gpu", gpus_per_node=4),
     ["tasks_per_node: the job gives gpu"]),
    ("two lines", with_script("#SBATCH --gres=gpu:2", "#SBATCH --gpus-per-node=4"),
     ["gpus_per_node: script line 2 ('#SBATCH --gres=gpu:2') and script line 3 ('#SBATCH --gpus-per-node=4') "
      "disagree"]),
    ("mem from a line and mem_per_gpu from the job", with_script("#SBATCH --mem=8G", mem_per_gpu="2G"),
     ["mem_per_gpu/mem: give one of them, not both (mem_per_gpu from the job, mem from script line 2 "
      "('#SBATCH --mem=8G'))"]),
    ("cpus from two lines", with_script("#SBATCH -c 2", "#SBATCH --cpus-per-gpu=4"),
     ["cpus_per_gpu/cpus_per_task", "script line 3", "script line 2"]),
]


@pytest.mark.parametrize("data,fragments", [pytest.param(d, f, id=i) for i, d, f in CONFLICTS])
def test_a_line_that_disagrees_is_refused_naming_both(data: dict[str, Any], fragments: list[str]) -> None:
    text = refusal(data)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


BAD_LINES: list[tuple[str, str, list[str]]] = [
    ("gres other resource", "#SBATCH --gres=shard:1", ["line 2", "only for GPUs", "'shard'"]),
    ("gres two resources", "#SBATCH --gres=gpu:2,shard:1", ["line 2", "one GPU request per line"]),
    ("gres too many parts", "#SBATCH --gres=gpu:a:b:2", ["line 2", "too many ':'"]),
    ("gres count not a number", "#SBATCH --gres=gpu:a100:two", ["line 2", "'two' is not a number of GPUs"]),
    ("gres empty type", "#SBATCH --gres=gpu::2", ["line 2", "type is empty"]),
    ("gres shell type", "#SBATCH --gres=gpu:a$(id):1", ["line 2", "gpu", "'$'"]),
    ("gres too many gpus", "#SBATCH --gres=gpu:64", ["line 2", "gpus_per_node: must be at most 8"]),
    ("gres zero", "#SBATCH --gres=gpu:0", ["line 2", "gpus_per_node: must be at least 1"]),
    ("nodes range", "#SBATCH --nodes=2-4", ["line 2", "fixed number of nodes"]),
    ("nodes word", "#SBATCH -N many", ["line 2", "'many' is not a whole number"]),
    ("cpus negative", "#SBATCH -c -2", ["line 2", "is not a whole number"]),
    ("mem zero", "#SBATCH --mem=0", ["line 2", "mem: must be more than zero"]),
    ("mem garbage", "#SBATCH --mem=lots", ["line 2", "'#SBATCH --mem=lots'", "not a size"]),
    ("time garbage", "#SBATCH --time=soon", ["line 2", "time_limit", "not a duration"]),
    ("name with space", '#SBATCH --job-name="my job"', ["line 2", "name", "' '"]),
    ("name option-like", "#SBATCH --job-name=-p", ["line 2", "name", "starts with '-'"]),
    ("missing value", "#SBATCH --mem", ["line 2", "--mem' needs a value"]),
    ("unclosed quote", "#SBATCH -J 'x", ["line 2", "unclosed quote"]),
    ("not an option", "#SBATCH mem=1G", ["line 2", "'mem=1G' is not an sbatch option"]),
    ("unknown option", "#SBATCH --frobnicate=1", ["line 2", "'--frobnicate=1' is not an sbatch option"]),
    ("unknown short", "#SBATCH -Z", ["line 2", "'-Z'", "not an sbatch option"]),
    ("ambiguous", "#SBATCH --cpus=2", ["line 2", "could be any of", "--cpus-per-gpu", "--cpus-per-task"]),
]


@pytest.mark.parametrize("line,fragments", [pytest.param(ln, f, id=i) for i, ln, f in BAD_LINES])
def test_a_bad_line_is_refused_with_its_line_number(line: str, fragments: list[str]) -> None:
    text = refusal(with_script(line))
    assert "script: line 2" in text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


REFUSED: list[tuple[str, str, str]] = [
    ("#SBATCH --partition=gpu", "--partition", "partition = ... for a managed pool"),
    ("#SBATCH -p gpu", "--partition", "gpu_mem_gb"),
    ("#SBATCH --part gpu", "--partition", "gbroker places the job"),
    ("#SBATCH --array=1-10", "--array", "write pieces = \"1-10\" in the job file"),
    ("#SBATCH -a 1-10", "--array", "one Slurm array task per piece"),
    ("#SBATCH --dependency=afterok:12", "--dependency", "not supported yet"),
    ("#SBATCH -d afterok:12", "--dependency", "once this one has finished"),
    ("#SBATCH --mail-type=END", "--mail-type", "gbroker show"),
    ("#SBATCH --mail-user=me@lab.org", "--mail-user", "gbroker show"),
    ("#SBATCH --exclusive", "--exclusive", "whole nodes"),
    ("#SBATCH --exclusive=user", "--exclusive", "cpus_per_gpu"),
    ("#SBATCH --constraint=a100", "--constraint", "gpu = "),
    ("#SBATCH -C a100", "--constraint", "gpu = "),
    ("#SBATCH --qos=high", "--qos", "QOS"),
    ("#SBATCH -q high", "--qos", "QOS"),
    ("#SBATCH --account=rich", "--account", "group = ... (--group)"),
    ("#SBATCH -A rich", "--account", "--group"),
    ("#SBATCH -Arich", "--account", "--group"),
    ("#SBATCH --reservation=r1", "--reservation", "gbroker places the job"),
    ("#SBATCH --uid=0", "--uid", "runs as the user who submits it"),
    ("#SBATCH --gid 0", "--gid", "groups of the user"),
    ("#SBATCH --comment=x", "--comment", "job's key"),
    ("#SBATCH --output=/tmp/x.out", "--output", "gbroker-<name>-XXXXXX.out"),
    ("#SBATCH -o x.out", "--output", "workdir = "),
    ("#SBATCH -e x.err", "--error", "one log"),
    ("#SBATCH --chdir=/scratch", "--chdir", "workdir = "),
    ("#SBATCH -D /scratch", "--chdir", "workdir = "),
    ("#SBATCH --signal=B:USR1@60", "--signal", "warning_signal"),
    ("#SBATCH --requeue", "--requeue", "max_retries"),
    ("#SBATCH --no-requeue", "--no-requeue", "max_retries = 0"),
    ("#SBATCH --export=ALL", "--export", "env = "),
    ("#SBATCH --gpus=4", "--gpus", "--gpus-per-node"),
    ("#SBATCH -G 4", "--gpus", "--gpus-per-node"),
    ("#SBATCH --ntasks=8", "--ntasks", "--ntasks-per-node"),
    ("#SBATCH -n 8", "--ntasks", "--ntasks-per-node"),
    ("#SBATCH --mem-per-cpu=2G", "--mem-per-cpu", "--mem-per-gpu"),
    ("#SBATCH --nodelist=node1", "--nodelist", "named nodes"),
    ("#SBATCH -w node1", "--nodelist", "named nodes"),
    ("#SBATCH --exclude=node1", "--exclude", "named nodes"),
    ("#SBATCH --begin=now+1hour", "--begin", "submit the job when it should start"),
    ("#SBATCH -H", "--hold", "holds"),
    ("#SBATCH --deadline=now+1day", "--deadline", "deadline = ... in the job file"),
    ("#SBATCH --acctg-freq=30", "--acctg-freq", "no effect"),
    ("#SBATCH --wrap=hostname", "--wrap", "not a setting of the job"),
]


@pytest.mark.parametrize("line,option,instead", REFUSED, ids=[r[0][8:] for r in REFUSED])
def test_an_unsupported_option_is_refused_by_name_with_what_to_use(line: str, option: str, instead: str) -> None:
    text = refusal(with_script("#SBATCH --mem=1G", line))
    assert f"script: line 3: {option} ('{line}')" in text, text
    assert "is not supported" in text and instead in text, text
    assert "#SBATCH lines gbroker reads: --gres=gpu[:TYPE]:N" in text  # the hint lists what works


def test_every_refused_option_on_a_line_is_named() -> None:
    _, refused = sbatch_lines.read("#!/bin/bash\n#SBATCH -Hk -N 2 --exclusive -p gpu\n")
    assert [e.message.split(" (")[0] for e in refused] == [
        "script: line 2: --hold", "script: line 2: --no-kill", "script: line 2: --exclusive",
        "script: line 2: --partition"]


def test_every_problem_of_a_script_is_reported_at_once() -> None:
    with pytest.raises(SpecProblems) as info:
        parse(with_script("#SBATCH --partition=x", "#SBATCH --array=1-3", "#SBATCH --mem=0", gpus_per_node=0))
    text = str(info.value)
    for fragment in ("line 2: --partition", "line 3: --array", "line 4", "gpus_per_node: must be at least 1"):
        assert fragment in text, text


def test_a_line_after_the_first_command_is_refused_because_sbatch_ignores_it() -> None:
    text = refusal(job(command=None, script="#!/bin/bash\n#SBATCH --mem=1G\nmodule load cuda\n#SBATCH -c 4\n"))
    assert "script: line 4: '#SBATCH -c 4' comes after the first command (line 3)" in text
    assert "move it above line 3" in text


def test_an_indented_line_in_the_header_is_refused_because_sbatch_reads_a_comment() -> None:
    text = refusal(job(command=None, script="#!/bin/bash\n  #SBATCH --mem=1G\nhostname\n"))
    assert "script: line 2: '#SBATCH --mem=1G' does not start at the beginning of the line" in text


@pytest.mark.parametrize("line", ["#sbatch --mem=16G", "#Sbatch -N 2", "#SBatch\t--exclusive"])
def test_a_directive_in_the_wrong_case_is_refused_because_sbatch_reads_a_comment(line: str) -> None:
    text = refusal(job(command=None, script=f"#!/bin/bash\n{line}\nhostname\n"))
    assert f"script: line 2: '{line.strip()}' is not #SBATCH (in capitals)" in text, text
    assert "##SBATCH to keep it switched off" in text


@pytest.mark.parametrize("line", ["# sbatch reads the lines below", "# SBATCH --exclusive", "##SBATCH --mem=9G",
                                  "# sbatch --array=1-10 job.sh"])
def test_a_switched_off_directive_or_a_usage_note_is_a_comment(line: str) -> None:
    spec = parse(job(command=None, script=f"#!/bin/bash\n{line}\n#SBATCH --mem=1G\nhostname\n"))
    assert spec.mem_mb == 1024


def test_text_of_the_program_after_the_header_is_left_alone() -> None:
    """An indented '#SBATCH' in the program (a here-document for another tool) is no directive, for sbatch too."""
    body = "#!/bin/bash\nhostname\ncat > sub.sh <<EOF\n  #SBATCH --partition=x\nEOF\n  # #SBATCH --array=1\n"
    spec = parse(job(command=None, script=body))
    assert spec.script == body and spec.mem_mb is None


def test_the_user_script_lines_never_reach_sbatch() -> None:
    """The batch script gbroker renders has no #SBATCH line: the options go on sbatch's command line."""
    from broker.jobs.submit import request_for
    from broker.slurm.cli_backend import CliBackend
    from policies import Capacity

    spec = parse(with_script("#SBATCH --mem=1G", "#SBATCH --cpus-per-task=2", "#SBATCH --gres=gpu:a100:2",
                             workdir="/home/ana"))
    req = request_for(spec, job_id=7, key="gb-0123456789ab", attempt_number=1, partition="spot",
                      capacity=Capacity.SPOT, owner_name="ana", log_path="/home/ana/gbroker-x.out")
    assert not any(line.lstrip().startswith("#SBATCH") for line in req.script.split("\n"))
    argv = CliBackend(runner=_NoRunner()).sbatch_argv(req)
    assert {"--gres=gpu:a100:2", "--mem=1024M", "--cpus-per-task=2"} <= set(argv)
    typed = request_for(spec, job_id=7, key="gb-0123456789ab", attempt_number=1, partition="spot",
                        capacity=Capacity.SPOT, owner_name="ana", log_path=None, gres_type="h100")
    assert typed.gres_type == "h100"  # the placed pool's type wins


class _NoRunner:
    def run(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("no Slurm command may run here")


# --------------------------------------------------------------------------- the submit flags


def _flags(**kw: Any) -> dict[str, Any]:
    flags: dict[str, Any] = {"group": "vision", "time_limit": "1h", "gpu": ()}
    flags.update(kw)
    return flags


def test_submit_flags_reach_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec

    monkeypatch.chdir(tmp_path)
    wire = build_spec(None, _flags(gpu=("a100,h100", "l40s"), gpu_mem_gb=40, cpus_per_gpu=4, mem_per_gpu="512M",
                                   gpus_per_node=2), ("true",))
    spec = spec_from_dict(wire, now=NOW)
    assert spec.gpu_types == ("a100", "h100", "l40s")
    assert (spec.gpu_mem_gb, spec.cpus_per_gpu, spec.mem_per_gpu_mb) == (40, 4, 512)
    wire = build_spec(None, _flags(mem="2G", cpus_per_task=3), ("true",))
    assert (wire["mem"], wire["cpus_per_task"], "gpu" in wire) == ("2G", 3, False)  # as written: the daemon parses
    spec = spec_from_dict(wire, now=NOW)
    assert (spec.mem_mb, spec.cpus_per_task, spec.gpu_types, spec.name) == (2048, 3, (), "true")


def test_a_job_of_flags_goes_as_written_and_one_naming_a_file_is_parsed_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags and a command name no file: the CLI sends them as written, named as the parser
    names a job (its log carries the name), and the daemon's parser gives the same spec."""
    from broker.cli.jobs import build_spec
    from broker.spec import parse_spec

    monkeypatch.chdir(tmp_path)
    flags = _flags(time_limit="90m", deadline="+3h", env=("A=1",), kind="render")
    for command, name in ((("python3", "train.py", "--lr", "1"), "train.py"), (("/usr/bin/sleep", "5"), "sleep"),
                          (("python", "-m", "pkg"), "python"), (("--odd;name",), "odd_name")):
        wire = build_spec(None, dict(flags), command)
        assert wire["name"] == name and wire["time_limit"] == "90m" and wire["deadline"] == "+3h"
        assert spec_from_dict(wire, now=NOW) == parse_spec({k: v for k, v in wire.items() if k != "name"}, now=NOW)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --mem=1G\nhostname\n")
    wire = build_spec(None, _flags(script_path=str(script)), ())
    assert wire["script"] == {"text": script.read_text(), "path": str(script)} and wire["mem"] == "1024M"
    assert wire["time_limit"] == "3600s"  # parsed here: the file was read as the user


def test_a_flag_that_disagrees_with_a_script_line_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --mem=1G\n#SBATCH --exclusive\nhostname\n")
    with pytest.raises(SpecError) as info:
        build_spec(None, _flags(script_path=str(script), mem="2G"), ())
    text = str(info.value)
    assert "mem: the job gives 2G, but script line 2 ('#SBATCH --mem=1G') asks for 1G" in text
    assert "line 3: --exclusive" in text


@pytest.mark.parametrize("flags,fragment", [
    ({"gpu": ("a100,",)}, "gpu[1]"),
    ({"gpu": ("a100", "a100")}, "twice"),
    ({"gpu": ("a;b",)}, "';'"),
    ({"gpu_mem_gb": 0}, "gpu_mem_gb"),
    ({"mem": "64G", "mem_per_gpu": "8G"}, "not both"),
    ({"cpus_per_gpu": 2, "cpus_per_task": 2}, "not both"),
])
def test_bad_flags_are_refused(flags: dict[str, Any], fragment: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:  # the daemon's check (flags alone are not parsed by the CLI)
        spec_from_dict(build_spec(None, _flags(**flags), ("true",)), now=NOW)
    assert fragment in str(info.value)


def test_submit_help_documents_every_resource_flag() -> None:
    from click.testing import CliRunner

    from broker.cli.main import cli, main  # noqa: F401  (main registers the job commands)
    import broker.cli.jobs  # noqa: F401

    out = CliRunner().invoke(cli, ["submit", "--help"]).output
    for flag in ("--gpu TYPE[,TYPE...]", "--gpu-mem-gb GB", "--cpus-per-gpu N", "--cpus-per-task N",
                 "--mem-per-gpu SIZE", "--mem SIZE", "#SBATCH lines"):
        assert flag in out, out



def test_checkpoint_flags_merge_with_a_job_file_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec
    from broker.errors import SpecError

    sub = tmp_path / "sub"
    sub.mkdir()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    job = sub / "job.toml"
    # A flag's relative directory is from where you are; the file's own, from the job file's folder.
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\ncheckpoint = "pieces"\n')
    wire = build_spec(str(job), {"checkpoint_dir": "ck"}, ())
    assert wire["checkpoint"] == {"style": "pieces", "dir": str(here / "ck")}
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\n'
                   '[checkpoint]\nstyle = "signal"\ndir = "ck"\n')
    assert build_spec(str(job), {}, ())["checkpoint"]["dir"] == str(sub / "ck")
    # --checkpoint-dir alone means signal; a dir in the file needs its style written out.
    assert build_spec(None, _flags(checkpoint_dir="ck"), ("true",))["checkpoint"] == {
        "style": "signal", "dir": str(here / "ck")}
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\n[checkpoint]\ndir = "/scratch/ck"\n')
    with pytest.raises(SpecError, match="a checkpoint dir needs a style"):
        build_spec(str(job), {}, ())


def test_a_variable_given_twice_or_a_script_given_both_ways_is_refused(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec
    from broker.errors import SpecError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="--env X= is given twice"):
        build_spec(None, _flags(env=("X=1", "X=2")), ("true",))
    job = tmp_path / "job.toml"
    job.write_text('group = "vision"\ntime_limit = "1h"\nenv = { X = "file" }\n'
                   '[script]\npath = "/bin/true"\ntext = "#!/bin/bash\\ntrue\\n"\n')
    with pytest.raises(SpecError, match="give script.text or script.path, not both"):
        build_spec(str(job), {}, ())
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\nenv = { X = "file" }\n')
    assert build_spec(str(job), {"env": ("X=flag",)}, ())["env"] == {"X": "flag"}  # a flag wins


def test_job_file_paths_expand_home_and_refuse_variables_and_empty_ones(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.cli.jobs import build_spec
    from broker.errors import SpecError

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.toml"
    head = 'group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\n'
    job.write_text(head + '[checkpoint]\nstyle = "signal"\ndir = "~/ck"\n')
    assert build_spec(str(job), {}, ())["checkpoint"]["dir"] == str(home / "ck")  # not <job folder>/~/ck
    for value, words in (("$HOME/ck", r"(?s)holds a shell variable.*\[checkpoint\] dir = \"~/...\""),
                         ("", "checkpoint dir is empty")):
        job.write_text(head + f'[checkpoint]\nstyle = "signal"\ndir = "{value}"\n')
        with pytest.raises(SpecError, match=words):
            build_spec(str(job), {}, ())
    with pytest.raises(SpecError, match="--checkpoint-dir is empty"):
        build_spec(None, _flags(checkpoint_dir=""), ("true",))
    (home / "lr.txt").write_text("--lr 1\n--lr 2\n")
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["train"]\nsweep = "~/lr.txt"\n')
    assert build_spec(str(job), {}, ())["sweep"] == ["--lr 1", "--lr 2"]  # read from ~/lr.txt


def test_a_job_file_is_known_by_its_ending_in_any_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from broker.cli import jobs
    from broker.cli.main import cli

    job = tmp_path / "Job.TOML"
    job.write_text('group = "vision"\ntime_limit = "1h"\ncommand = ["true"]\nname = "from-the-file"\n')
    sent: list[dict[str, Any]] = []

    class Client:
        def submit(self, spec: dict[str, Any], key: str | None = None) -> Any:
            sent.append(spec)
            raise SystemExit(0)

    monkeypatch.setattr(jobs, "client_of", lambda ctx: Client())
    CliRunner().invoke(cli, ["--socket", "/nonexistent.sock", "submit", str(job)])
    assert [s.get("name") for s in sent] == ["from-the-file"] and sent[0]["command"] == ["true"]


@pytest.mark.parametrize("written", ["1_0", "\u0662", "+5", " 5", "5.0", "0x10"])
def test_numbers_on_the_command_line_are_plain_digits(written: str) -> None:
    """click's int() would read 1_0 as 10 and ٢ as 2."""
    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers submit and show)
    from broker.cli.main import cli

    for args in (["submit", "--group", "v", "--time", "1h", "--gpus", written, "--", "true"], ["show", written],
                 ["budget", "ledger", "--job", written]):
        r = CliRunner().invoke(cli, ["--socket", "/nonexistent.sock", *args])
        assert r.exit_code == 2 and f"{written!r} is not a whole number (write digits 0-9)" in r.output, (args, r.output)
