"""JobSpec parsing: hostile and malformed requests are refused with a message naming the field."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import sbatch_lines
from broker.errors import SpecError
from broker.spec import (
    CHECKPOINT_STYLES,
    KINDS,
    TOP_LEVEL_KEYS,
    JobSpec,
    SpecProblems,
    load_job_file,
    parse_duration,
    parse_spec,
    spec_from_dict,
    spec_to_dict,
)

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
PARTITIONS = {"gpu-spot", "gpu-ondemand"}
SCRIPT_OK = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:4\nsrun python train.py\n"
"""Its #SBATCH lines agree with base() (2 nodes of 4 GPUs)."""


def base() -> dict[str, Any]:
    return {
        "name": "train-llm",
        "kind": "finetune",
        "group": "vision-lab",
        "gpus_per_node": 4,
        "nodes": 2,
        "time_limit": "2h",
        "command": ["python", "train.py", "--epochs", "3"],
    }


def with_(**changes: Any) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        d = base()
        for k, v in changes.items():
            if v is _DROP:
                d.pop(k, None)
            else:
                d[k] = v
        return d

    return build


_DROP = object()


def script(text: str) -> Callable[[], dict[str, Any]]:
    return with_(command=_DROP, script=text)


def parse(data: dict[str, Any]) -> JobSpec:
    return parse_spec(data, now=NOW, partitions=PARTITIONS)


