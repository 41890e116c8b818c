"""contrib/slurm/devcluster's other Slurm releases: choosing one, the client wrappers, the configs.

The real proof is the contract run on each release (`contrib/dev/test -m contract
--slurm 24.11`); these check the script's own decisions without a root.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def devcluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("GBROKER_DEVCLUSTER_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GBROKER_DEVCLUSTER_PORT_OFFSET", raising=False)
    monkeypatch.delenv("GBROKER_SLURM_VERSION", raising=False)
    monkeypatch.setenv("GBROKER_SLURM_ROOTS", str(tmp_path / "roots"))
    loader = importlib.machinery.SourceFileLoader("devcluster_rel", str(REPO / "contrib/slurm/devcluster"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_version_comes_from_the_flag_then_the_env_then_the_state_dir(
        devcluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert devcluster.chosen_version(["up", "--slurm", "24.11"]) == ("24.11", ["up"])
    assert devcluster.chosen_version(["status"]) == ("", ["status"])
    monkeypatch.setenv("GBROKER_SLURM_VERSION", "26.05")
    assert devcluster.chosen_version(["status"]) == ("26.05", ["status"])
    monkeypatch.delenv("GBROKER_SLURM_VERSION")
    devcluster.STATE.mkdir(parents=True)
    devcluster.VERSION_FILE.write_text("24.11\n")
    assert devcluster.chosen_version(["reclaim", "spot1"]) == ("24.11", ["reclaim", "spot1"])


def test_an_unknown_version_is_refused_with_the_known_ones(devcluster: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devcluster, "slurm_version", lambda: (22, 5))
    with pytest.raises(devcluster.Fail, match="24.11, 26.05"):
        devcluster.chosen_version(["up", "--slurm", "23.02"])
    assert devcluster.chosen_version(["up", "--slurm", "22.05"]) == ("", ["up"])
    with pytest.raises(devcluster.Fail, match="needs a version"):
        devcluster.chosen_version(["up", "--slurm"])


def test_client_wrappers_run_the_roots_binary_with_its_loader_as_any_user(devcluster: Any,
                                                                          tmp_path: Path) -> None:
    root = tmp_path / "roots" / "24.11"
    (root / "usr/bin").mkdir(parents=True)
    for name in ("sbatch", "squeue"):
        (root / "usr/bin" / name).write_text("")
    devcluster.write_client_wrappers(root)
    names = sorted(p.name for p in devcluster.BIN.iterdir())
    assert names == ["sbatch", "squeue"]  # only what the root has
    text = (devcluster.BIN / "sbatch").read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"exec {root}/lib64/ld-linux-x86-64.so.2 --library-path ")
    assert f"{root}/usr/lib/x86_64-linux-gnu/slurm-wlm:" in last
    assert last.endswith(f'--argv0 sbatch {root}/usr/bin/sbatch "$@"')
    assert (devcluster.BIN / "sbatch").stat().st_mode & 0o755 == 0o755
    assert "chroot" not in last  # sbatch runs as the submitting user


def test_cgroup_conf_only_for_releases_that_need_it(devcluster: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    devcluster.make_dirs = lambda: None
    devcluster.STATE.mkdir(parents=True)
    devcluster.HOOKS.mkdir(parents=True)
    monkeypatch.setattr(devcluster, "write_hooks", lambda mode=None: None)
    changed = devcluster.write_configs((22, 5))
    assert "cgroup" not in changed and not devcluster.CGROUP_CONF.exists()
    changed = devcluster.write_configs((24, 11))
    assert changed["cgroup"] and "CgroupPlugin=disabled" in devcluster.CGROUP_CONF.read_text()
    assert "PrivateData=cloud" not in devcluster.SLURM_CONF.read_text()


def test_plugin_dir_is_named_only_inside_a_root(devcluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GBROKER_SLURM_ROOT", "/var/cache/gbroker/roots/24.11")
    assert "PluginDir" not in devcluster.slurm_conf_text((24, 11))
    monkeypatch.setattr(devcluster, "in_root", lambda: True)
    assert ("PluginDir=/var/cache/gbroker/roots/24.11/usr/lib/x86_64-linux-gnu/slurm-wlm\n"
            in devcluster.slurm_conf_text((24, 11)))


def test_gbroker_hooks_inside_a_root_run_the_hosts_gbroker(devcluster: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mode = {"mode": "gbroker", "gbroker": "/opt/gbroker/venv/bin/gbroker", "config": None}
    assert "chroot" not in devcluster.hook_text("resume", mode)
    monkeypatch.setattr(devcluster, "in_root", lambda: True)
    devcluster.STATE.mkdir(parents=True)
    devcluster.VERSION_FILE.write_text("24.11\n")
    text = devcluster.hook_text("resume", mode)
    assert "exec /usr/sbin/chroot /.host /opt/gbroker/venv/bin/gbroker node resume \"$1\"" in text
    assert f"export GBROKER_SLURM_BIN_DIR={devcluster.BIN}" in text
