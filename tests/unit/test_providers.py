"""Unit tests of the provider contract: sweep plan, registry, command and local providers.

The command provider runs real subprocesses (tiny Python scripts standing in
for a site's cloud tooling); nothing here needs a cloud or Slurm.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.errors import BrokerError
from broker.nodes.providers.base import (
    Capacity,
    Instance,
    InstanceState,
    NodeRequest,
    ProviderCommandError,
    ProviderConfigError,
    ProviderError,
    ProviderUnreachable,
    ResumeIncomplete,
    from_name,
    interrupted_nodes,
    pick_current,
    provider_class,
    provider_names,
    sweep_plan,
)
from broker.nodes.providers.command import CommandProvider
from broker.nodes.providers.local import LocalProvider

T0 = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
GRACE = 600
REPO = Path(__file__).resolve().parents[2]


def inst(
    iid: str,
    node: str,
    state: str = "running",
    age_s: int = 3600,
    *,
    capacity: Capacity = Capacity.SPOT,
    interrupted: bool = False,
    now: datetime = T0,
) -> Instance:
    return Instance(
        instance_id=iid,
        node_name=node,
        capacity=capacity,
        state=InstanceState(state),
        launched_at=now - timedelta(seconds=age_s),
        interrupted=interrupted,
    )


# --------------------------------------------------------------------------- sweep_plan

SWEEP_CASES = [
    pytest.param([], set(), [], [], id="nothing"),
    pytest.param([inst("i-1", "spot1")], {"spot1"}, [], [], id="up-node-keeps-its-instance"),
    pytest.param([inst("i-1", "spot1")], set(), ["i-1"], [], id="node-not-up-is-terminated"),
    pytest.param([inst("i-1", "spot1", age_s=GRACE - 1)], set(), [], [],
                 id="young-instance-is-spared-while-booting"),
    pytest.param([inst("i-1", "spot1", age_s=GRACE)], set(), ["i-1"], [],
                 id="grace-boundary-is-inclusive"),
    pytest.param([inst("i-1", "spot1", "pending")], set(), ["i-1"], [],
                 id="pending-too-long-without-slurm"),
    pytest.param([inst("i-1", "spot1", "terminated")], set(), [], [], id="dead-is-ignored"),
    pytest.param([inst("i-1", "spot1", "shutting-down")], {"spot1"}, [], ["spot1"],
                 id="up-node-whose-instance-is-dying-is-marked-down"),
    pytest.param([], {"od1"}, [], ["od1"], id="up-node-without-instance-is-marked-down"),
    pytest.param([inst("i-1", "spot1", "stopped")], {"spot1"}, ["i-1"], ["spot1"],
                 id="stopped-instance-under-up-node"),
    pytest.param([inst("i-1", "", age_s=GRACE * 2)], set(), ["i-1"], [],
                 id="tagged-ours-but-no-node-name"),
    pytest.param([inst("i-1", "spot1", "unknown")], set(), ["i-1"], [],
                 id="unknown-state-is-not-kept"),
    pytest.param(
        [inst("i-old", "spot1", age_s=7200), inst("i-new", "spot1", age_s=3600)],
        {"spot1"}, ["i-new"], [], id="duplicate-keeps-the-oldest",
    ),
    pytest.param(
        [inst("i-old", "spot1", "pending", age_s=7200), inst("i-new", "spot1", age_s=3600)],
        {"spot1"}, ["i-old"], [], id="duplicate-keeps-the-running-one",
    ),
    pytest.param(
        [inst("i-a", "spot1"), inst("i-b", "spot1", age_s=GRACE - 60)],
        {"spot1"}, [], [], id="young-duplicate-waits-for-the-grace",
    ),
    pytest.param(
        [inst("i-1", "spot1"), inst("i-2", "spot2"), inst("i-3", "od1", "terminated")],
        {"spot1", "od1"}, ["i-2"], ["od1"], id="mixed",
    ),
]


@pytest.mark.parametrize(("instances", "up", "terminate", "mark_down"), SWEEP_CASES)
def test_sweep_plan(
    instances: list[Instance], up: set[str], terminate: list[str], mark_down: list[str]
) -> None:
    plan = sweep_plan(instances, up, T0, GRACE)
    assert [i.instance_id for i in plan.terminate] == terminate
    assert plan.mark_down == mark_down
    assert set(plan.reasons) == set(terminate)
    assert plan.empty == (not terminate and not mark_down)


def test_sweep_plan_is_pure_and_repeatable() -> None:
    items = [inst("i-1", "spot1"), inst("i-2", "ghost"), inst("i-3", "spot1", age_s=7200)]
    first = sweep_plan(items, ["spot1"], T0, GRACE)
    assert first == sweep_plan(list(reversed(items)), ["spot1"], T0, GRACE)
    assert first.reasons == {
        "i-1": "extra instance for spot1",
        "i-2": "node ghost is not up in Slurm",
    }


def test_pick_current_prefers_running_then_oldest_then_id() -> None:
    assert pick_current([]) is None
    assert pick_current([inst("i-1", "n", "terminated")]) is None
    a, b = inst("i-b", "n", age_s=10), inst("i-a", "n", age_s=10)
    assert pick_current([a, b]) == b
    p = inst("i-p", "n", "pending", age_s=999)
    assert pick_current([p, a]) == a


def test_interrupted_nodes_judges_the_current_instance() -> None:
    items = [
        inst("i-1", "spot1", "terminated", age_s=7200, interrupted=True),
        inst("i-2", "spot1", age_s=60),  # resumed since: healthy
        inst("i-3", "spot2", "terminated", interrupted=True),  # reclaimed, not resumed
        inst("i-4", "spot3", interrupted=True),  # notice given, still running
        inst("i-5", "spot4", "terminated", age_s=60),  # our own suspend, after ...
        inst("i-6", "spot4", "terminated", age_s=7200, interrupted=True),  # ... an old reclaim
    ]
    assert interrupted_nodes(items) == ["spot2", "spot3"]


# --------------------------------------------------------------------------- values


def test_capacity_spellings_and_errors() -> None:
    assert NodeRequest("n", "p", "on-demand").capacity is Capacity.ONDEMAND  # type: ignore[arg-type]
    assert NodeRequest("n", "p", "SPOT").capacity is Capacity.SPOT  # type: ignore[arg-type]
    with pytest.raises(ProviderConfigError, match="spot' or 'ondemand"):
        NodeRequest("n", "p", Capacity.NONE)
    with pytest.raises(ProviderConfigError):
        NodeRequest("n", "p", "reserved")  # type: ignore[arg-type]


def test_unknown_instance_state_is_unknown_not_dead() -> None:
    assert InstanceState.parse("rebooting") is InstanceState.UNKNOWN
    assert InstanceState.parse("shutting_down") is InstanceState.SHUTTING_DOWN


# --------------------------------------------------------------------------- registry


def test_registry_lists_valid_names_on_error() -> None:
    assert provider_names() == ["aws", "command", "local"]
    with pytest.raises(ProviderConfigError) as info:
        from_name("gcp")
    assert "aws, command, local" in str(info.value)
    assert isinstance(info.value, BrokerError) and info.value.exit_code == 2


def test_registry_rejects_unknown_and_missing_settings() -> None:
    with pytest.raises(ProviderConfigError) as info:
        from_name("command", resume_argv=["x"], suspend_argv=["y"], lst_argv=["z"])
    text = str(info.value)
    assert "unknown setting(s) lst_argv" in text
    assert "missing setting(s) list_argv" in text
    assert "accepted settings: resume_argv, suspend_argv, list_argv" in text


def test_registry_builds_each_provider(tmp_path: Path) -> None:
    assert provider_class("AWS").__name__ == "AwsProvider"
    cmd = from_name("command", resume_argv=["r"], suspend_argv=["s"], list_argv=["l"])
    assert isinstance(cmd, CommandProvider)
    local = from_name("local", state_dir=str(tmp_path))
    assert isinstance(local, LocalProvider) and local.state_dir == tmp_path


# --------------------------------------------------------------------------- command provider

SITE_CLOUD = textwrap.dedent(
    '''
    """A pretend rental platform: instances live in a JSON file."""
    import json, os, sys, time
    state_path = os.environ["CLOUD_STATE"]
    calls_path = state_path + ".calls"
    action, args = sys.argv[1], sys.argv[2:]
    stdin = sys.stdin.read() if action == "resume" else ""
    with open(calls_path, "a") as fh:
        fh.write(json.dumps({"action": action, "args": args, "stdin": stdin,
                             "cluster": os.environ.get("GBROKER_CLUSTER")}) + "\\n")
    try:
        state = json.load(open(state_path))
    except FileNotFoundError:
        state = {"next": 1, "instances": []}
    if os.environ.get("CLOUD_FAIL") == action:
        print("quota exceeded for gpu-large", file=sys.stderr)
        sys.exit(3)
    if os.environ.get("CLOUD_HANG") == action:
        time.sleep(60)
    if action == "resume":
        doc = json.loads(stdin)
        for node in doc["nodes"]:
            if os.environ.get("CLOUD_SKIP") == node["name"]:
                continue
            state["instances"].append({
                "instance_id": "vm-%d" % state["next"], "node": node["name"],
                "capacity": node["capacity"], "state": "pending",
                "launched_at": "2026-09-01T12:00:00Z", "private_ip": "10.0.0.%d" % state["next"],
                "partition": node["partition"], "instance_type": node["instance_type"]})
            state["next"] += 1
    elif action == "suspend":
        for i in state["instances"]:
            if i["node"] in args:
                i["state"] = "terminated"
    elif action == "terminate":
        for i in state["instances"]:
            if i["instance_id"] in args:
                i["state"] = "terminated"
    elif action == "list":
        if os.environ.get("CLOUD_GARBAGE"):
            print("instances: none, I think")
            sys.exit(0)
        print(json.dumps({"instances": state["instances"]}))
    json.dump(state, open(state_path, "w"))
    '''
)


class SiteCloud:
    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "site_cloud.py"
        self.script.write_text(SITE_CLOUD)
        self.state = tmp_path / "cloud.json"

    def argv(self, action: str) -> list[str]:
        return [sys.executable, str(self.script), action]

    def provider(self, env: dict[str, str] | None = None, **kw: Any) -> CommandProvider:
        return CommandProvider(
            self.argv("resume"), self.argv("suspend"), self.argv("list"),
            cluster_name="lab", env={"CLOUD_STATE": str(self.state), **(env or {})}, **kw,
        )

    def calls(self, action: str | None = None) -> list[dict[str, Any]]:
        path = Path(str(self.state) + ".calls")
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r for r in rows if action is None or r["action"] == action]

    def set_state(self, instance_id: str, **fields: Any) -> None:
        doc = json.loads(self.state.read_text())
        for i in doc["instances"]:
            if i["instance_id"] == instance_id:
                i.update(fields)
        self.state.write_text(json.dumps(doc))


@pytest.fixture
def site(tmp_path: Path) -> SiteCloud:
    return SiteCloud(tmp_path)


def test_command_resume_passes_names_and_json_and_returns_instances(site: SiteCloud) -> None:
    p = site.provider()
    got = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT, "gpu-small", generation="g1"),
                    NodeRequest("od1", "ondemand", Capacity.ONDEMAND)])

    assert [(i.node_name, i.capacity, i.state) for i in got] == [
        ("spot1", Capacity.SPOT, InstanceState.PENDING),
        ("od1", Capacity.ONDEMAND, InstanceState.PENDING),
    ]
    assert got[0].launched_at == datetime(2026, 9, 1, 12, tzinfo=UTC)
    (call,) = site.calls("resume")
    assert call["args"] == ["spot1", "od1"]
    assert call["cluster"] == "lab"
    assert json.loads(call["stdin"]) == {
        "cluster": "lab",
        "nodes": [
            {"name": "spot1", "partition": "spot", "capacity": "spot",
             "instance_type": "gpu-small", "generation": "g1"},
            {"name": "od1", "partition": "ondemand", "capacity": "ondemand",
             "instance_type": None, "generation": None},
        ],
    }


def test_command_resume_twice_runs_the_script_only_for_missing_nodes(site: SiteCloud) -> None:
    p = site.provider()
    first = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])
    second = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT),
                       NodeRequest("spot2", "spot", Capacity.SPOT)])

    assert second[0] == first[0]
    assert [c["args"] for c in site.calls("resume")] == [["spot1"], ["spot2"]]
    assert p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)]) == [first[0]]
    assert len(site.calls("resume")) == 2  # nothing left to boot: the script is not run


def test_command_resume_that_lists_nothing_is_incomplete(site: SiteCloud) -> None:
    p = site.provider(env={"CLOUD_SKIP": "spot2"})
    with pytest.raises(ResumeIncomplete) as info:
        p.resume([NodeRequest("spot1", "spot", Capacity.SPOT),
                  NodeRequest("spot2", "spot", Capacity.SPOT)])
    assert [i.node_name for i in info.value.instances] == ["spot1"]
    assert set(info.value.failures) == {"spot2"}
    assert "exit 0 only once" in str(info.value)


def test_command_suspend_terminate_and_interruptions(site: SiteCloud) -> None:
    p = site.provider(terminate_argv=site.argv("terminate"))
    _, b, c = p.resume([NodeRequest(n, "spot", Capacity.SPOT) for n in ("spot1", "spot2", "spot3")])
    p.suspend(["spot1", "nope"])
    p.terminate([b.instance_id])
    site.set_state(c.instance_id, interrupted=True)

    states = {i.node_name: i.state for i in p.instances()}
    assert states == {"spot1": InstanceState.TERMINATED, "spot2": InstanceState.TERMINATED,
                      "spot3": InstanceState.PENDING}
    assert site.calls("suspend")[0]["args"] == ["spot1", "nope"]
    assert site.calls("terminate")[0]["args"] == [b.instance_id]
    assert p.interruptions() == ["spot3"]
    p.suspend([])  # nothing to do: the script is not run
    assert len(site.calls("suspend")) == 1


def test_command_terminate_without_terminate_argv_suspends_the_node(site: SiteCloud) -> None:
    p = site.provider()
    (a,) = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])
    p.terminate([a.instance_id])
    assert site.calls("suspend")[0]["args"] == ["spot1"]
    with pytest.raises(ProviderError, match="does not own"):
        p.terminate(["vm-999"])


def test_command_failure_carries_argv_exit_code_and_stderr(site: SiteCloud) -> None:
    p = site.provider(env={"CLOUD_FAIL": "resume"})
    with pytest.raises(ProviderCommandError) as info:
        p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])
    err = info.value
    assert err.argv == site.argv("resume") + ["spot1"]
    assert err.returncode == 3
    assert "quota exceeded for gpu-large" in err.stderr
    assert "exit code 3" in str(err) and "quota exceeded" in str(err)
    assert err.hint and "by hand" in err.hint


def test_command_timeout_kills_the_script(site: SiteCloud) -> None:
    p = site.provider(env={"CLOUD_HANG": "suspend"},
                      timeout_s=1)
    start = time.monotonic()
    with pytest.raises(ProviderCommandError) as info:
        p.suspend(["spot1"])
    assert time.monotonic() - start < 10
    assert info.value.returncode is None
    assert "timed out after 1 s" in str(info.value)
    out = subprocess.run(["pgrep", "-f", str(site.script)], capture_output=True, text=True,
                         check=False)
    assert out.stdout.strip() == ""


def test_command_invalid_list_output_is_quoted(site: SiteCloud) -> None:
    p = site.provider(env={"CLOUD_GARBAGE": "1"})
    with pytest.raises(ProviderCommandError) as info:
        p.instances()
    assert "not JSON" in str(info.value) and "instances: none, I think" in str(info.value)
    assert "docs/PROVIDERS.md" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ({"node": "n", "capacity": "spot", "state": "running",
          "launched_at": "2026-09-01T12:00:00Z"}, "instance_id"),
        ({"instance_id": "x", "node": "n", "capacity": "cheap", "state": "running",
          "launched_at": "2026-09-01T12:00:00Z"}, "spot' or 'ondemand"),
        ({"instance_id": "x", "node": "n", "capacity": "spot", "state": "running",
          "launched_at": "2026-09-01T12:00:00"}, "UTC offset"),
    ],
)
def test_command_list_items_are_validated(site: SiteCloud, item: dict[str, Any], problem: str) -> None:
    script = site.script.parent / "lister.py"
    script.write_text(f"import json; print(json.dumps({{'instances': [{item!r}]}}))")
    p = CommandProvider(["r"], ["s"], [sys.executable, str(script)])
    with pytest.raises(ProviderCommandError, match="instances\\[0\\]") as info:
        p.instances()
    assert problem in str(info.value)


def test_command_missing_program_and_bad_argv(tmp_path: Path) -> None:
    p = CommandProvider(["r"], ["s"], [str(tmp_path / "no-such-cloud")])
    with pytest.raises(ProviderCommandError, match="not found") as info:
        p.instances()
    assert info.value.returncode is None and "absolute path" in (info.value.hint or "")
    with pytest.raises(ProviderConfigError, match="list of arguments"):
        CommandProvider("cloud resume", ["s"], ["l"])  # type: ignore[arg-type]
    with pytest.raises(ProviderConfigError, match="list of arguments"):
        CommandProvider([], ["s"], ["l"])


def test_site_commands_run_through_the_one_process_door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import proc
    from broker.nodes.providers.runner import run_argv

    monkeypatch.setenv("GB_FROM_DAEMON", "yes")
    res = run_argv([sys.executable, "-c", "import os, sys; sys.stdout.write(sys.stdin.read() + os.environ['GB_FROM_DAEMON']"
                    " + os.environ['GB_EXTRA'] + '\\r\\n')"], stdin="in:", env={"GB_EXTRA": "+x"})
    assert res.stdout == "in:yes+x\n" and res.stderr == ""
    script = tmp_path / "cloud"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(ProviderCommandError, match="not executable") as info:
        run_argv([str(script)])
    assert info.value.returncode is None and "Permission denied" in info.value.stderr
    assert "chmod +x" in (info.value.hint or "")
    with pytest.raises(ProviderCommandError, match="more than 1000 bytes"):
        run_argv(["yes"], timeout_s=30, max_output=1000)
    assert proc.DEFAULT_MAX_OUTPUT == 16 * 1024 * 1024  # the default bound


# --------------------------------------------------------------------------- aws (pure parts)


def aws_provider(**kw: Any) -> Any:
    from broker.nodes.providers.aws import AwsProvider

    settings: dict[str, Any] = {"ami": "ami-1234", "instance_types": {"spot": "g5.xlarge"}}
    settings.update(kw)
    return AwsProvider("us-east-1", "lab", endpoint_url="http://127.0.0.1:9", **settings)


def test_aws_client_token_is_stable_per_power_up() -> None:
    p = aws_provider()
    a = NodeRequest("spot1", "spot", Capacity.SPOT, generation="7")
    assert p.client_token(a) == p.client_token(NodeRequest("spot1", "spot", Capacity.SPOT,
                                                           generation="7"))
    assert p.client_token(a) != p.client_token(NodeRequest("spot1", "spot", Capacity.SPOT,
                                                           generation="8"))
    assert p.client_token(a) != p.client_token(NodeRequest("spot2", "spot", Capacity.SPOT,
                                                           generation="7"))
    assert p.client_token(a) != p.client_token(a, salt="+i-1")
    assert len(p.client_token(a)) <= 64 and p.client_token(a).isascii()


def test_aws_client_token_without_generation_uses_a_time_window() -> None:
    from broker.clock import FakeClock
    from broker.nodes.providers.aws import RESUME_TOKEN_WINDOW_SECONDS

    clock = FakeClock(datetime(2026, 9, 1, 12, 0, tzinfo=UTC))
    p = aws_provider(clock=clock)
    req = NodeRequest("spot1", "spot", Capacity.SPOT)
    first = p.client_token(req)
    clock.advance(1)
    assert p.client_token(req) == first
    clock.advance(RESUME_TOKEN_WINDOW_SECONDS)
    assert p.client_token(req) != first


def test_aws_launch_params_tag_at_launch_and_pick_the_market() -> None:
    p = aws_provider(spot_max_price="1.250", extra_tags={"team": "vision"},
                     security_group_ids=["sg-1"], subnet_id="subnet-1")
    sp = p.launch_params(NodeRequest("spot1", "spot", Capacity.SPOT), "tok")
    od = p.launch_params(NodeRequest("od1", "spot", Capacity.ONDEMAND, "g5.2xlarge"), "tok")

    assert sp["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
                        "MaxPrice": "1.250"},
    }
    assert "InstanceMarketOptions" not in od
    assert sp["InstanceType"] == "g5.xlarge" and od["InstanceType"] == "g5.2xlarge"
    tags = {t["Key"]: t["Value"] for t in sp["TagSpecifications"][0]["Tags"]}
    assert tags["gbroker:cluster"] == "lab" and tags["gbroker:node"] == "spot1"
    assert tags["team"] == "vision"
    assert [s["ResourceType"] for s in sp["TagSpecifications"]] == ["instance", "volume"]
    assert sp["ClientToken"] == "tok" and sp["SubnetId"] == "subnet-1"


def test_aws_settings_are_checked() -> None:
    from broker.nodes.providers.aws import AwsProvider

    with pytest.raises(ProviderConfigError, match="launch_template or an ami"):
        AwsProvider("us-east-1", "lab")
    with pytest.raises(ProviderConfigError, match="cluster_name"):
        AwsProvider("us-east-1", " ", ami="ami-1")
    with pytest.raises(ProviderConfigError, match="positive amount"):
        aws_provider(spot_max_price="-1")
    with pytest.raises(ProviderConfigError, match="positive amount"):
        aws_provider(spot_max_price="cheap")
    with pytest.raises(ProviderConfigError, match="gbroker's own tags"):
        aws_provider(extra_tags={"gbroker:node": "x"})
    with pytest.raises(ProviderConfigError, match="no instance type"):
        aws_provider().launch_params(NodeRequest("x", "gpu-big", Capacity.SPOT), "t")


def client_error(code: str, message: str = "nope") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, "RunInstances")


@pytest.mark.parametrize(
    ("code", "kind", "hint_word"),
    [
        ("InsufficientInstanceCapacity", "CapacityUnavailable", "another instance type"),
        ("MaxSpotInstanceCountExceeded", "CapacityUnavailable", "on-demand"),
        ("AuthFailure", "ProviderCredentialsError", "refresh"),
        ("UnauthorizedOperation", "ProviderCredentialsError", "ec2:RunInstances"),
        ("InvalidAMIID.NotFound", "ProviderConfigError", "ami"),
        ("SomethingNew", "ProviderError", "error code"),
    ],
)
def test_aws_error_mapping(code: str, kind: str, hint_word: str) -> None:
    from broker.nodes.providers.aws_errors import map_aws_error

    err = map_aws_error(client_error(code, "we ran out"), action="launch an instance",
                        nodes=["spot1"])
    assert type(err).__name__ == kind
    assert err.code == code
    assert "spot1" in err.message and "we ran out" in err.message
    assert hint_word in (err.hint or "")


def test_aws_missing_credentials_and_endpoint_mapping() -> None:
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    from broker.nodes.providers.aws_errors import map_aws_error
    from broker.nodes.providers.base import ProviderCredentialsError

    assert isinstance(map_aws_error(NoCredentialsError(), action="x"), ProviderCredentialsError)
    unreachable = map_aws_error(EndpointConnectionError(endpoint_url="http://x"), action="x")
    assert isinstance(unreachable, ProviderUnreachable)


class TokenReplayEc2:
    """Stands in for EC2's ClientToken memory: a token seen before answers with its old instance."""

    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {}
        self.launches = 0

    def remember(self, token: str, instance_id: str, state: str) -> None:
        self.tokens[token] = self._raw(instance_id, state)

    def run_instances(self, **params: Any) -> dict[str, Any]:
        token = params["ClientToken"]
        if token not in self.tokens:
            self.launches += 1
            self.tokens[token] = self._raw(f"i-new{self.launches}", "pending")
        return {"Instances": [self.tokens[token]]}

    @staticmethod
    def _raw(iid: str, state: str) -> dict[str, Any]:
        return {"InstanceId": iid, "State": {"Name": state}, "LaunchTime": T0,
                "Tags": [{"Key": "gbroker:node", "Value": "spot1"}]}