# (case id, request builder, text the error must contain: at least the field name)
BAD: list[tuple[str, Callable[[], dict[str, Any]], list[str]]] = [
    ("unknown kind", with_(kind="training"), ["kind", "render, simulation, finetune, other"]),
    ("kind typo suggests", with_(kind="finetun"), ["kind", "finetune"]),
    ("kind wrong type", with_(kind=3), ["kind"]),
    ("gpus zero", with_(gpus_per_node=0), ["gpus_per_node", "at least 1"]),
    ("gpus negative", with_(gpus_per_node=-2), ["gpus_per_node"]),
    ("gpus float", with_(gpus_per_node=2.0), ["gpus_per_node", "whole number"]),
    ("gpus bool", with_(gpus_per_node=True), ["gpus_per_node", "whole number"]),
    ("gpus string", with_(gpus_per_node="4"), ["gpus_per_node"]),
    ("gpus impossible", with_(gpus_per_node=9), ["gpus_per_node", "at most 8"]),
    ("nodes zero", with_(nodes=0), ["nodes", "at least 1"]),
    ("nodes impossible", with_(nodes=17), ["nodes", "at most 16"]),
    ("nodes bool", with_(nodes=False), ["nodes"]),
    ("time limit missing", with_(time_limit=_DROP), ["time_limit", "missing"]),
    ("time limit garbage", with_(time_limit="two hours"), ["time_limit", "not a duration"]),
    ("time limit decimal", with_(time_limit="1.5h"), ["time_limit"]),
    ("time limit zero", with_(time_limit="0s"), ["time_limit", "longer than zero"]),
    ("time limit negative", with_(time_limit="-5m"), ["time_limit"]),
    ("time limit bad clock", with_(time_limit="01:75:00"), ["time_limit", "0-59"]),
    ("time limit huge", with_(time_limit="400d"), ["time_limit", "year"]),
    ("time limit float", with_(time_limit=1.5), ["time_limit"]),
    ("deadline past", with_(deadline="2026-08-31T12:00:00+00:00"), ["deadline", "past"]),
    ("deadline before time limit", with_(deadline="+1h"), ["deadline", "time_limit"]),
    ("deadline naive", with_(deadline="2026-10-01T12:00:00"), ["deadline", "time zone"]),
    ("deadline garbage", with_(deadline="next tuesday"), ["deadline", "ISO-8601"]),
    ("deadline bad relative", with_(deadline="+soon"), ["deadline"]),
    ("deadline wrong type", with_(deadline=36), ["deadline"]),
    ("deadline out of range", with_(deadline="0001-01-01T00:00:00+05:00"), ["deadline", "out of range"]),
    ("deadline far future", with_(deadline="2031-06-01T00:00:00Z"), ["deadline", "two years"]),
    ("deadline overflows", with_(deadline="9999-12-31T23:59:59-05:00"), ["deadline", "out of range"]),
    ("deadline huge relative", with_(deadline="+99999999999d"), ["deadline", "two years"]),
    ("name with newline", with_(name="a\nb"), ["name", "'\\n'"]),
    ("name with NUL", with_(name="a\x00b"), ["name"]),
    ("name with shell meta", with_(name="x;rm -rf ~"), ["name", "';'"]),
    ("name with dollar", with_(name="$(id)"), ["name"]),
    ("name too long", with_(name="n" * 65), ["name", "longer than 64"]),
    ("name leading dash", with_(name="--uid=0"), ["name"]),
    ("name empty", with_(name=""), ["name", "empty"]),
    ("group missing", with_(group=_DROP), ["group", "missing"]),
    ("group with space", with_(group="vision lab"), ["group"]),
    ("group with backtick", with_(group="lab`id`"), ["group"]),
    ("group wrong type", with_(group=["lab"]), ["group", "string"]),
    ("env key with meta", with_(env={"A;B": "1"}), ["env", "variable name"]),
    ("env key with newline", with_(env={"A\nB": "1"}), ["env"]),
    ("env key starts with digit", with_(env={"1A": "x"}), ["env"]),
    ("env value not string", with_(env={"EPOCHS": 3}), ["env.EPOCHS", "string"]),
    ("env value NUL", with_(env={"X": "a\x00"}), ["env.X", "NUL"]),
    ("env reserved SBATCH", with_(env={"SBATCH_ACCOUNT": "rich-lab"}), ["env.SBATCH_ACCOUNT", "reserved"]),
    ("env reserved SLURM", with_(env={"SLURM_JOB_ID": "1"}), ["env.SLURM_JOB_ID", "reserved"]),
    ("env not a table", with_(env=["A=1"]), ["env"]),
    ("command NUL", with_(command=["python", "a\x00b"]), ["command[1]", "NUL"]),
    ("command newline", with_(command=["python", "-c", "1\n2"]), ["command[2]"]),
    ("command string", with_(command="python train.py"), ["command", "list", '["python", "train.py"]']),
    ("command empty list", with_(command=[]), ["command"]),
    ("command non-string element", with_(command=["python", 3]), ["command[1]"]),
    ("command empty program", with_(command=["", "x"]), ["command[0]"]),
    ("command lone surrogate", with_(command=["python", "\udc80"]), ["command[1]", "UTF-8"]),
    ("env value lone surrogate", with_(env={"X": "\ud800"}), ["env.X", "UTF-8"]),
    ("workdir lone surrogate", with_(workdir="/tmp/\udcff"), ["workdir", "UTF-8"]),
    ("command and script", with_(script="#!/bin/bash\necho hi\n"), ["command/script"]),
    ("neither command nor script", with_(command=_DROP), ["command"]),
    ("relative workdir", with_(workdir="runs/today"), ["workdir", "relative"]),
    ("home-relative workdir", with_(workdir="~/runs"), ["workdir", "relative"]),
    ("workdir newline", with_(workdir="/a\nb"), ["workdir"]),
    ("relative checkpoint dir", with_(checkpoint={"style": "signal", "dir": "ckpt"}), ["checkpoint.dir", "relative"]),
    ("checkpoint signal without dir", with_(checkpoint={"style": "signal"}), ["checkpoint.dir", "required"]),
    ("checkpoint bad style", with_(checkpoint={"style": "sometimes"}), ["checkpoint.style", "signal, pieces, none"]),
    ("checkpoint typo key", with_(checkpoint={"style": "none", "dri": "/x"}), ["checkpoint.dri", "did you mean dir"]),
    ("checkpoint wrong type", with_(checkpoint=3), ["checkpoint"]),
    ("relative script path", script("job.sh"), ["script", "relative"]),
    ("unknown key typo", with_(gpu_per_node=2), ["gpu_per_node", "did you mean gpus_per_node?"]),
    ("unknown key typo 2", with_(time_limt="2h"), ["time_limt", "did you mean time_limit?"]),
    ("unknown key unrelated", with_(colour="blue"), ["colour", "known keys"]),
    ("interruptible string", with_(interruptible="yes"), ["interruptible", "true or false"]),
    ("partition unknown", with_(partition="gpu-free"), ["partition", "gpu-ondemand, gpu-spot"]),
    ("partition meta", with_(partition="gpu,debug"), ["partition"]),
    ("max_retries negative", with_(max_retries=-1), ["max_retries"]),
    ("max_retries float", with_(max_retries=1.5), ["max_retries"]),
    ("signal lead too long", with_(signal_lead_s=7200), ["signal_lead_s"]),
    ("signal lead over time limit", with_(time_limit="1m", signal_lead_s=120), ["signal_lead_s", "time limit"]),
    ("script sets partition", script("#!/bin/bash\n#SBATCH -p gpu-ondemand\necho\n"), ["script", "line 2", "-p"]),
    ("script sets partition long", script("#!/bin/bash\n#SBATCH --partition=x\n"), ["script", "--partition"]),
    ("script sets partition abbreviated", script("#!/bin/bash\n#SBATCH --part x\n"), ["script", "--partition"]),
    ("script sets account", script("#!/bin/bash\n#SBATCH -A rich-lab\n"), ["script", "account", "-A"]),
    ("script sets account glued", script("#!/bin/bash\n#SBATCH -Arich\n"), ["script", "-A"]),
    ("script sets account long", script("#!/bin/bash\n#SBATCH --account=rich\n"), ["script", "--account"]),
    ("script sets uid", script("#!/bin/bash\n#SBATCH --uid=0\n"), ["script", "--uid"]),
    ("script sets gid", script("#!/bin/bash\n#SBATCH --gid 0\n"), ["script", "--gid"]),
    ("script sets qos", script("#!/bin/bash\n#SBATCH --qos=high\n"), ["script", "--qos"]),
    ("script sets qos short", script("#!/bin/bash\n#SBATCH -q high\n"), ["script", "-q"]),
    ("script sets reservation", script("#!/bin/bash\n#SBATCH --reservation=r1\n"), ["script", "--reservation"]),
    ("script bundled short", script("#!/bin/bash\n#SBATCH -Hp gpu\n"), ["script", "-p"]),
    ("script second option on line", script("#!/bin/bash\n#SBATCH -N 2 -p gpu\n"), ["script", "-p"]),
    ("script NUL", script("#!/bin/bash\necho \x00\n"), ["script", "NUL"]),
    ("script CRLF", script("#!/bin/bash\r\necho hi\r\n"), ["script", "DOS"]),
    ("script no shebang", script("echo hi\nexit 0\n"), ["script", "#!"]),
    ("script too large", script("#!/bin/bash\n" + "#" * (1024 * 1024) + "\n"), ["script", "1 MiB"]),
    ("script lone surrogate", script("#!/bin/bash\necho \udcff\n"), ["script", "UTF-8"]),
    ("script wrong type", with_(command=_DROP, script=42), ["script"]),
    ("script table typo", with_(command=_DROP, script={"txt": "#!/bin/sh\n"}), ["script.txt", "did you mean text"]),
]


