"""The job request's JSON Schema (broker/spec_schema.py) agrees with the parser it describes (broker/spec.py).

What the schema accepts, the daemon's parser (``spec_from_dict``) accepts; what the tables of wrong
specs send, both refuse, each naming the field. The checks a schema cannot write (a limit from the
settings, a rule between two fields, the script's #SBATCH lines) are refused by the parser alone, and
the field's description says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import openapi_spec_validator
import pytest
from hypothesis import given, settings
from test_spec import NOW, PARTITIONS, SCRIPT_OK, base, valid_specs

from broker import http_wire as hw, wiring
from broker.cli.jobs import build_request
from broker.errors import SpecError
from broker.jobs.submit import KEY_RE
from broker.pieces import MAX_CHUNK
from broker.spec import (
    CHECKPOINT_KEYS,
    MAX_AFTER,
    MAX_JOB_ID,
    MAX_RETRIES_LIMIT,
    SCRIPT_KEYS,
    TOP_LEVEL_KEYS,
    load_job_file,
    spec_from_dict,
    spec_to_dict,
)
from broker.spec_schema import job_spec_schema

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
SCHEMA = job_spec_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def daemon_parse(data: Any) -> Any:
    """The daemon's side of a submission: every check, no file read."""
    return spec_from_dict(data, now=NOW, partitions=PARTITIONS)


