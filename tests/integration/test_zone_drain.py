"""Taking a spot zone out on the real dev cluster: which drains Slurm keeps on a cloud node, and
what gbroker's view of the pool makes of each (the node tick's census: ``broker.market.census``
over ``Backend.nodes()``, the numbers ``gbroker pools`` shows).

Slurm drops DRAIN from a cloud node when its suspend starts (the lab runs with
SlurmctldParameters=idle_on_node_suspend, as docs/NODES.md advises): a drain given while the
power-down is pending (``idle!``, just after POWER_DOWN_FORCE) is gone once the node powers
down, and so is the drain of a powered-up idle node once power saving suspends it. A drain given
to a node that is powering down or powered down holds. The reason stays in every case. gbroker
reads each node as Slurm shows it at that moment: drained in any power state is not usable; a
node whose drain Slurm dropped is usable, and Slurm does place jobs there. So a zone is taken out
by powering its nodes down first and draining them after (contrib/dev/demo_check.py zone-out,
docs/DEVCLUSTER.md "Taking a zone out"). Measured the same on 22.05 and 24.11 (``contract``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from broker.market import census, usable
from broker.slurm import make_backend
from broker.slurm.backend import Backend, NodeInfo
from broker.slurm.runner import DEFAULT_BIN_DIR, Runner

pytestmark = [pytest.mark.slurm, pytest.mark.contract]
"""`contract`: what the demo and operators rely on from Slurm when they take a zone out."""

ZONE = "spotb"
REASON = "zone-drain-test"
SETTLING = frozenset({"power_down", "powering_down", "power_up", "powering_up"})


@pytest.fixture
def backend(slurm_cluster: Any) -> Backend:
    bin_dir = os.environ.get("GBROKER_SLURM_BIN_DIR") or DEFAULT_BIN_DIR
    return make_backend("cli", runner=Runner(bin_dir=bin_dir))


def flags(cluster: Any, node: str) -> frozenset[str]:
    """Slurm's own words for the node's state (sinfo StateComplete, lower case)."""
    out = cluster.run(["sinfo", "-h", "-N", "-n", node, "-O", "StateComplete:0"]).stdout.split()
    return frozenset(out[0].lower().split("+")) if out else frozenset()


def reason(cluster: Any, node: str) -> str:
    out = cluster.run(["sinfo", "-h", "-N", "-n", node, "-O", "Reason:0"]).stdout.splitlines()
    return out[0].strip() if out else ""


def seen(backend: Backend, node: str) -> NodeInfo:
    """gbroker's reading of the node, as the node tick gets it."""
    return next(n for n in backend.nodes() if n.name == node)


def usable_in_zone(backend: Backend) -> int:
    """How many of the zone's nodes gbroker's census counts as usable (a powered-down one counts)."""
    return len(census(backend.nodes(), {}, ZONE).free_gpus)


def scontrol(cluster: Any, node: str, *words: str) -> None:
    cluster.run(["scontrol", "update", f"nodename={node}", *words])


def wait_flags(cluster: Any, node: str, want: str, timeout: float = 90) -> frozenset[str]:
    """Until the node's state has ``want`` and is no longer on its way anywhere else."""
    def probe() -> frozenset[str] | None:
        f = flags(cluster, node)
        return f if want in f and not (f - {want}) & SETTLING else None

    result: frozenset[str] = cluster.wait_for(probe, timeout, what=f"{node} {want}")
    return result


def power_up(cluster: Any, node: str) -> None:
    """The node powered up and idle, as a node is after its job ended."""
    def settled() -> frozenset[str] | None:
        f = flags(cluster, node)
        return None if f & SETTLING else f

    if "powered_down" in cluster.wait_for(settled, 90, what=f"{node} neither powering up nor down"):
        scontrol(cluster, node, "state=power_up")
    cluster.wait_for(lambda: "idle" in (f := flags(cluster, node)) and not f & (SETTLING | {"powered_down"}),
                     120, what=f"{node} up and idle")