@pytest.mark.parametrize("data_fn,fragments", [pytest.param(b, f, id=i) for i, b, f in BAD])
def test_bad_request_is_refused_naming_the_field(data_fn: Callable[[], dict[str, Any]], fragments: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        parse(data_fn())
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def test_there_are_many_hostile_cases() -> None:
    assert len(BAD) >= 30


def test_valid_minimal_request_gets_defaults() -> None:
    spec = parse({"group": "lab", "time_limit": "90", "command": ["/usr/bin/blender", "-b", "scene.blend"]})
    assert spec.time_limit_s == 90 * 60  # a bare number is minutes, as in Slurm
    assert spec.name == "blender"
    assert spec.kind == "other"
    assert (spec.nodes, spec.gpus_per_node, spec.gpus) == (1, 1, 1)
    assert spec.interruptible is True
    assert spec.checkpoint_style == "none" and not spec.checkpointable
    assert spec.max_retries == 2 and spec.signal_lead_s == 120
    assert spec.deadline is None and spec.partition is None


def test_name_defaults_to_the_program_an_interpreter_runs() -> None:
    spec = parse(with_(name=_DROP, command=["python3", "/home/ana/train.py", "--lr", "3e-4"])())
    assert spec.name == "train.py"


def test_full_request() -> None:
    data = base() | {
        "deadline": "2026-09-03T00:00:00+02:00",
        "interruptible": False,
        "checkpoint": {"style": "signal", "dir": "/scratch/ana/ckpt/"},
        "partition": "gpu-ondemand",
        "workdir": "/home/ana/proj",
        "env": {"WANDB_MODE": "offline", "OMP_NUM_THREADS": "8"},
        "max_retries": 0,
        "signal_lead_s": 300,
    }
    spec = parse(data)
    assert spec.deadline == datetime(2026, 9, 2, 22, 0, tzinfo=UTC)
    assert spec.deadline.tzinfo == UTC
    assert spec.checkpoint_dir == "/scratch/ana/ckpt"
    assert spec.env == (("OMP_NUM_THREADS", "8"), ("WANDB_MODE", "offline"))
    assert spec.env_dict()["WANDB_MODE"] == "offline"
    assert spec.gpus == 8 and spec.max_retries == 0 and spec.interruptible is False


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 5400), ("90s", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1-02:00:00", 93600),
     ("02:00:00", 7200), ("30:00", 1800), ("1-02", 93600), ("2d", 172800), (" 2H ", 7200)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse(with_(time_limit=text)()).time_limit_s == seconds


def test_relative_deadline_and_exact_boundary() -> None:
    assert parse(with_(deadline="+36h")()).deadline == NOW + timedelta(hours=36)
    # exactly now + time_limit is allowed; one second less is not
    assert parse(with_(deadline="+2h")()).deadline == NOW + timedelta(hours=2)
    with pytest.raises(SpecError, match="deadline"):
        parse(with_(deadline=(NOW + timedelta(seconds=7199)).isoformat())())


def test_limits_are_configurable() -> None:
    data = with_(gpus_per_node=16, nodes=64)()
    with pytest.raises(SpecError, match="gpus_per_node"):
        parse(data)
    spec = parse_spec(data, now=NOW, max_gpus_per_node=16, max_nodes=64)
    assert spec.gpus == 1024


def test_any_partition_name_when_no_list_is_given() -> None:
    assert parse_spec(with_(partition="whatever")(), now=NOW).partition == "whatever"


def test_script_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT_OK)
    spec = parse(script(str(path))() | {"name": None})
    assert spec.script == SCRIPT_OK and spec.script_path == str(path) and spec.command is None
    assert spec.name == "job.sh"


