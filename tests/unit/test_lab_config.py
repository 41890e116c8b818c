"""contrib/slurm/lab.toml: the pool catalog of the dev cluster lab, and the cluster it describes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.amount import parse_money
from broker.config import load_settings
from broker.pools.fit import GpuRequest, fitting
from broker.slurm.hostlist import expand

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "contrib" / "slurm" / "lab.toml"


@pytest.fixture
def devcluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The devcluster script as a module, pointed at an empty state dir (it reads nothing else)."""
    monkeypatch.setenv("GBROKER_DEVCLUSTER_DIR", str(tmp_path))
    monkeypatch.delenv("GBROKER_DEVCLUSTER_PORT_OFFSET", raising=False)
    loader = importlib.machinery.SourceFileLoader("devcluster_lab", str(REPO / "contrib/slurm/devcluster"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_lab_settings_load_as_a_catalog_of_four_pools() -> None:
    s = load_settings(LAB, env={})
    cat = s.catalog()
    assert cat.names == ("owned", "spot-a", "spot-b", "ondemand")
    assert cat.partitions == ("owned", "spot", "spotb", "ondemand")
    got = {p.name: (p.capacity, p.gpu_type, p.gpu_mem_gb, p.zone) for p in cat.pools}
    assert got == {
        "owned": ("owned", "l4", 24, ""),
        "spot-a": ("spot", "l4", 24, "a"),
        "spot-b": ("spot", "a100", 80, "b"),
        "ondemand": ("ondemand", "a100", 80, ""),
    }
    assert {(p.gpus_per_node, p.cpus_per_node, p.mem_per_node_gb) for p in cat.pools} == {(4, 4, 3)}
    # Prices are exact strings, read to the micro-unit.
    prices = {p.name: parse_money(p.price_per_gpu_hour or "") for p in cat.pools}
    assert prices == {"owned": 0, "spot-a": 350_000, "spot-b": 1_100_000, "ondemand": 3_670_000}
    assert [p.billing.describe() for p in cat.pools] == [
        "per second", "per second", "per minute", "per started hour"]
    assert s.node_provider == "local"


def test_lab_partitions_map_to_their_pools_and_classes() -> None:
    s = load_settings(LAB, env={})
    assert {part: s.capacity_of(part) for part in ("owned", "spot", "spotb", "ondemand", "urgent")} == {
        "owned": "owned", "spot": "spot", "spotb": "spot", "ondemand": "ondemand", "urgent": None}
    assert s.pool_of("spotb").name == "spot-b"  # type: ignore[union-attr]
    assert s.partition_for("ondemand") == "ondemand"
    rules = s.managed_node_partitions()
    assert sorted(rules) == ["ondemand", "owned", "spot", "spotb"]
    # Owned nodes are never released; the cloud pools are, after their idle time.
    assert {name: r.power_down for name, r in rules.items()} == {
        "owned": False, "spot": True, "spotb": True, "ondemand": True}
    assert s.node_idle_seconds_for("ondemand") == 120 and s.node_idle_seconds_for("spot") == 300


def test_lab_requests_fit_the_pools_with_their_gpu() -> None:
    pools = load_settings(LAB, env={}).catalog().pools
    ok, why = fitting(pools, GpuRequest(gpus_per_node=1, gpu_types=("a100",)))
    assert [p.name for p in ok] == ["spot-b", "ondemand"]
    assert why["owned"] == "has l4, the job asks for a100"
    ok, why = fitting(pools, GpuRequest(gpus_per_node=2, gpu_mem_gb=40))
    assert [p.name for p in ok] == ["spot-b", "ondemand"]
    assert why["spot-a"] == "24 GB per GPU, the job needs 40 GB"
    ok, _ = fitting(pools, GpuRequest(gpus_per_node=4))
    assert len(ok) == 4
    ok, why = fitting(pools, GpuRequest(gpus_per_node=5))
    assert ok == [] and why["owned"] == "4 GPUs per node, the job asks for 5"


def test_lab_catalog_matches_the_cluster_devcluster_builds(devcluster: Any) -> None:
    """Each pool's partition exists with that GPU type, count, CPUs and memory; each partition has a pool."""
    pools = {p.partition: p for p in load_settings(LAB, env={}).catalog().pools}
    conf = devcluster.slurm_conf_text((22, 5))
    gres = devcluster.gres_conf_text()
    parts = {m.group(1): m.group(2) for m in re.finditer(r"^PartitionName=(\S+) Nodes=(\S+)", conf, re.M)}
    assert set(parts) - {"urgent"} == set(pools)
    for part in devcluster.PARTITIONS:
        pool = pools[part.name]
        assert (pool.capacity, pool.gpu_type, pool.zone) == (part.capacity, part.gpu, part.zone)
        assert pool.gpu_mem_gb == devcluster.GPU_MEM_GB[part.gpu]
        for node in part.nodes:
            line = re.search(rf"^NodeName={node} .*$", conf, re.M)
            assert line, node
            cpus = int(re.search(r"CPUs=(\d+)", line.group(0)).group(1))  # type: ignore[union-attr]
            mem_mb = int(re.search(r"RealMemory=(\d+)", line.group(0)).group(1))  # type: ignore[union-attr]
            assert f"Gres=gpu:{pool.gpu_type}:{pool.gpus_per_node} " in line.group(0) + " "
            assert cpus == pool.cpus_per_node
            assert (pool.mem_per_node_gb or 0) * 1024 <= mem_mb  # what a job may ask, Slurm can give
            assert ("State=CLOUD" in line.group(0)) == (pool.capacity != "owned")
        typed = re.search(rf"^NodeName=(\S+) Name=gpu Type={part.gpu} File=\S+$", gres, re.M)
        assert typed and set(part.nodes) <= set(expand(typed.group(1))), gres
    # Owned nodes are never suspended by Slurm's power saving.
    exc = re.search(r"^SuspendExcNodes=(\S+)$", conf, re.M)
    assert exc and exc.group(1) == devcluster.compress_names(devcluster.OWNED_NODES) == "own[1-2]"


@pytest.mark.parametrize(("names", "text"), [
    (["spot1", "spot2", "spot3", "spot4"], "spot[1-4]"),
    (["spot1", "spot2", "spot4", "od1", "own1"], "od1,own1,spot[1-2,4]"),
    (["own1", "own2", "spot1", "spot2", "spot3", "spot4"], "own[1-2],spot[1-4]"),
    (["spotb2", "spotb1", "spot3"], "spot3,spotb[1-2]"),
    (["login", "spot01", "spot02"], "spot0[1-2],login"),
])
def test_devcluster_compresses_hostlists_as_slurm_reads_them(devcluster: Any, names: list[str],
                                                             text: str) -> None:
    assert devcluster.compress_names(names) == text
    assert sorted(expand(text)) == sorted(names)


def test_more_gpus_per_node_than_any_lab_node_has_is_refused_with_the_lab_s_largest() -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from broker.errors import SpecError
    from broker.jobs.submit import _parse

    s = load_settings(LAB, env={})
    assert s.catalog().largest_gpus_per_node() == 4 < s.max_gpus_per_node
    svc: Any = SimpleNamespace(settings=s)
    now = datetime(2026, 10, 1, tzinfo=UTC)
    spec = {"command": ["sleep", "1"], "group": "vision", "time_limit": "1m"}
    assert _parse(svc, {**spec, "gpus_per_node": 4}, now).gpus_per_node == 4
    with pytest.raises(SpecError, match=r"at most 4 \(the largest node has that many GPUs\), got 64"):
        _parse(svc, {**spec, "gpus_per_node": 64}, now)
    # A pool that does not say how many GPUs its nodes have leaves the configured limit.
    s = replace(s, pools=(*s.pools[:-1], replace(s.pools[-1], gpus_per_node=None)))
    assert s.catalog().largest_gpus_per_node() is None
    with pytest.raises(SpecError, match=rf"at most {s.max_gpus_per_node} "):
        _parse(SimpleNamespace(settings=s), {**spec, "gpus_per_node": 64}, now)  # type: ignore[arg-type]
