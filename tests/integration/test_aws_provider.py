"""AwsProvider against moto running as a real HTTP server on loopback.

boto3 talks to it over HTTP through ``endpoint_url`` with dummy credentials;
nothing in boto3 or in our code is patched. The one thing the EC2 API cannot
do is reclaim a spot instance (only AWS itself does that), so that test plays
the cloud's part by changing the instance inside the server, then reads the
result back through the API like production would.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from broker.nodes.providers.aws import AwsProvider
from broker.nodes.providers.base import (
    CLUSTER_TAG,
    NODE_TAG,
    Capacity,
    InstanceState,
    NodeRequest,
    ProviderConfigError,
    ProviderCredentialsError,
    ProviderError,
    ProviderUnreachable,
    ResumeIncomplete,
    from_name,
    sweep_plan,
)

REGION = "us-east-1"
CLUSTER = "lab"
MOTO_ACCOUNT = "123456789012"
"""moto's default account id: the server keeps its state under it."""
GRACE_S = 600


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        # The server lives in this process; without its catalogue of public AMIs
        # each reset takes milliseconds instead of seconds.
        mp.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, moto_url: str) -> str:
    """Dummy credentials, no shared config, and an empty server for each test."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    req = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    return moto_url


@pytest.fixture
def ec2(aws_env: str) -> Any:
    """A plain boto3 client: the test's own eyes on the cloud, independent of the provider."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=aws_env)


@pytest.fixture
def ami(ec2: Any) -> str:
    """An image id; moto launches any well-formed one (AMI validation is off by default)."""
    return "ami-0a1b2c3d4e5f60718"


@pytest.fixture
def provider(aws_env: str, ami: str) -> AwsProvider:
    p = from_name(
        "aws",
        region=REGION,
        cluster_name=CLUSTER,
        ami=ami,
        instance_types={"spot": "g5.xlarge", "ondemand": "g5.2xlarge"},
        endpoint_url=aws_env,
        max_attempts=1,
    )
    assert isinstance(p, AwsProvider)
    return p


def spot(name: str, **kw: Any) -> NodeRequest:
    return NodeRequest(name=name, partition="spot", capacity=Capacity.SPOT, **kw)


def ondemand(name: str, **kw: Any) -> NodeRequest:
    return NodeRequest(name=name, partition="ondemand", capacity=Capacity.ONDEMAND, **kw)


def raw_instances(ec2: Any, filters: dict[str, str] | None = None) -> list[dict[str, Any]]:
    flt = [{"Name": k, "Values": [v]} for k, v in (filters or {}).items()]
    out: list[dict[str, Any]] = []
    for res in ec2.describe_instances(Filters=flt)["Reservations"]:
        out.extend(res["Instances"])
    return out