def test_script_file_not_utf8_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "bad.sh"
    path.write_bytes(b"#!/bin/bash\necho \xff\xfe\n")
    with pytest.raises(SpecError, match="script.*UTF-8"):
        parse(script(str(path))())
    with pytest.raises(SpecError, match="script: cannot read"):
        parse(script(str(tmp_path / "missing.sh"))())


def test_script_file_too_large(tmp_path: Path) -> None:
    path = tmp_path / "big.sh"
    path.write_bytes(b"#!/bin/bash\n" + b"#" * (1024 * 1024))
    with pytest.raises(SpecError, match="script.*1 MiB"):
        parse(script(str(path))())


def test_inline_script_with_sbatch_lines_that_agree_with_the_job() -> None:
    text = "#!/bin/bash\n#SBATCH --gres=gpu:4\n#SBATCH -N 2 --time=2h\n#SBATCH -J train-llm\necho done\n"
    spec = parse(script(text)())
    assert spec.script == text and spec.script_path is None
    assert spec == parse(script(text)() | {"name": None, "time_limit": None, "nodes": None})  # the lines say it
    plain = "#!/bin/bash\n#SBATCH --gres=gpu:4\necho done\n"
    assert parse(script(plain)() | {"name": None}).name == "finetune"  # inline, unnamed: named after the kind


