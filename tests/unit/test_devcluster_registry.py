"""contrib/slurm/devcluster's isolation of instances: the port registry and namespace ownership.

The real proof is tests/integration/test_devcluster_instances.py (two clusters at once);
these check the script's own decisions on a registry and processes of this test.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def devcluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("GBROKER_DEVCLUSTER_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GBROKER_DEVCLUSTER_PORT_OFFSET", "0")
    monkeypatch.setenv("GBROKER_DEVCLUSTER_REGISTRY", str(tmp_path / "registry.json"))
    loader = importlib.machinery.SourceFileLoader("devcluster_registry", str(REPO / "contrib/slurm/devcluster"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    # This machine's running dev clusters are not part of these registries.
    monkeypatch.setattr(module, "running_instances", dict)
    return module


def instance(tmp_path: Path, name: str, offset: int) -> str:
    """A state dir that records its offset, as `up` leaves it."""
    state = tmp_path / name
    state.mkdir()
    (state / "ports.json").write_text(json.dumps({"offset": offset}))
    return str(state)


@pytest.mark.parametrize("apart", [1, 3, 10, 20, 30, 31, 184, 194, 204, 215])
def test_offsets_whose_ports_meet_are_refused_naming_the_other(devcluster: Any, apart: int) -> None:
    clash = devcluster.port_clash({"/tmp/other": 2700}, "/tmp/mine", 2700 + apart)
    assert clash is not None
    assert "/tmp/other (offset 2700)" in clash and "GBROKER_DEVCLUSTER_PORT_OFFSET" in clash


@pytest.mark.parametrize("apart", [4, 50, 100, 150, 200, 300, 1000])
def test_offsets_whose_ports_never_meet_work(devcluster: Any, apart: int) -> None:
    assert devcluster.port_clash({"/tmp/other": 2700}, "/tmp/mine", 2700 + apart) is None
    assert devcluster.port_clash({"/tmp/other": 2700 + apart}, "/tmp/mine", 2700) is None


def test_an_instance_never_clashes_with_itself(devcluster: Any) -> None:
    assert devcluster.port_clash({"/tmp/mine": 2700}, "/tmp/mine", 2710) is None


def test_claim_records_the_offset_and_a_clashing_claim_leaves_nothing(
        devcluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    devcluster.claim_ports()
    assert json.loads(devcluster.REGISTRY.read_text()) == {str(devcluster.STATE): 0}
    assert json.loads(devcluster.PORTS_FILE.read_text()) == {"offset": 0}
    monkeypatch.setattr(devcluster, "STATE", tmp_path / "second")
    monkeypatch.setattr(devcluster, "PORTS_FILE", tmp_path / "second" / "ports.json")
    monkeypatch.setattr(devcluster, "PORT_OFFSET", 20)
    with pytest.raises(devcluster.Fail, match="offset 20 meets the dev cluster in .*state"):
        devcluster.claim_ports()
    assert not (tmp_path / "second").exists()
    assert json.loads(devcluster.REGISTRY.read_text()) == {str(tmp_path / "state"): 0}


def test_a_purged_or_moved_instance_drops_out(devcluster: Any, tmp_path: Path) -> None:
    gone = str(tmp_path / "purged")
    moved = instance(tmp_path, "moved", 300)
    kept = instance(tmp_path, "kept", 400)
    devcluster.REGISTRY.write_text(json.dumps({gone: 0, moved: 200, kept: 400, "/x": "junk"}))
    entries = devcluster.load_registry()
    assert entries.get(kept) == 400
    assert gone not in entries and moved not in entries and "/x" not in entries


def test_a_namespace_is_ours_only_while_no_daemon_in_it_names_another_config(
        devcluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A time namespace's number reused by another instance's node is not ours (the cross-instance kill)."""
    monkeypatch.setattr(devcluster, "DAEMON_EXES", {"sleep"})  # sleep stands for slurmd here

    def in_new_timens(conf: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["/usr/bin/unshare", "--time", "/bin/sleep", "30"],
                                env=dict(os.environ, SLURM_CONF=conf))
    ours = in_new_timens(str(devcluster.SLURM_CONF))
    other = in_new_timens(str(tmp_path / "other" / "slurm.conf"))
    try:
        devcluster.wait_for("namespaces", lambda: all(
            devcluster.timens(p.pid) not in (None, devcluster.timens(os.getpid())) for p in (ours, other)), 5)
        assert devcluster.timens_is_ours(devcluster.timens(ours.pid))
        assert not devcluster.timens_is_ours(devcluster.timens(other.pid))
        assert not devcluster.timens_is_ours(devcluster.timens(os.getpid()))
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
