"""Node provider for the dev cluster's "local cloud" (contrib/slurm/devcluster).

The dev cluster runs an agent that boots and stops node slurmds the way a
cloud API would. Its interface is a spool directory under the cluster's state
directory (``$GBROKER_DEVCLUSTER_DIR``, default /tmp/gbroker-devcluster):

    cloud/requests/<time_ns>.<action>.<node>   one request per node, JSON
                                               {"action": "resume"|"suspend",
                                                "node": NODE, "at": unix seconds},
                                               written to a dot-file, then renamed
    cloud/nodes/<node>.json                    the agent's record of a booted node:
                                               {"node", "pid", "timens", "booted_at"}

This provider writes requests exactly as ``devcluster cloud resume|suspend``
does (without needing scontrol to expand a hostlist: gbroker passes names) and
reads the node records back as instances. The agent is itself idempotent (a
resume of a running node does nothing), and resume here skips nodes that are
already running or have a resume request queued.

A dev-cluster reclaim (``devcluster reclaim NODE``) removes the node record,
so nothing is left to report: interruptions() is empty and Slurm's DOWN state
(reason=reclaimed) is the signal.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from policies import Capacity

from broker.nodes.providers.base import (
    Instance,
    InstanceState,
    NodeRequest,
    Provider,
    ProviderConfigError,
    ProviderUnreachable,
    pick_current,
)

STATE_DIR_ENV = "GBROKER_DEVCLUSTER_DIR"
DEFAULT_STATE_DIR = "/tmp/gbroker-devcluster"
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
"""Slurm node names as the dev cluster uses them; anything else would be a path trick."""


class LocalProvider(Provider):
    """Nodes of the dev cluster, booted by its local cloud agent."""

    name = "local"

    def __init__(
        self,
        state_dir: str | None = None,
        *,
        spot_prefix: str = "spot",
        cluster_name: str = "lab",
    ) -> None:
        self.state_dir = Path(state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
        self.spot_prefix = spot_prefix
        self.cluster_name = cluster_name
        self.requests_dir = self.state_dir / "cloud" / "requests"
        self.nodes_dir = self.state_dir / "cloud" / "nodes"

    # ------------------------------------------------------------------ contract

    def instances(self) -> list[Instance]:
        out = [inst for inst in (self._from_record(p) for p in self._records()) if inst]
        running = {i.node_name for i in out if i.alive}
        for node, at, path in self._queued("resume"):
            if node not in running:
                out.append(self._instance(node, f"local-{node}-{path.name.split('.')[0]}",
                                          InstanceState.PENDING, at))
        return out

    def resume(self, nodes: list[NodeRequest]) -> list[Instance]:
        for req in nodes:
            _check_name(req.name)
        known = self.instances()
        result: list[Instance] = []
        for req in nodes:
            current = pick_current(i for i in known if i.node_name == req.name)
            if current is None:
                path, at = self._request("resume", req.name)
                current = self._instance(req.name, f"local-{req.name}-{path.name.split('.')[0]}",
                                         InstanceState.PENDING, at)
            result.append(current)
        return result

    def suspend(self, names: list[str]) -> None:
        for name in names:
            _check_name(name)
        for name in names:
            self._request("suspend", name)

    # ------------------------------------------------------------------ spool

    def _request(self, action: str, node: str) -> tuple[Path, float]:
        """Queue one request the way ``devcluster cloud`` does: dot-file, then rename."""
        if not self.state_dir.is_dir():
            raise ProviderUnreachable(
                f"the dev cluster state directory {self.state_dir} does not exist",
                hint=f"run contrib/slurm/devcluster up, or set {STATE_DIR_ENV} / state_dir",
            )
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        at = time.time()
        name = f"{time.time_ns()}.{action}.{node}"
        tmp = self.requests_dir / f".{name}.tmp"
        tmp.write_text(json.dumps({"action": action, "node": node, "at": at}))
        os.replace(tmp, self.requests_dir / name)
        return self.requests_dir / name, at

    def _queued(self, action: str) -> list[tuple[str, float, Path]]:
        """Requests the agent has not consumed yet: (node, at, path)."""
        try:
            names = sorted(n for n in os.listdir(self.requests_dir) if not n.startswith("."))
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            path = self.requests_dir / n
            try:
                req = json.loads(path.read_text())
                if req["action"] == action:
                    out.append((str(req["node"]), float(req["at"]), path))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # consumed meanwhile, or not ours to judge
        return out

    def _records(self) -> list[Path]:
        try:
            return sorted(self.nodes_dir.glob("*.json"))
        except FileNotFoundError:
            return []

    def _from_record(self, path: Path) -> Instance | None:
        try:
            rec = json.loads(path.read_text())
            node, pid, booted = str(rec["node"]), int(rec["pid"]), float(rec["booted_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        state = InstanceState.RUNNING if _node_process_alive(pid, node) else InstanceState.TERMINATED
        return self._instance(node, f"local-{node}-{pid}", state, booted, "127.0.0.1")

    def _instance(
        self, node: str, iid: str, state: InstanceState, at: float, ip: str | None = None
    ) -> Instance:
        cap = Capacity.SPOT if node.startswith(self.spot_prefix) else Capacity.ONDEMAND
        return Instance(
            instance_id=iid,
            node_name=node,
            capacity=cap,
            state=state,
            launched_at=datetime.fromtimestamp(at, UTC),
            private_ip=ip,
            instance_type="local",
        )


def _node_process_alive(pid: int, node: str) -> bool:
    """The recorded pid still runs and is that node's slurmd (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except (OSError, IndexError):
        return False
    return b"-N" in argv and node.encode() in argv


def _check_name(name: str) -> None:
    if not NODE_NAME.fullmatch(name):
        raise ProviderConfigError(
            f"{name!r} is not a node name the dev cluster knows",
            hint="pass plain node names such as spot1 or od2 (expand hostlists first)",
        )