def schema_errors(data: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(spec)'}: {e.message}" for e in VALIDATOR.iter_errors(data)]


def with_(**changes: Any) -> dict[str, Any]:
    """base() from test_spec (a valid request) with fields changed; None drops one."""
    d = base()
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def script_job(script: Any) -> dict[str, Any]:
    return with_(command=None, script=script)


# --------------------------------------------------------------------------- the schema itself


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert job_spec_schema() == SCHEMA and job_spec_schema() is not SCHEMA  # a fresh copy each call


def test_its_fields_are_exactly_the_parsers():
    props = SCHEMA["properties"]
    assert list(props) == list(TOP_LEVEL_KEYS)
    assert SCHEMA["additionalProperties"] is False
    section = next(s for s in props["checkpoint"]["oneOf"] if s["type"] == "object")
    assert set(section["properties"]) == set(CHECKPOINT_KEYS) and section["additionalProperties"] is False
    section = next(s for s in props["script"]["oneOf"] if s["type"] == "object")
    assert set(section["properties"]) == set(SCRIPT_KEYS) and section["additionalProperties"] is False
    for name, field in props.items():
        assert field.get("description"), f"{name} has no description"


def test_a_limit_changed_in_the_parser_changes_the_schema(monkeypatch: pytest.MonkeyPatch):
    """The bounds are the parser's own constants, read when the schema is built."""
    import broker.spec_schema as ss

    monkeypatch.setattr(ss, "MAX_RETRIES_LIMIT", 7)
    assert ss.job_spec_schema()["properties"]["max_retries"]["maximum"] == 7
    assert SCHEMA["properties"]["max_retries"]["maximum"] == MAX_RETRIES_LIMIT


# --------------------------------------------------------------------------- what both accept


def accepted_by_both(data: dict[str, Any]) -> None:
    assert not schema_errors(data), (data, schema_errors(data))
    spec = daemon_parse(data)
    wire = json.loads(json.dumps(spec_to_dict(spec)))  # what a client that parsed it first sends
    assert not schema_errors(wire), (wire, schema_errors(wire))
    assert daemon_parse(wire) == spec


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_job_file_is_valid_under_the_schema_and_parses(path: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # the workdir a submit from here would get
    sent = build_request(str(path), {}, ())[0]  # what `gbroker submit FILE.toml` sends the daemon
    assert not schema_errors(sent), schema_errors(sent)
    assert spec_from_dict(sent, now=datetime.now(UTC)).name == load_job_file(str(path))["name"]
    written = load_job_file(str(path))  # the file as written is a valid request too (it names no file)
    assert not schema_errors(written), schema_errors(written)


def test_there_are_examples():
    assert len(EXAMPLES) >= 7


VALID: list[tuple[str, dict[str, Any]]] = [
    ("test_spec's base", base()),
    ("minimal", {"group": "lab", "time_limit": "90", "command": ["/usr/bin/blender", "-b", "scene.blend"]}),
    ("full request", with_(deadline="2026-09-03T00:00:00+02:00", interruptible=False,
                           checkpoint={"style": "signal", "dir": "/scratch/ana/ckpt/"}, partition="gpu-ondemand",
                           workdir="/home/ana/proj", env={"WANDB_MODE": "offline", "OMP_NUM_THREADS": "8"},
                           max_retries=0, signal_lead_s=300)),
    ("time limit in minutes", with_(time_limit=90)),
    ("time limit clock", with_(time_limit="1-02:00:00")),
    ("time limit spaced", with_(time_limit=" 2H ")),
    ("relative deadline", with_(deadline="+36h")),
    ("checkpoint style alone", with_(checkpoint="none")),
    ("pieces checkpoint", with_(checkpoint={"style": "pieces", "dir": "/scratch/frames"})),
    ("inline script", script_job(SCRIPT_OK)),
    ("script table", script_job({"text": SCRIPT_OK, "path": "/home/ana/job.sh"})),
    ("warning", with_(warning_signal="USR2", signal_lead_s=600)),
    ("no warning", with_(checkpoint={"style": "signal", "dir": "/s"}, warning_signal="none")),
    ("tasks per gpu", with_(tasks_per_node="gpu", cpus_per_task=8)),
    ("tasks", with_(tasks_per_node=4, cpus_per_gpu=16)),
    ("gpu type", with_(gpu="a100", gpu_mem_gb=80)),
    ("gpu types", with_(gpu=["a100", "h100-80gb"])),
    ("memory per node", with_(mem="512G")),
    ("memory per gpu in MB", with_(mem_per_gpu=65536)),
    ("memory with unit and B", with_(mem="1024MB")),
    ("array", with_(pieces="1-400:2%16", chunk=4)),
    ("array of a list", with_(pieces="1,5,9-12")),
    ("sweep", with_(sweep=["--lr 0.1", "--lr 0.01 --seed 2"])),
    ("after one", with_(after=12)),
    ("after", with_(after=[12, 13, MAX_JOB_ID])),
    ("after at the limit", with_(after=list(range(1, MAX_AFTER + 1)))),
    ("chunk at the limit", with_(pieces=f"1-{MAX_CHUNK}", chunk=MAX_CHUNK)),
    ("name at the limit", with_(name="n" * 64)),
    ("program path with a space", with_(command=["/opt/my tool/run", "x"])),
]


@pytest.mark.parametrize("data", [pytest.param(d, id=i) for i, d in VALID])
def test_valid_requests_are_valid_under_the_schema_and_parse(data: dict[str, Any]):
    accepted_by_both(data)


@settings(max_examples=150, deadline=None)
@given(valid_specs)
def test_the_parsers_generated_valid_requests_are_valid_under_the_schema(data: dict[str, Any]):
    """test_spec's strategy of valid requests (as its round-trip test fixes them up)."""
    ck = data.get("checkpoint")
    if ck and ck["style"] == "signal":
        ck["dir"] = "/scratch/ckpt"
    if ck and ck["style"] == "none":
        ck.pop("dir", None)
    data["deadline"] = (NOW + timedelta(seconds=int(data["time_limit"][:-1]) + 60)).isoformat()
    accepted_by_both(data)


# --------------------------------------------------------------------------- what both refuse

# (case, request, the field both must name; None: the request as a whole)
WRONG: list[tuple[str, Callable[[], Any], str | None]] = [
    ("not an object", lambda: [base()], None),
    ("unknown key", lambda: with_(colour="blue"), "colour"),
    ("unknown key close to one", lambda: with_(gpu_per_node=2), "gpu_per_node"),
    ("group missing", lambda: with_(group=None), "group"),
    ("time limit missing", lambda: with_(time_limit=None), "time_limit"),
    ("neither command nor script", lambda: with_(command=None), None),
    ("command and script", lambda: with_(script=SCRIPT_OK), None),
    ("a string where a number goes", lambda: with_(gpus_per_node="4"), "gpus_per_node"),
    ("a decimal where a whole number goes", lambda: with_(max_retries=1.5), "max_retries"),
    ("true where a number goes", lambda: with_(nodes=True), "nodes"),
    ("zero gpus", lambda: with_(gpus_per_node=0), "gpus_per_node"),
    ("a negative count", lambda: with_(gpus_per_node=-2), "gpus_per_node"),
    ("negative retries", lambda: with_(max_retries=-1), "max_retries"),
    ("too many retries", lambda: with_(max_retries=MAX_RETRIES_LIMIT + 1), "max_retries"),
    ("signal lead above an hour", lambda: with_(signal_lead_s=7200), "signal_lead_s"),
    ("gpu memory in MB", lambda: with_(gpu_mem_gb=81920), "gpu_mem_gb"),
    ("no cpus per gpu", lambda: with_(cpus_per_gpu=0), "cpus_per_gpu"),
    ("bad kind", lambda: with_(kind="training"), "kind"),
    ("kind a number", lambda: with_(kind=3), "kind"),
    ("bad checkpoint style", lambda: with_(checkpoint={"style": "sometimes"}), "checkpoint"),
    ("checkpoint key typo", lambda: with_(checkpoint={"style": "none", "dri": "/x"}), "checkpoint"),
    ("checkpoint a number", lambda: with_(checkpoint=3), "checkpoint"),
    ("relative checkpoint dir", lambda: with_(checkpoint={"style": "signal", "dir": "ckpt"}), "checkpoint"),
    ("bad warning signal", lambda: with_(warning_signal="KILL"), "warning_signal"),
    ("warning signal a number", lambda: with_(warning_signal=10), "warning_signal"),
    ("interruptible a string", lambda: with_(interruptible="yes"), "interruptible"),
    ("a name with a newline", lambda: with_(name="a\nb"), "name"),
    ("a name ending in a newline", lambda: with_(name="train\n"), "name"),
    ("a name with shell meta", lambda: with_(name="x;rm -rf ~"), "name"),
    ("a name starting with a dash", lambda: with_(name="--uid=0"), "name"),
    ("a name too long", lambda: with_(name="n" * 65), "name"),
    ("an empty name", lambda: with_(name=""), "name"),
    ("a group with a space", lambda: with_(group="vision lab"), "group"),
    ("a group list", lambda: with_(group=["lab"]), "group"),
    ("a partition with a comma", lambda: with_(partition="gpu,debug"), "partition"),
    ("time limit in words", lambda: with_(time_limit="two hours"), "time_limit"),
    ("time limit negative", lambda: with_(time_limit="-5m"), "time_limit"),
    ("time limit decimal", lambda: with_(time_limit="1.5h"), "time_limit"),
    ("time limit a decimal number", lambda: with_(time_limit=1.5), "time_limit"),
    ("time limit zero minutes", lambda: with_(time_limit=0), "time_limit"),
    ("time limit over a year in minutes", lambda: with_(time_limit=366 * 24 * 60), "time_limit"),
    ("time limit true", lambda: with_(time_limit=True), "time_limit"),
    ("deadline a number", lambda: with_(deadline=36), "deadline"),
    ("deadline in words", lambda: with_(deadline="next tuesday"), "deadline"),
    ("command one string", lambda: with_(command="python train.py"), "command"),
    ("command empty", lambda: with_(command=[]), "command"),
    ("command a number argument", lambda: with_(command=["python", 3]), "command"),
    ("command empty program", lambda: with_(command=["", "x"]), "command"),
    ("command with a newline", lambda: with_(command=["python", "-c", "1\n2"]), "command"),
    ("command with a NUL", lambda: with_(command=["python", "a\x00b"]), "command"),
    ("relative workdir", lambda: with_(workdir="runs/today"), "workdir"),
    ("workdir ending in a newline", lambda: with_(workdir="/home/ana\n"), "workdir"),
    ("env name with meta", lambda: with_(env={"A;B": "1"}), "env"),
    ("env name starting with a digit", lambda: with_(env={"1A": "x"}), "env"),
    ("env value a number", lambda: with_(env={"EPOCHS": 3}), "env"),
    ("env value with a NUL", lambda: with_(env={"X": "a\x00"}), "env"),
    ("env reserved for Slurm", lambda: with_(env={"SBATCH_ACCOUNT": "rich-lab"}), "env"),
    ("env reserved in lower case", lambda: with_(env={"slurm_conf": "/x"}), "env"),
    ("env of the loader", lambda: with_(env={"ld_preload": "/x.so"}), "env"),
    ("env PATH", lambda: with_(env={"Path": "/x"}), "env"),
    ("env a list", lambda: with_(env=["A=1"]), "env"),
    ("gpu type of digits", lambda: with_(gpu="2"), "gpu"),
    ("gpu type starting with a dash", lambda: with_(gpu="-x"), "gpu"),
    ("gpu types empty", lambda: with_(gpu=[]), "gpu"),
    ("gpu type twice", lambda: with_(gpu=["a100", "a100"]), "gpu"),
    ("too many gpu types", lambda: with_(gpu=[f"t{i}" for i in range(17)]), "gpu"),
    ("memory zero", lambda: with_(mem="0G"), "mem"),
    ("memory zero MB", lambda: with_(mem=0), "mem"),
    ("memory a decimal", lambda: with_(mem="1.5G"), "mem"),
    ("memory true", lambda: with_(mem=True), "mem"),
    ("memory both ways", lambda: with_(mem="64G", mem_per_gpu="16G"), "mem"),
    ("cpus both ways", lambda: with_(cpus_per_gpu=4, cpus_per_task=4), "cpus_per_gpu"),
    ("pieces a number", lambda: with_(pieces=40), "pieces"),
    ("pieces in words", lambda: with_(pieces="all of them"), "pieces"),
    ("pieces and a sweep", lambda: with_(pieces="1-2", sweep=["a", "b"]), "pieces"),
    ("chunk zero", lambda: with_(pieces="1-10", chunk=0), "chunk"),
    ("chunk too large", lambda: with_(pieces="1-10", chunk=MAX_CHUNK + 1), "chunk"),
    ("sweep a path on the wire", lambda: with_(sweep="/home/ana/points.txt"), "sweep"),
    ("sweep empty", lambda: with_(sweep=[]), "sweep"),
    ("sweep a blank line", lambda: with_(sweep=["--lr 1", "  "]), "sweep"),
    ("sweep a number line", lambda: with_(sweep=[3]), "sweep"),
    ("after list too long", lambda: with_(after=list(range(1, MAX_AFTER + 2))), "after"),
    ("after empty", lambda: with_(after=[]), "after"),
    ("after job zero", lambda: with_(after=[0]), "after"),
    ("after a string", lambda: with_(after=["12"]), "after"),
    ("after beyond the largest job", lambda: with_(after=[MAX_JOB_ID + 1]), "after"),
    ("tasks zero", lambda: with_(tasks_per_node=0), "tasks_per_node"),
    ("tasks a quoted number", lambda: with_(tasks_per_node="4"), "tasks_per_node"),
    ("script a path on the wire", lambda: script_job("/home/ana/job.sh"), "script"),
    ("script table without text on the wire", lambda: script_job({"path": "/home/ana/job.sh"}), "script"),
    ("script key typo", lambda: script_job({"txt": SCRIPT_OK}), "script"),
    ("script DOS line breaks", lambda: script_job("#!/bin/bash\r\necho hi\r\n"), "script"),
    ("script without #!", lambda: script_job("echo hi\nexit 0\n"), "script"),
    ("script with a NUL", lambda: script_job("#!/bin/bash\necho \x00\n"), "script"),
    ("script a number", lambda: script_job(42), "script"),
]


def blames(message: str, field: str) -> bool:
    return re.search(rf"(^|[^a-z_]){re.escape(field)}($|[^a-z_])", message) is not None


@pytest.mark.parametrize("build,field", [pytest.param(b, f, id=i) for i, b, f in WRONG])
def test_wrong_requests_are_refused_by_the_schema_and_the_parser(build: Callable[[], Any], field: str | None):
    data = build()
    errors = schema_errors(data)
    assert errors, f"the schema accepts {data!r}"
    with pytest.raises(SpecError) as refused:
        daemon_parse(data)
    if field is not None:
        assert any(blames(e, field) for e in errors), errors
        assert blames(str(refused.value), field), str(refused.value)


def test_there_are_many_wrong_requests():
    assert len(WRONG) >= 60


# --------------------------------------------------------------------------- what only the parser checks

# (case, request, the field, words its description says): refused by the parser, not expressible in the schema
PARSER_ONLY: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    ("more gpus than the largest node", lambda: with_(gpus_per_node=9), "gpus_per_node", "setting"),
    ("more nodes than the limit", lambda: with_(nodes=17), "nodes", "setting"),
    ("a partition the pools do not list", lambda: with_(partition="gpu-free"), "partition", "pools list"),
    ("a lead not shorter than the time limit", lambda: with_(time_limit="1m", signal_lead_s=120),
     "signal_lead_s", "shorter than the time limit"),
    ("a lead with no warning", lambda: with_(signal_lead_s=300, warning_signal="none"), "signal_lead_s",
     "only with a warning signal"),
    ("zero seconds", lambda: with_(time_limit="0s"), "time_limit", "more than zero"),
    ("a clock past 59", lambda: with_(time_limit="01:75:00"), "time_limit", "HH:MM:SS"),
    ("over a year", lambda: with_(time_limit="400d"), "time_limit", "at most a year"),
    ("a deadline in the past", lambda: with_(deadline="2026-08-31T12:00:00+00:00"), "deadline", "in the future"),
    ("a deadline without a zone", lambda: with_(deadline="2026-10-01T12:00:00"), "deadline", "with its zone"),
    ("a deadline before the time limit ends", lambda: with_(deadline="+1h"), "deadline", "now + time_limit"),
    ("cpus per gpu times gpus", lambda: with_(cpus_per_gpu=512), "cpus_per_gpu", "times the GPUs"),
    ("memory per gpu times gpus", lambda: with_(mem_per_gpu="8T"), "mem_per_gpu", "times the GPUs"),
    ("memory over 16 TiB as text", lambda: with_(mem="17T"), "mem", "16 TiB"),
    ("a gpu type twice in another case", lambda: with_(gpu=["a100", "A100"]), "gpu", "ignoring case"),
    ("a dir with style none", lambda: with_(checkpoint={"style": "none", "dir": "/x"}), "checkpoint",
     "a dir needs a style that uses it"),
    ("style signal without a dir", lambda: with_(checkpoint="signal"), "checkpoint", "needs a dir"),
    ("a chunk without pieces", lambda: with_(chunk=4), "chunk", "only with pieces"),
    ("a chunk of uneven pieces", lambda: with_(pieces="1,2,5", chunk=2), "chunk", "evenly"),
    ("an #SBATCH line that disagrees", lambda: script_job("#!/bin/bash\n#SBATCH --nodes=3\n"), "script",
     "must agree"),
    ("a script over 1 MiB in UTF-8", lambda: script_job("#!/bin/sh\n" + "é" * (600 * 1024)), "script", "UTF-8"),
    ("a program name with a space", lambda: with_(command=["python train.py"]), "command", "without a shell"),
]


@pytest.mark.parametrize("build,field,words", [pytest.param(b, f, w, id=i) for i, b, f, w in PARSER_ONLY])
def test_what_only_the_parser_checks_is_said_in_the_fields_description(build: Callable[[], dict[str, Any]],
                                                                       field: str, words: str):
    data = build()
    assert not schema_errors(data), schema_errors(data)
    with pytest.raises(SpecError) as refused:
        daemon_parse(data)
    assert field in str(refused.value), str(refused.value)
    assert words in SCHEMA["properties"][field]["description"]


# --------------------------------------------------------------------------- the served document


def served() -> dict[str, Any]:
    return hw.openapi(sorted(wiring.handlers(None, None)))


def body_validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """POST /v1/jobs's body schema, its references resolved inside the document."""
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**body, "components": doc["components"]})