@pytest.mark.parametrize(
    "line,expected",
    [("#SBATCH -p gpu", ["-p"]), ("#SBATCH --partition=gpu", ["--partition"]), ("#SBATCH --acc=x", ["--account"]),
     ("#SBATCH -N 2 --qos high", ["--qos"]), ("#SBATCH -vA x", ["-v", "-A"]), ("#SBATCH -N2", []),
     ("#SBATCH --gres=gpu:2", []), ("#SBATCH --job-name=-p", []), ("#SBATCH --mail-user=a@b", ["--mail-user"]),
     ("#SBATCH -J x  # -p in a comment", []), ("#SBATCH --gpus-per-node=4", [])],
)
def test_sbatch_lines_refused_by_name(line: str, expected: list[str]) -> None:
    _, refused = sbatch_lines.read(f"#!/bin/bash\n{line}\necho\n")
    assert len(refused) == len(expected)
    for error, option in zip(refused, expected, strict=True):
        assert option in error.message and "line 2" in error.message


def test_round_trip_through_json() -> None:
    data = base() | {
        "deadline": "+3d",
        "checkpoint": {"style": "pieces"},
        "env": {"B": "2", "A": "1"},
        "workdir": "/work/x",
        "partition": "gpu-spot",
    }
    spec = parse(data)
    wire = json.loads(json.dumps(spec_to_dict(spec)))
    again = spec_from_dict(wire, now=NOW, partitions=PARTITIONS)
    assert again == spec
    # a stored spec reads back later, after its deadline passed
    later = spec_from_dict(wire)
    assert later == spec


def test_round_trip_with_script(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT_OK)
    spec = parse(script(str(path))())
    wire = json.loads(json.dumps(spec_to_dict(spec)))
    path.unlink()  # the daemon must not need the file
    assert spec_from_dict(wire, now=NOW) == spec


def test_daemon_side_never_reads_a_script_path(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT_OK)
    with pytest.raises(SpecError, match="client must send the script text"):
        spec_from_dict(script(str(path))(), now=NOW)


def test_daemon_side_revalidates() -> None:
    wire = spec_to_dict(parse(base()))
    wire["gpus_per_node"] = 0
    with pytest.raises(SpecError, match="gpus_per_node"):
        spec_from_dict(wire, now=NOW)
    wire = spec_to_dict(parse(with_(deadline="+3h")()))
    with pytest.raises(SpecError, match="deadline.*past"):
        spec_from_dict(wire, now=NOW + timedelta(days=1))


def test_stored_spec_refuses_relative_deadline() -> None:
    with pytest.raises(SpecError, match="deadline"):
        spec_from_dict(with_(deadline="+3h")())


def test_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        parse_spec(base(), now=datetime(2026, 1, 1))


def test_load_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        'name = "render-shot-12"\nkind = "render"\ngroup = "film"\ntime_limit = "45m"\n'
        'command = ["blender", "-b", "shot12.blend", "-a"]\n'
        'deadline = 2026-09-05T09:00:00Z\n'
        '[checkpoint]\nstyle = "pieces"\n[env]\nFRAMES = "1-240"\n'
    )
    spec = parse(load_job_file(str(path)))
    assert spec.kind == "render" and spec.time_limit_s == 2700
    assert spec.deadline == datetime(2026, 9, 5, 9, 0, tzinfo=UTC)
    assert spec.env == (("FRAMES", "1-240"),)


