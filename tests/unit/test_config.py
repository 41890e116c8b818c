import pytest

from broker.config import load_settings
from broker.errors import ConfigError


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('policy = "ondemand"\ntick_seconds = 5\n[partitions]\nspot = "cheap"\n')
    s = load_settings(f, env={"GBROKER_TICK_SECONDS": "7"}, overrides={"policy": "greedy", "db_url": None})
    assert s.policy == "greedy"          # flag beats file
    assert s.tick_seconds == 7.0         # env beats file
    assert s.spot_partition == "cheap"   # file beats default
    assert s.ondemand_partition == "ondemand"
    assert s.partition_for("spot") == "cheap"


@pytest.mark.parametrize(
    "text,fragment",
    [("polcy = 'x'\n", "unknown setting 'polcy'"), ("tick_seconds = 'fast'\n", "tick_seconds"),
     ("[partitions]\nreserved = 'x'\n", "unknown capacity"), ("policy = [\n", "cannot read")],
)
def test_bad_config_says_what_is_wrong(tmp_path, text, fragment):
    f = tmp_path / "g.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(f, env={})
    assert fragment in str(err.value)


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError):
        load_settings(tmp_path / "nope.toml", env={})


def test_missing_default_file_is_fine(tmp_path):
    s = load_settings(env={"GBROKER_CONFIG": str(tmp_path / "absent.toml")})
    assert s.policy == "gbroker"