def hand_back(cluster: Any, names: list[str]) -> None:
    """Every node back in the cloud pool: a drained, down or powered-up one is powered down by force."""
    for node in names:
        if flags(cluster, node) & {"drain", "down"} or "powered_down" not in flags(cluster, node):
            scontrol(cluster, node, "state=power_down_force")
    for node in names:
        cluster.wait_for(lambda n=node: not flags(cluster, n) & ({"drain", "down"} | SETTLING), 90,
                         what=f"{node} back in the cloud pool")


@pytest.fixture
def zone(slurm_cluster: Any) -> Iterator[list[str]]:
    """The zone's nodes, in service (powered down, not drained) at the start and handed back so at the end."""
    names = sorted(set(slurm_cluster.run(["sinfo", "-h", "-N", "-p", ZONE, "-O", "NodeList:0"]).stdout.split()))
    hand_back(slurm_cluster, names)
    yield names
    hand_back(slurm_cluster, names)


def test_a_drain_given_while_the_power_down_is_pending_is_dropped_and_gbroker_sees_the_node_usable(
        slurm_cluster, backend, zone):
    """The demo's first way: POWER_DOWN_FORCE to hand the zone back, then at once a drain to take it
    out. gbroker sees the drain while Slurm shows it; Slurm drops it when the suspend starts."""
    node = zone[0]
    for _ in range(3):  # the drain must land before the suspend starts (22.05 starts it within ~1 s)
        power_up(slurm_cluster, node)
        scontrol(slurm_cluster, node, "state=power_down_force")
        scontrol(slurm_cluster, node, "state=drain", f"reason={REASON}")
        pending = flags(slurm_cluster, node)
        if "power_down" in pending:
            break
        wait_flags(slurm_cluster, node, "powered_down")
        scontrol(slurm_cluster, node, "state=power_down_force")
        wait_flags(slurm_cluster, node, "powered_down")
    assert {"drain", "power_down"} <= pending, pending
    assert not usable(seen(backend, node))  # while Slurm shows the drain, gbroker's census leaves it out

    after = wait_flags(slurm_cluster, node, "powered_down")
    assert "drain" not in after, after  # dropped at the suspend
    assert reason(slurm_cluster, node) == REASON  # the reason stays: the node looks drained to a reader of reasons
    info = seen(backend, node)
    assert usable(info) and info.powered_down, info  # Slurm will boot it for a job: so is it for gbroker
    assert usable_in_zone(backend) == len(zone)


def test_a_drain_given_to_a_node_powering_down_or_powered_down_holds_and_the_zone_is_out(
        slurm_cluster, backend, zone):
    """The demo's way now: the power-down started (or done) first, then the drain; it holds through
    the end of the power-down, and gbroker's census counts no usable node in the zone."""
    first, *rest = zone
    power_up(slurm_cluster, first)
    scontrol(slurm_cluster, first, "state=power_down_force")
    wait_flags(slurm_cluster, first, "powering_down", timeout=60)
    scontrol(slurm_cluster, first, "state=drain", f"reason={REASON}")
    assert {"drain", "powering_down"} <= flags(slurm_cluster, first)
    assert not usable(seen(backend, first))
    for node in rest:
        wait_flags(slurm_cluster, node, "powered_down")
        scontrol(slurm_cluster, node, "state=drain", f"reason={REASON}")

    for node in zone:
        after = wait_flags(slurm_cluster, node, "powered_down")
        assert "drain" in after, (node, after)
        assert not usable(seen(backend, node))
    assert usable_in_zone(backend) == 0


def test_a_drained_powered_up_idle_node_loses_its_drain_when_power_saving_suspends_it(
        slurm_cluster, backend, zone):
    """Draining a node that is up and idle is no way to take it out either: Slurm's SuspendTime
    (20 s in the lab) powers it down regardless, and the suspend drops the drain."""
    node = zone[0]
    power_up(slurm_cluster, node)
    scontrol(slurm_cluster, node, "state=drain", f"reason={REASON}")
    assert "drain" in flags(slurm_cluster, node)
    assert not usable(seen(backend, node))

    slurm_cluster.wait_for(lambda: flags(slurm_cluster, node) & {"powering_down", "powered_down"}, 120,
                           what=f"Slurm's power saving to suspend {node}")
    after = wait_flags(slurm_cluster, node, "powered_down")
    assert "drain" not in after, after
    assert usable(seen(backend, node))