def test_load_job_file_errors_carry_line(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('group = "lab"\ntime_limit = 2h\n')
    with pytest.raises(SpecError) as info:
        load_job_file(str(path))
    assert "line 2" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(SpecError, match="cannot read"):
        load_job_file(str(tmp_path / "nope.toml"))
    path.write_bytes(b'group = "\xff"\n')
    with pytest.raises(SpecError, match="UTF-8"):
        load_job_file(str(path))


def test_toml_local_datetime_deadline_needs_zone(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('group = "lab"\ntime_limit = "1h"\ncommand = ["x"]\ndeadline = 2026-09-05T09:00:00\n')
    with pytest.raises(SpecError, match="deadline.*time zone"):
        parse(load_job_file(str(path)))


def test_spec_imports_only_the_standard_library() -> None:
    code = (
        "import sys, broker.spec\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic', 'psycopg2', 'click')]\n"
        "print(','.join(bad))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root)}, check=True)
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
hostile_text = st.sampled_from(["", "-p", "../x", "/a\nb", "+36h", "+", "1-", "::", "#SBATCH -A x", "\x00",
                                "\udc80", "9" * 30, "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+05:00"])
field_values = json_values | hostile_text


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(TOP_LEVEL_KEYS) | st.text(max_size=12), field_values, max_size=8),
       st.booleans())
def test_any_input_is_a_spec_or_a_spec_error(data: dict[str, Any], daemon_side: bool) -> None:
    """Whatever arrives (a hostile client can send any JSON), the only failure is SpecError."""
    data = base() | data if data.get("command") is None and data.get("script") is None else data
    try:
        if daemon_side:
            spec_from_dict(data, now=NOW, partitions=PARTITIONS)
        else:
            parse(data)
    except SpecError as exc:
        assert ":" in exc.message  # "<field>: what is wrong"


names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", fullmatch=True)
valid_specs = st.fixed_dictionaries(
    {
        "group": names,
        "time_limit": st.integers(1, 7 * 24 * 3600).map(lambda n: f"{n}s"),
        "command": st.tuples(  # the program: no space or tab (that is two arguments written as one)
            st.text(st.characters(blacklist_characters="\x00\n\r \t", blacklist_categories=["Cs"]),
                    min_size=1, max_size=20),
            st.lists(st.text(st.characters(blacklist_characters="\x00\n\r", blacklist_categories=["Cs"]),
                             min_size=1, max_size=20), max_size=4),
        ).map(lambda t: [t[0], *t[1]]),
    },
    optional={
        "name": names,
        "kind": st.sampled_from(KINDS),
        "gpus_per_node": st.integers(1, 8),
        "nodes": st.integers(1, 16),
        "interruptible": st.booleans(),
        "checkpoint": st.fixed_dictionaries({"style": st.sampled_from(CHECKPOINT_STYLES)},
                                            optional={"dir": st.just("/scratch/ckpt")}),
        "partition": st.sampled_from(sorted(PARTITIONS)),
        "workdir": st.just("/home/ana"),
        "env": st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)
                               .filter(lambda k: not k.startswith(("SLURM_", "SBATCH_", "GBROKER_"))),
                               st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
                                       max_size=20), max_size=4),
        "max_retries": st.integers(0, 100),
    },
)


@settings(max_examples=200, deadline=None)
@given(valid_specs, st.integers(0, 30 * 24 * 3600))
def test_valid_specs_survive_the_round_trip(data: dict[str, Any], deadline_extra_s: int) -> None:
    ck = data.get("checkpoint")
    if ck and ck["style"] == "signal":
        ck["dir"] = "/scratch/ckpt"
    if ck and ck["style"] == "none":
        ck.pop("dir", None)  # a dir with style none is refused (test_a_checkpoint_dir_needs_a_style_that_uses_it)
    limit = int(data["time_limit"][:-1])
    data["deadline"] = (NOW + timedelta(seconds=limit + deadline_extra_s)).isoformat()
    spec = parse(data)
    wire = json.loads(json.dumps(spec_to_dict(spec)))
    assert spec_from_dict(wire, now=NOW, partitions=PARTITIONS) == spec
    assert spec_from_dict(wire) == spec


