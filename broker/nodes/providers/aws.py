"""AWS EC2 node provider (boto3).

Every instance is launched with its tags (``gbroker:cluster``, ``gbroker:node``,
...) in the RunInstances call itself, never tagged afterwards: an instance
that exists is always findable, even if we crash right after launching it.

Idempotency, in two layers:
1. Before launching, describe this cluster's instances by tag; a node that
   already has a pending/running instance gets it back.
2. RunInstances carries a ClientToken derived from (cluster, node, resume
   generation), so a retried call for the same power-up (a botocore retry, or
   a second resume that ran before the first launch became visible) returns
   the first instance instead of booting another. If the token answers with a
   dead instance (an earlier power-up that used the same generation), the
   token is salted with that instance's id and the launch retried.

Spot interruptions are read from the API (no agent on the instance needed):
the instance's StateReason (``Server.SpotInstanceTermination``) once reclaimed,
and the spot request status (``marked-for-termination`` is the two-minute
notice; ``instance-terminated-by-price`` etc. afterwards).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from broker.clock import Clock, SystemClock
from broker.nodes.providers.aws_errors import map_aws_error
from policies import Capacity

from broker.nodes.providers.base import (
    CAPACITY_TAG,
    CLUSTER_TAG,
    DEAD,
    NODE_TAG,
    PARTITION_TAG,
    Instance,
    InstanceState,
    NodeRequest,
    Provider,
    ProviderConfigError,
    ProviderCredentialsError,
    ProviderError,
    ProviderUnreachable,
    ResumeIncomplete,
    interrupted_nodes,
    pick_current,
)

RESUME_TOKEN_WINDOW_SECONDS = 900
"""Without an explicit generation, resumes of one node within the same window of
this many seconds share a ClientToken (so a duplicate resume cannot double-launch)."""
MAX_TOKEN_SALTS = 3
"""How many times a launch re-salts its ClientToken after it answered with a dead instance."""
TERMINATE_BATCH = 500
"""Instance ids per TerminateInstances call (EC2 accepts up to 1000)."""
FILTER_VALUES_BATCH = 150
"""Values per DescribeInstances filter (EC2 caps a filter at 200 values)."""

SPOT_RECLAIM_STATE_REASONS: frozenset[str] = frozenset(
    {
        "Server.SpotInstanceTermination",
        "Server.SpotInstanceShutdown",
        "Server.SpotInstanceHibernate",
    }
)
"""Instance StateReason codes EC2 sets when *it* stopped or terminated a spot instance."""

SPOT_RECLAIM_REQUEST_CODES: frozenset[str] = frozenset(
    {
        "marked-for-termination",
        "marked-for-stop",
        "marked-for-hibernation",
        "instance-terminated-by-price",
        "instance-terminated-no-capacity",
        "instance-terminated-capacity-oversubscribed",
        "instance-terminated-launch-group-constraint",
        "instance-stopped-by-price",
        "instance-stopped-no-capacity",
        "instance-stopped-capacity-oversubscribed",
        "instance-hibernated-by-price",
        "instance-hibernated-no-capacity",
        "instance-hibernated-capacity-oversubscribed",
    }
)
"""Spot request status codes meaning "EC2 is taking it back" (notice, or done).
Codes such as ``instance-terminated-by-user`` are our own suspend, not a reclaim."""

IDEMPOTENT_MISMATCH = "IdempotentParameterMismatch"


class AwsProvider(Provider):
    """Nodes as EC2 instances: spot or on-demand per request, tagged at launch."""

    name = "aws"

    def __init__(
        self,
        region: str,
        cluster_name: str,
        *,
        launch_template: str | None = None,
        launch_template_version: str = "$Latest",
        ami: str | None = None,
        instance_types: dict[str, str] | None = None,
        default_instance_type: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        spot_max_price: str | None = None,
        extra_tags: dict[str, str] | None = None,
        endpoint_url: str | None = None,
        max_attempts: int = 3,
        connect_timeout_s: int = 10,
        read_timeout_s: int = 60,
        clock: Clock | None = None,
    ) -> None:
        if not cluster_name or not str(cluster_name).strip():
            raise ProviderConfigError(
                "aws provider needs a cluster_name", hint="set cluster_name; it becomes the gbroker:cluster tag"
            )
        if not launch_template and not ami:
            raise ProviderConfigError(
                "aws provider needs either a launch_template or an ami",
                hint="set launch_template (name or lt-... id), or ami plus instance_types",
            )
        self.region = region
        self.cluster_name = str(cluster_name).strip()
        self.launch_template = launch_template
        self.launch_template_version = launch_template_version
        self.ami = ami
        self.instance_types = dict(instance_types or {})
        self.default_instance_type = default_instance_type
        self.subnet_id = subnet_id
        self.security_group_ids = list(security_group_ids)
        self.key_name = key_name
        self.iam_instance_profile = iam_instance_profile
        self.spot_max_price = _check_price(spot_max_price)
        self.extra_tags = dict(extra_tags or {})
        reserved = [k for k in self.extra_tags if k.startswith("gbroker:")]
        if reserved:
            raise ProviderConfigError(
                f"extra_tags may not set gbroker's own tags: {', '.join(reserved)}",
                hint="remove them; gbroker sets gbroker:* tags itself",
            )
        self.endpoint_url = endpoint_url
        self.clock: Clock = clock or SystemClock()
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
        )
        self._ec2 = boto3.session.Session().client(
            "ec2", region_name=region, endpoint_url=endpoint_url, config=config
        )

    # ------------------------------------------------------------------ contract

    def instances(self) -> list[Instance]:
        return [self._to_instance(raw) for raw in self._describe(self._cluster_filter())]

    def resume(self, nodes: list[NodeRequest]) -> list[Instance]:
        names = [n.name for n in nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ProviderConfigError(
                f"resume asked twice for node(s) {', '.join(dupes)} in one call",
                hint="pass each node once",
            )
        existing: dict[str, list[Instance]] = {}
        for inst in self._describe_nodes(names):
            existing.setdefault(inst.node_name, []).append(inst)
        result: list[Instance] = []
        failures: dict[str, ProviderError] = {}
        for req in nodes:
            current = pick_current(existing.get(req.name, []))
            if current is not None:
                result.append(current)
                continue
            try:
                result.append(self._launch(req))
            except (ProviderCredentialsError, ProviderUnreachable):
                raise  # every other node would fail the same way
            except ProviderError as exc:
                failures[req.name] = exc
        if failures:
            raise ResumeIncomplete(result, failures)
        return result

    def suspend(self, names: list[str]) -> None:
        if not names:
            return
        ids = [i.instance_id for i in self._describe_nodes(names) if i.state not in DEAD]
        self._terminate_ids(ids, nodes=names)

    def terminate(self, instance_ids: list[str]) -> None:
        if not instance_ids:
            return
        wanted = list(dict.fromkeys(instance_ids))
        ours: dict[str, Instance] = {}
        for chunk in _chunks(wanted, FILTER_VALUES_BATCH):
            filters = self._cluster_filter() + [{"Name": "instance-id", "Values": chunk}]
            for raw in self._describe(filters):
                inst = self._to_instance(raw)
                ours[inst.instance_id] = inst
        foreign = [i for i in wanted if i not in ours]
        if foreign:
            raise ProviderError(
                f"refusing to terminate instance(s) not tagged {CLUSTER_TAG}={self.cluster_name}: "
                f"{', '.join(foreign)}",
                hint="the sweep only terminates instances this cluster launched",
            )
        self._terminate_ids([i for i in wanted if ours[i].state not in DEAD], nodes=())

    def interruptions(self) -> list[str]:
        raws = list(self._describe(self._cluster_filter()))
        found = [self._to_instance(raw) for raw in raws]
        # Spot request status carries the two-minute notice (marked-for-*) while
        # the instance still runs; only live spot instances need the lookup.
        request_of = {
            raw["SpotInstanceRequestId"]: inst.instance_id
            for raw, inst in zip(raws, found, strict=False)
            if raw.get("SpotInstanceRequestId") and inst.capacity is Capacity.SPOT and not inst.dead
        }
        reclaimed: set[str] = set()
        for chunk in _chunks(list(request_of), FILTER_VALUES_BATCH):
            resp = self._call(
                "read spot request status",
                self._ec2.describe_spot_instance_requests,
                Filters=[{"Name": "spot-instance-request-id", "Values": chunk}],
            )
            for sir in resp.get("SpotInstanceRequests", []):
                if sir.get("Status", {}).get("Code") in SPOT_RECLAIM_REQUEST_CODES:
                    reclaimed.add(request_of.get(sir.get("SpotInstanceRequestId", ""), ""))
        marked = [replace(i, interrupted=True) if i.instance_id in reclaimed else i for i in found]
        return interrupted_nodes(marked)

    # ------------------------------------------------------------------ launching

    def client_token(self, req: NodeRequest, salt: str = "") -> str:
        """The ClientToken for this power-up of ``req.name`` (at most 64 ASCII chars)."""
        generation = req.generation
        if generation is None:
            generation = f"w{int(self.clock.now().timestamp()) // RESUME_TOKEN_WINDOW_SECONDS}"
        key = f"{self.cluster_name}|{req.name}|{generation}|{salt}"
        return "gb-" + hashlib.sha256(key.encode()).hexdigest()[:48]

    def launch_params(self, req: NodeRequest, token: str) -> dict[str, Any]:
        """RunInstances arguments for one node (tags, market, image or template)."""
        tags = [
            {"Key": CLUSTER_TAG, "Value": self.cluster_name},
            {"Key": NODE_TAG, "Value": req.name},
            {"Key": PARTITION_TAG, "Value": req.partition},
            {"Key": CAPACITY_TAG, "Value": req.capacity.value},
            {"Key": "Name", "Value": f"{self.cluster_name}-{req.name}"},
        ] + [{"Key": k, "Value": v} for k, v in sorted(self.extra_tags.items())]
        params: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }
        if self.launch_template:
            key = "LaunchTemplateId" if self.launch_template.startswith("lt-") else "LaunchTemplateName"
            params["LaunchTemplate"] = {key: self.launch_template, "Version": self.launch_template_version}
        else:
            params["ImageId"] = self.ami
        itype = req.instance_type or self.instance_types.get(req.partition) or self.default_instance_type
        if itype:
            params["InstanceType"] = itype
        elif not self.launch_template:
            raise ProviderConfigError(
                f"no instance type for node {req.name} (partition {req.partition!r})",
                hint=f"add {req.partition!r} to instance_types, or set default_instance_type",
            )
        if self.subnet_id:
            params["SubnetId"] = self.subnet_id
        if self.security_group_ids:
            params["SecurityGroupIds"] = list(self.security_group_ids)
        if self.key_name:
            params["KeyName"] = self.key_name
        if self.iam_instance_profile:
            key = "Arn" if self.iam_instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: self.iam_instance_profile}
        if req.capacity is Capacity.SPOT:
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if self.spot_max_price:
                spot["MaxPrice"] = self.spot_max_price
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        return params

    def _launch(self, req: NodeRequest) -> Instance:
        salt = ""
        for _ in range(MAX_TOKEN_SALTS + 1):
            params = self.launch_params(req, self.client_token(req, salt))
            try:
                resp = self._ec2.run_instances(**params)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == IDEMPOTENT_MISMATCH:
                    # The token was used before with other settings (config changed
                    # between power-ups): this is a new launch, salt the token.
                    salt = f"{salt}+mismatch"
                    continue
                raise map_aws_error(exc, action="launch an instance", nodes=[req.name]) from exc
            except BotoCoreError as exc:
                raise map_aws_error(exc, action="launch an instance", nodes=[req.name]) from exc
            inst = self._to_instance(resp["Instances"][0])
            if inst.state not in DEAD:
                return inst
            # The token answered with an earlier, dead power-up of this node.
            salt = f"{salt}+{inst.instance_id}"
        raise ProviderError(
            f"could not get a fresh ClientToken for node {req.name} after {MAX_TOKEN_SALTS} tries",
            hint="pass a new resume generation for this node",
        )

    # ------------------------------------------------------------------ reading

    def _cluster_filter(self) -> list[dict[str, Any]]:
        return [{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster_name]}]

    def _describe_nodes(self, names: Sequence[str]) -> list[Instance]:
        out: list[Instance] = []
        for chunk in _chunks(list(dict.fromkeys(names)), FILTER_VALUES_BATCH):
            filters = self._cluster_filter() + [{"Name": f"tag:{NODE_TAG}", "Values": chunk}]
            out.extend(self._to_instance(raw) for raw in self._describe(filters))
        return out

    def _describe(self, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        pages = self._ec2.get_paginator("describe_instances").paginate(Filters=filters)
        try:
            for page in pages:
                for reservation in page.get("Reservations", []):
                    yield from reservation.get("Instances", [])
        except (ClientError, BotoCoreError) as exc:
            raise map_aws_error(exc, action="list instances") from exc

    def _to_instance(self, raw: dict[str, Any]) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        spot = raw.get("InstanceLifecycle") == "spot"
        state = InstanceState.parse(raw.get("State", {}).get("Name", ""))
        reason = (raw.get("StateReason") or {}).get("Code", "")
        launched = raw.get("LaunchTime")
        if isinstance(launched, datetime):
            launched_at = launched.astimezone(UTC)
        else:
            launched_at = datetime.fromtimestamp(0, UTC)
        return Instance(
            instance_id=raw["InstanceId"],
            node_name=tags.get(NODE_TAG, ""),
            capacity=Capacity.SPOT if spot else Capacity.ONDEMAND,
            state=state,
            launched_at=launched_at,
            private_ip=raw.get("PrivateIpAddress"),
            partition=tags.get(PARTITION_TAG, ""),
            instance_type=raw.get("InstanceType", ""),
            interrupted=spot and reason in SPOT_RECLAIM_STATE_REASONS,
        )

    # ------------------------------------------------------------------ helpers

    def _terminate_ids(self, ids: Sequence[str], *, nodes: Sequence[str]) -> None:
        for chunk in _chunks(list(ids), TERMINATE_BATCH):
            self._call("terminate instances", self._ec2.terminate_instances, nodes=nodes, InstanceIds=chunk)

    def _call(self, action: str, fn: Any, *, nodes: Sequence[str] = (), **kwargs: Any) -> dict[str, Any]:
        try:
            resp: dict[str, Any] = fn(**kwargs)
            return resp
        except (ClientError, BotoCoreError) as exc:
            raise map_aws_error(exc, action=action, nodes=nodes) from exc


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _check_price(value: str | None) -> str | None:
    """A spot max price, per instance-hour, kept as the exact decimal string EC2 expects."""
    if value is None or str(value).strip() == "":
        return None
    try:
        price = Decimal(str(value).strip().lstrip("$"))
    except InvalidOperation:
        price = Decimal("NaN")
    if not price.is_finite() or price <= 0:
        raise ProviderConfigError(
            f"spot_max_price {value!r} is not a positive amount",
            hint="give it as a decimal string per instance-hour, e.g. \"1.25\"",
        )
    return format(price, "f")
