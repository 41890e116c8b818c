"""The one partition -> capacity map: Settings.capacity_of, and what delegates to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import NodePartition, Settings, load_settings
from broker.errors import ConfigError, SpecError
from broker.jobs.placement import capacity_of_partition


def test_one_partition_capacity_map() -> None:
    s = Settings(db_url="sqlite://", socket="/nonexistent.sock", spot_partition="cheap", ondemand_partition="dear",
                 node_partitions=(NodePartition("cheap"), NodePartition("a100", capacity="spot"),
                                  NodePartition("cpu")))
    assert [s.capacity_of(p) for p in ("cheap", "dear", "a100", "cpu", "other")] == [
        "spot", "ondemand", "spot", None, None]
    assert [s.node_capacity(p) for p in ("cheap", "dear", "a100", "cpu")] == ["spot", "ondemand", "spot", "ondemand"]
    assert (s.partition_for("spot"), s.partition_for("ondemand")) == ("cheap", "dear")
    assert capacity_of_partition(s, "cheap") == "spot" and capacity_of_partition(s, "dear") == "ondemand"
    for p in ("a100", "other"):  # jobs go to the [partitions] table's partitions only
        with pytest.raises(SpecError, match="not managed by gbroker"):
            capacity_of_partition(s, p)


def test_a_node_capacity_contradicting_the_partitions_table_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "gbroker.toml"
    f.write_text('[partitions]\nspot = "cheap"\n[nodes.cheap]\ncapacity = "ondemand"\n')
    with pytest.raises(ConfigError, match=r"\[nodes.cheap\] capacity = 'ondemand'"):
        load_settings(f, env={})
    f.write_text('[partitions]\nspot = "cheap"\n[nodes.cheap]\ncapacity = "spot"\n[nodes.a100]\ncapacity = "spot"\n')
    assert load_settings(f, env={}).capacity_of("a100") == "spot"
