"""The Slurm hook scripts: the dev cluster's two modes and contrib's gbroker hooks pass the hostlist on."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def devcluster(state: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("GBROKER_DEVCLUSTER_DIR", str(state))
    loader = importlib.machinery.SourceFileLoader("devcluster_under_test", str(REPO / "contrib/slurm/devcluster"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def recorder(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that writes its argv, one per line, to a file."""
    out = tmp_path / "argv.txt"
    exe = tmp_path / "fake-gbroker"
    exe.write_text(f"#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > {out}\n")
    exe.chmod(0o755)
    return exe, out


def test_devcluster_switches_hooks_without_touching_slurm_conf(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dc = devcluster(tmp_path / "state", monkeypatch)
    exe, out = recorder(tmp_path)
    assert dc.cmd_hooks(["gbroker", str(exe), "--config", str(tmp_path / "my conf.toml")]) == 0
    for action, verb in (("resume", "resume"), ("suspend", "suspend"), ("resumefail", "resume-fail")):
        hook = tmp_path / "state" / "hooks" / action
        assert os.access(hook, os.X_OK)
        (tmp_path / "state" / "log").mkdir(exist_ok=True)
        subprocess.run([str(hook), "spot[1-2]"], check=True, timeout=30)
        assert out.read_text().splitlines() == ["--config", str(tmp_path / "my conf.toml"), "node", verb, "spot[1-2]"]
    assert dc.hook_mode()["mode"] == "gbroker"
    # `up` rewrites the hooks from the recorded mode, so the choice survives a restart.
    assert "node resume" in dc.hook_text("resume")
    assert dc.cmd_hooks(["agent"]) == 0
    text = (tmp_path / "state" / "hooks" / "resume").read_text()
    assert "cloud resume" in text and str(exe) not in text
    assert "cloud suspend" in (tmp_path / "state" / "hooks" / "resumefail").read_text()
    assert "ResumeFailProgram=" in dc.slurm_conf_text((22, 5))
    with pytest.raises(dc.Fail):
        dc.cmd_hooks(["gbroker", str(tmp_path / "missing")])


@pytest.mark.parametrize("verb", ["resume", "suspend", "resume-fail"])
def test_contrib_hooks_call_gbroker_node(verb: str, tmp_path: Path) -> None:
    exe, out = recorder(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "GBROKER": str(exe), "GBROKER_HOOK_LOG": str(tmp_path / "log" / "hooks.log")}
    subprocess.run([str(REPO / "contrib/slurm/hooks" / f"gbroker-{verb}"), "gpu-spot[1-4]"], env=env, check=True,
                   timeout=30)
    assert out.read_text().splitlines() == ["node", verb, "gpu-spot[1-4]"]


def test_the_cli_imports_no_orm() -> None:
    code = ("import sys, broker.cli.node, broker.nodes.providers.hooks; "
            "assert 'sqlalchemy' not in sys.modules and 'boto3' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("bad", ["--config=/tmp/evil", "-x", "spot1;reboot", "a b", "spot\n1", ".hidden", "x" * 65])
def test_a_name_that_is_not_a_node_never_reaches_a_providers_command(bad: str) -> None:
    from broker.nodes.providers.base import ProviderConfigError
    from broker.nodes.providers.hooks import expand_hostlists

    with pytest.raises(ProviderConfigError, match="is not a node name"):
        expand_hostlists(["spot1", bad])


def test_node_names_and_hostlists_expand() -> None:
    from broker.nodes.providers.hooks import expand_hostlists

    assert expand_hostlists(["spot[1-2]", "gpu-a.1_x", "spot1"]) == ["spot1", "spot2", "gpu-a.1_x"]