def test_aws_launch_salts_a_token_that_answers_with_a_dead_instance() -> None:
    p = aws_provider()
    fake = TokenReplayEc2()
    p._ec2 = fake
    req = NodeRequest("spot1", "spot", Capacity.SPOT, generation="g")
    fake.remember(p.client_token(req), "i-old", "terminated")

    got = p._launch(req)
    assert got.instance_id == "i-new1" and fake.launches == 1
    assert p._launch(req).instance_id == "i-new1"  # the retry is idempotent too
    assert fake.launches == 1


class SpotRequestEc2:
    """Stands in for the two EC2 reads behind interruptions() (moto does not link
    RunInstances spot instances to spot requests, so this path needs a stand-in)."""

    def __init__(self, raws: list[dict[str, Any]], statuses: dict[str, str]) -> None:
        self.raws = raws
        self.statuses = statuses
        self.asked: list[str] = []

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_instances"
        raws = self.raws

        class Pages:
            def paginate(self, Filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
                assert Filters[0] == {"Name": "tag:gbroker:cluster", "Values": ["lab"]}
                return [{"Reservations": [{"Instances": raws}]}]

        return Pages()

    def describe_spot_instance_requests(self, Filters: list[dict[str, Any]]) -> dict[str, Any]:
        (flt,) = Filters
        assert flt["Name"] == "spot-instance-request-id"
        self.asked.extend(flt["Values"])
        return {"SpotInstanceRequests": [
            {"SpotInstanceRequestId": sir, "Status": {"Code": self.statuses[sir]}}
            for sir in flt["Values"]
        ]}


def raw_spot(iid: str, node: str, state: str, sir: str | None, spot: bool = True) -> dict[str, Any]:
    raw: dict[str, Any] = {"InstanceId": iid, "State": {"Name": state}, "LaunchTime": T0,
                           "Tags": [{"Key": "gbroker:node", "Value": node}]}
    if spot:
        raw["InstanceLifecycle"] = "spot"
    if sir:
        raw["SpotInstanceRequestId"] = sir
    return raw


def test_aws_interruptions_read_the_two_minute_notice_from_spot_requests() -> None:
    p = aws_provider()
    fake = SpotRequestEc2(
        [
            raw_spot("i-1", "spot1", "running", "sir-1"),  # notice given, still running
            raw_spot("i-2", "spot2", "running", "sir-2"),  # healthy
            raw_spot("i-3", "spot3", "terminated", "sir-3"),  # we suspended it
            raw_spot("i-4", "od1", "running", None, spot=False),
        ],
        {"sir-1": "marked-for-termination", "sir-2": "fulfilled",
         "sir-3": "instance-terminated-by-user"},
    )
    p._ec2 = fake
    assert p.interruptions() == ["spot1"]
    assert sorted(fake.asked) == ["sir-1", "sir-2"]  # dead and on-demand need no lookup


# --------------------------------------------------------------------------- local provider


def load_devcluster(monkeypatch: pytest.MonkeyPatch, state: Path) -> Any:
    monkeypatch.setenv("GBROKER_DEVCLUSTER_DIR", str(state))
    path = REPO / "contrib" / "slurm" / "devcluster"
    loader = importlib.machinery.SourceFileLoader("devcluster_under_test", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def node_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose argv looks like a node's slurmd (-N spot1)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-N", "spot1"])
    yield proc
    proc.kill()
    proc.wait()


def test_local_provider_speaks_the_devcluster_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = load_devcluster(monkeypatch, tmp_path)
    p = LocalProvider(str(tmp_path))
    assert p.requests_dir == dev.REQUESTS and p.nodes_dir == dev.NODE_RECORDS

    got = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT),
                    NodeRequest("od1", "ondemand", Capacity.ONDEMAND)])
    assert [(i.node_name, i.state, i.capacity) for i in got] == [
        ("spot1", InstanceState.PENDING, Capacity.SPOT),
        ("od1", InstanceState.PENDING, Capacity.ONDEMAND),
    ]
    files = sorted(os.listdir(dev.REQUESTS))
    assert [f.split(".", 1)[1] for f in files] == ["resume.spot1", "resume.od1"]
    for f in files:  # read back the way the agent reads it
        req = json.loads((dev.REQUESTS / f).read_text())
        assert req["action"] == "resume" and isinstance(float(req["at"]), float)

    again = p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])
    assert again[0].instance_id == got[0].instance_id
    assert len(os.listdir(dev.REQUESTS)) == 2  # queued already: no second request

    p.suspend(["spot1"])
    assert sorted(f.split(".", 1)[1] for f in os.listdir(dev.REQUESTS)) == [
        "resume.od1", "resume.spot1", "suspend.spot1"]