def test_the_served_document_gives_the_schema_for_a_submission():
    doc = served()
    post = doc["paths"]["/v1/jobs"]["post"]
    assert post["requestBody"]["required"] is True
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmitRequest"}
    schemas = doc["components"]["schemas"]
    assert schemas["JobSpec"] == job_spec_schema()
    assert schemas["SubmitRequest"]["properties"]["spec"] == {"$ref": "#/components/schemas/JobSpec"}
    assert schemas["SubmitRequest"]["required"] == ["spec"]
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    openapi_spec_validator.validate(doc)  # an OpenAPI 3.1 document, every $ref found
    # The other body route still takes any operation's arguments.
    assert doc["paths"]["/v1/ops/{op}"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "type": "object"}


@pytest.mark.parametrize("body,ok", [
    ({"spec": base(), "key": "gb-0123abcd"}, True),
    ({"spec": base()}, True),
    ({"spec": base(), "key": "gb-ABCDEFGH"}, False),
    ({"spec": base(), "key": "gb-0123abcd\n"}, False),
    ({"spec": base(), "key": "gb-123"}, False),
    ({"spec": base(), "key": 12345678}, False),
    ({"key": "gb-0123abcd"}, False),
    ({"spec": base(), "log": "/home/ana/gbroker-train-llm-abcdef.out"}, True),  # the daemon checks the name
    ({"spec": base(), "log": 7}, False),
    ({"spec": base(), "owner": "carol"}, False),
    ({"spec": with_(colour="blue"), "key": "gb-0123abcd"}, False),
])
def test_the_envelope_in_the_document_is_the_one_the_daemon_reads(body: dict[str, Any], ok: bool):
    assert body_validator(served()).is_valid(body) is ok
    try:
        args = hw.route(hw.parse_head(b"POST /v1/jobs HTTP/1.1\r\n\r\n"), json.dumps(body).encode(), ["submit"]).args
        daemon_parse(args["spec"])
        key, log = args.get("key"), args.get("log", "")
        assert key is None or (isinstance(key, str) and KEY_RE.fullmatch(key) is not None)
        assert isinstance(log, str)  # which path is the daemon's to check, as the caller
    except (hw.HttpError, SpecError, AssertionError):
        assert not ok, body
    else:
        assert ok, body