def tags_of(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def state_of(ec2: Any, instance_id: str) -> str:
    raw = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return str(raw["State"]["Name"])


def launch_foreign(ec2: Any, ami: str, tags: dict[str, str]) -> str:
    """An instance someone else launched (another cluster, or by hand)."""
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    kwargs: dict[str, Any] = {"ImageId": ami, "InstanceType": "t3.micro", "MinCount": 1, "MaxCount": 1}
    if tags:
        kwargs["TagSpecifications"] = spec
    return str(ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"])


# --------------------------------------------------------------------------- resume


def test_resume_launches_tagged_instances_with_the_partitions_market(
    provider: AwsProvider, ec2: Any
) -> None:
    got = provider.resume([spot("spot1"), ondemand("od1")])

    assert [i.node_name for i in got] == ["spot1", "od1"]
    assert [i.capacity for i in got] == [Capacity.SPOT, Capacity.ONDEMAND]
    assert all(i.state in (InstanceState.PENDING, InstanceState.RUNNING) for i in got)
    assert all(i.private_ip for i in got)

    by_node = {tags_of(r)[NODE_TAG]: r for r in raw_instances(ec2)}
    assert set(by_node) == {"spot1", "od1"}
    s, o = by_node["spot1"], by_node["od1"]
    assert s.get("InstanceLifecycle") == "spot"
    assert o.get("InstanceLifecycle") in (None, "", "scheduled") and o.get("InstanceLifecycle") != "spot"
    assert s["InstanceType"] == "g5.xlarge" and o["InstanceType"] == "g5.2xlarge"
    for raw, partition, capacity in ((s, "spot", "spot"), (o, "ondemand", "ondemand")):
        tags = tags_of(raw)
        assert tags[CLUSTER_TAG] == CLUSTER
        assert tags["gbroker:partition"] == partition
        assert tags["gbroker:capacity"] == capacity
    assert s["InstanceId"] == got[0].instance_id and o["InstanceId"] == got[1].instance_id


def test_resume_twice_for_the_same_node_launches_once(
    provider: AwsProvider, ec2: Any, aws_env: str, ami: str
) -> None:
    first = provider.resume([spot("spot1")])
    # A second ResumeProgram run is a separate process: a fresh provider object.
    again = from_name("aws", region=REGION, cluster_name=CLUSTER, ami=ami,
                      instance_types={"spot": "g5.xlarge"}, endpoint_url=aws_env)
    second = again.resume([spot("spot1"), spot("spot2")])

    assert second[0].instance_id == first[0].instance_id
    assert second[1].node_name == "spot2" and second[1].instance_id != first[0].instance_id
    assert len(raw_instances(ec2, {f"tag:{NODE_TAG}": "spot1"})) == 1
    assert len(raw_instances(ec2)) == 2


def test_resume_after_suspend_boots_a_new_instance(provider: AwsProvider, ec2: Any) -> None:
    old = provider.resume([spot("spot1")])[0]
    provider.suspend(["spot1"])
    new = provider.resume([spot("spot1")])[0]

    assert new.instance_id != old.instance_id
    assert state_of(ec2, old.instance_id) == "terminated"
    assert state_of(ec2, new.instance_id) in ("pending", "running")


def test_launch_template_supplies_image_and_type(aws_env: str, ec2: Any, ami: str) -> None:
    ec2.create_launch_template(
        LaunchTemplateName="gpu-node",
        LaunchTemplateData={"ImageId": ami, "InstanceType": "g4dn.xlarge"},
    )
    p = AwsProvider(REGION, CLUSTER, launch_template="gpu-node", endpoint_url=aws_env)
    got = p.resume([spot("spot3")])[0]

    raw = raw_instances(ec2)[0]
    assert raw["InstanceId"] == got.instance_id
    assert raw["InstanceType"] == "g4dn.xlarge" and raw["ImageId"] == ami
    assert raw.get("InstanceLifecycle") == "spot"
    assert tags_of(raw)[NODE_TAG] == "spot3" and tags_of(raw)[CLUSTER_TAG] == CLUSTER


# --------------------------------------------------------------------------- suspend


def test_suspend_terminates_and_is_idempotent(provider: AwsProvider, ec2: Any) -> None:
    a, b, c = provider.resume([spot("spot1"), spot("spot2"), ondemand("od1")])
    provider.suspend(["spot1", "od1"])
    provider.suspend(["spot1", "od1", "never-resumed"])  # again, plus an unknown node

    assert state_of(ec2, a.instance_id) == "terminated"
    assert state_of(ec2, c.instance_id) == "terminated"
    assert state_of(ec2, b.instance_id) in ("pending", "running")
    alive = {i.node_name for i in provider.instances() if i.alive}
    assert alive == {"spot2"}


# --------------------------------------------------------------------------- sweep


def test_untracked_instance_is_swept_after_the_grace_period(
    provider: AwsProvider, ec2: Any, ami: str
) -> None:
    kept = provider.resume([spot("spot1")])[0]
    # Left behind by a crash: tagged ours, but Slurm never heard of the node.
    ghost = launch_foreign(ec2, ami, {CLUSTER_TAG: CLUSTER, NODE_TAG: "ghost1"})

    found = provider.instances()
    assert {i.instance_id for i in found} == {kept.instance_id, ghost}
    launched = max(i.launched_at for i in found)

    early = sweep_plan(found, {"spot1", "od2"}, launched + timedelta(seconds=GRACE_S - 5), GRACE_S)
    assert early.terminate == []
    assert early.mark_down == ["od2"]  # Slurm thinks od2 is up, but no instance backs it

    plan = sweep_plan(found, {"spot1", "od2"}, launched + timedelta(seconds=GRACE_S + 1), GRACE_S)
    assert [i.instance_id for i in plan.terminate] == [ghost]
    assert plan.mark_down == ["od2"]

    provider.terminate([i.instance_id for i in plan.terminate])
    assert state_of(ec2, ghost) == "terminated"
    assert state_of(ec2, kept.instance_id) in ("pending", "running")
    # Applied once, the next plan is empty of terminations: the sweep converges.
    after = sweep_plan(provider.instances(), {"spot1"}, launched + timedelta(hours=1), GRACE_S)
    assert after.terminate == [] and after.mark_down == []


def test_another_clusters_instance_is_never_touched(
    provider: AwsProvider, ec2: Any, ami: str
) -> None:
    theirs = launch_foreign(ec2, ami, {CLUSTER_TAG: "other-lab", NODE_TAG: "spot1"})
    untagged = launch_foreign(ec2, ami, {})

    assert provider.instances() == []
    mine = provider.resume([spot("spot1")])[0]
    assert mine.instance_id not in (theirs, untagged)

    provider.suspend(["spot1"])
    plan = sweep_plan(provider.instances(), set(), mine.launched_at + timedelta(days=1), GRACE_S)
    assert theirs not in {i.instance_id for i in plan.terminate}
    with pytest.raises(ProviderError, match="refusing to terminate"):
        provider.terminate([theirs, untagged])

    assert state_of(ec2, theirs) == "running"
    assert state_of(ec2, untagged) == "running"
    assert state_of(ec2, mine.instance_id) == "terminated"


# --------------------------------------------------------------------------- interruptions


def reclaim_like_aws(instance_id: str) -> None:
    """What EC2 does to a reclaimed spot instance, done inside the moto server."""
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    inst = ec2_backends[MOTO_ACCOUNT][REGION].get_instance(instance_id)
    inst.terminate()
    inst.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )


def test_a_reclaimed_spot_instance_is_reported_once_per_power_up(
    provider: AwsProvider, ec2: Any
) -> None:
    s1, _, _ = provider.resume([spot("spot1"), spot("spot2"), ondemand("od1")])
    assert provider.interruptions() == []

    reclaim_like_aws(s1.instance_id)
    provider.suspend(["spot2"])  # our own termination is not an interruption

    assert provider.interruptions() == ["spot1"]
    assert state_of(ec2, s1.instance_id) == "terminated"

    # Resumed again, the node is healthy; the old reclaimed instance no longer counts.
    provider.resume([spot("spot1")])
    assert provider.interruptions() == []


# --------------------------------------------------------------------------- errors


def test_unknown_subnet_is_a_config_error_for_that_node(aws_env: str, ami: str) -> None:
    p = AwsProvider(REGION, CLUSTER, ami=ami, instance_types={"spot": "g5.xlarge"},
                    subnet_id="subnet-00000000", endpoint_url=aws_env, max_attempts=1)
    with pytest.raises(ResumeIncomplete) as info:
        p.resume([spot("spot1")])
    assert info.value.instances == []
    err = info.value.failures["spot1"]
    assert isinstance(err, ProviderConfigError)
    assert err.code == "InvalidSubnetID.NotFound"
    assert "subnet_id" in (err.hint or "")
    assert "spot1" in str(info.value)


def test_unreachable_endpoint_says_what_to_check(aws_env: str, ami: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    p = AwsProvider(REGION, CLUSTER, ami=ami, instance_types={"spot": "g5.xlarge"},
                    endpoint_url=f"http://127.0.0.1:{dead}", max_attempts=1, connect_timeout_s=2)
    with pytest.raises(ProviderUnreachable) as info:
        p.resume([spot("spot1")])
    assert "endpoint_url" in (info.value.hint or "")


def test_missing_credentials_say_how_to_provide_them(
    aws_env: str, ami: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    p = AwsProvider(REGION, CLUSTER, ami=ami, instance_types={"spot": "g5.xlarge"},
                    endpoint_url=aws_env, max_attempts=1)
    with pytest.raises(ProviderCredentialsError) as info:
        p.instances()
    assert "AWS_PROFILE" in (info.value.hint or "")