def test_every_problem_is_reported_at_once() -> None:
    data = {"group": "vision", "gpu_per_node": 2, "colour": "blue", "nodes": 0,
            "script": "#!/bin/bash\n#SBATCH --partition=ondemand\nhostname\n"}
    with pytest.raises(SpecError) as info:
        parse(data)
    text = str(info.value)
    assert text.startswith("5 problems in the job spec:")
    for fragment in ("gpu_per_node: unknown key\n      hint: did you mean gpus_per_node?", "colour: unknown key",
                     "nodes: must be at least 1", "time_limit: missing", "script: line 2", "--partition"):
        assert fragment in text, text
    assert isinstance(info.value, SpecProblems) and len(info.value.problems) == 5


def test_one_problem_reads_as_one_line() -> None:
    with pytest.raises(SpecError) as info:
        parse(with_(nodes=0)())
    assert info.value.message == "nodes: must be at least 1, got 0"


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "PYTHONPATH", "HOME",
                                  "slurm_conf", "Sbatch_Account", "SRUN_CPU_BIND", "SALLOC_PARTITION",
                                  "gbroker_attempt", "BASH_FUNC_x%%", "NODE_OPTIONS"])
def test_env_names_that_steer_slurm_or_how_programs_load_are_refused(name: str) -> None:
    with pytest.raises(SpecError) as err:
        parse(with_(env={name: "x"})())
    assert name in err.value.message or "valid variable name" in err.value.message
    assert err.value.hint


def test_env_names_a_job_may_use() -> None:
    spec = parse(with_(env={"WANDB_MODE": "offline", "TMPDIR": "/scratch", "OMP_NUM_THREADS": "4"})())
    assert dict(spec.env) == {"WANDB_MODE": "offline", "TMPDIR": "/scratch", "OMP_NUM_THREADS": "4"}


def test_group_is_an_account_name_compared_ignoring_case() -> None:
    assert parse(with_(group="VISION")()).group == "vision"
    assert parse(with_(group="Vision-Lab")()).group == "vision-lab"


def test_a_deeply_nested_job_file_is_a_clear_error(tmp_path: Path) -> None:
    from broker.spec import load_job_file

    f = tmp_path / "deep.toml"
    f.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(SpecError) as err:
        load_job_file(str(f))
    assert str(f) in err.value.message and "nested" in err.value.message


def test_a_submit_of_flags_loads_no_parser_and_one_with_a_job_file_does(tmp_path: Path) -> None:
    """`gbroker submit -- cmd` names no file: the daemon parses it, the CLI never loads broker.spec."""
    job = tmp_path / "job.toml"
    job.write_text('group = "vision"\ntime_limit = "5m"\ncommand = ["true"]\n')
    code = (
        "import sys\nfrom broker.cli.main import main\n"
        "sys.argv = ['gbroker', '--socket', sys.argv[1], 'submit', *sys.argv[2:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('broker.spec' in sys.modules, 'dataclasses' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    nowhere = str(tmp_path / "no-daemon.sock")
    for args, loaded in ((["--group", "vision", "--time", "5m", "--", "python3", "train.py"], "False False"),
                         ([str(job)], "True True")):
        out = subprocess.run([sys.executable, "-c", code, nowhere, *args], capture_output=True, text=True,
                             cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
        assert out.stdout.strip() == loaded, out.stdout + out.stderr
        assert "daemon is not running" in out.stderr and "Nothing was submitted" in out.stderr, out.stderr


@pytest.mark.parametrize(("checkpoint", "words"), [
    ({"dir": "/scratch/ck"}, "checkpoint.style: a checkpoint dir needs a style"),
    ({"style": "none", "dir": "/scratch/ck"}, "checkpoint.dir: is never used with style 'none'"),
])
def test_a_checkpoint_dir_needs_a_style_that_uses_it(checkpoint: dict[str, Any], words: str) -> None:
    data = {"group": "vision", "time_limit": "1h", "command": ["true"], "checkpoint": checkpoint}
    with pytest.raises(SpecError, match=re.escape(words)):
        parse(data)
    # A spec stored before this rule is read back as it was.
    assert spec_from_dict(data).checkpoint_dir == "/scratch/ck"