def test_local_provider_reads_node_records(
    tmp_path: Path, node_process: subprocess.Popen[bytes]
) -> None:
    nodes = tmp_path / "cloud" / "nodes"
    nodes.mkdir(parents=True)
    booted = T0.timestamp()
    (nodes / "spot1.json").write_text(json.dumps(
        {"node": "spot1", "pid": node_process.pid, "timens": None, "booted_at": booted}))
    dead = subprocess.Popen([sys.executable, "-c", "pass", "-N", "od1"])
    dead.wait()
    (nodes / "od1.json").write_text(json.dumps(
        {"node": "od1", "pid": dead.pid, "timens": None, "booted_at": booted}))
    # A pid alive but belonging to another node's argv does not count for spot2.
    (nodes / "spot2.json").write_text(json.dumps(
        {"node": "spot2", "pid": node_process.pid, "timens": None, "booted_at": booted}))

    p = LocalProvider(str(tmp_path))
    found = {i.node_name: i for i in p.instances()}
    assert found["spot1"].state is InstanceState.RUNNING
    assert found["spot1"].launched_at == T0 and found["spot1"].capacity is Capacity.SPOT
    assert found["od1"].state is InstanceState.TERMINATED
    assert found["spot2"].state is InstanceState.TERMINATED
    assert p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])[0] == found["spot1"]
    assert not (tmp_path / "cloud" / "requests").exists()  # running: nothing queued
    assert p.interruptions() == []


def test_local_provider_errors(tmp_path: Path) -> None:
    p = LocalProvider(str(tmp_path / "missing"))
    with pytest.raises(ProviderUnreachable, match="devcluster up"):
        p.resume([NodeRequest("spot1", "spot", Capacity.SPOT)])
    with pytest.raises(ProviderConfigError):
        LocalProvider(str(tmp_path)).suspend(["../etc"])
