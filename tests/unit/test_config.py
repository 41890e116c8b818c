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
     ("[partitions]\nreserved = 'x'\n", "unknown capacity"), ("policy = [\n", "cannot read"),
     ("[pools.b]\npartition = 'spotb'\ncapacity = 'spot'\ngpu_type = 'a100'\ngpu_mem_gb = 80\n"
      "price_per_gpu_hour = '-1.10'\n", "must not be negative"),
     ("[pools.b]\npartition = 'spotb'\ncapacity = 'spot'\ngpu_type = 'a100'\ngpu_mem_gb = 80\n"
      "price_per_gpu_hour = '1,10'\n", "decimal point"),
     ("[nodes.spot]\nprice_per_node_hour = '-2.40'\n", "must not be negative"),
     ("tick_seconds = nan\n", "tick_seconds = nan is not a valid number"),
     ("tick_seconds = true\n", "is not a valid number"), ("lease_ttl_seconds = 0\n", "must be above 0"),
     ("max_spot_reclaims = 2.9\n", "is not a valid whole number"), ("max_nodes = -3\n", "must be above 0"),
     ("max_spot_reclaims = -1\n", "must be 0 or more"),
     ("[nodes.spot]\nidle_seconds = nan\n", "idle_seconds must be a number of seconds"),
     ("[nodes.spot]\nidle_seconds = true\n", "idle_seconds must be a number of seconds"),
     ("[nodes.spot]\nidle_seconds = '600'\n", "idle_seconds must be a number of seconds"),
     ("tick_seconds = '15'\n", "tick_seconds = '15' is a string, not a number"),
     ("max_nodes = '3'\n", "write it without quotes: max_nodes = 3"),
     ("tick_seconds = 1e308\n", "at most 1,000,000,000"),
     ("[partitions]\nspot = 'spot'\nondemand = 'spot'\n", "names 'spot' for both spot and on-demand"),
     ("[partitions]\nspot = 'my spot'\n", "spot = 'my spot' is not a Slurm partition name"),
     ("[partitions]\nondemand = ''\n", "ondemand = '' is not a Slurm partition name"),
     ("spot_partition = 'cheap'\n", "unknown setting 'spot_partition'"),
     ("[metric]\nlisten = '127.0.0.1:1'\n", "tables: [pools], [partitions], [nodes]")],
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


def test_how_jobs_are_queued_is_one_of_three_and_read_from_the_environment(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text("")
    assert load_settings(cfg, env={}).slurm_submit == "auto"
    assert load_settings(cfg, env={"GBROKER_SLURM_SUBMIT": "sbatch"}).slurm_submit == "sbatch"
    cfg.write_text('slurm_submit = "libslurm"\n')
    assert load_settings(cfg, env={}).slurm_submit == "libslurm"
    cfg.write_text('slurm_submit = "srun"\n')
    with pytest.raises(ConfigError, match="slurm_submit = 'srun' is not one of: auto, sbatch, libslurm"):
        load_settings(cfg, env={})
    cfg.write_text('slurm_backend = "rest"\n')
    with pytest.raises(ConfigError, match="slurm_backend"):
        load_settings(cfg, env={})


def test_a_backend_asked_for_libslurm_where_it_cannot_be_had_refuses_to_start():
    from broker.slurm.cli_backend import CliBackend
    from broker.slurm.runner import CallCounter, CompletedRun

    class OtherRelease:  # a cluster whose commands say another release than the module's
        counter = CallCounter()

        def run(self, argv, **kw):
            return CompletedRun(argv=argv, stdout="slurm 99.11.0\n", stderr="", returncode=0, elapsed_s=0.0)

    with pytest.raises(ConfigError, match="native_build"):
        CliBackend(OtherRelease(), submit_with="libslurm")
    assert CliBackend(OtherRelease(), submit_with="auto").native is None
    with pytest.raises(ConfigError, match="unknown way to submit"):
        CliBackend(OtherRelease(), submit_with="pigeon")


@pytest.mark.parametrize("text", ["1e3", "1_000", "\u0661\u0665", " 5 ", "+5", "0x10", "5."])
def test_a_number_in_the_environment_is_plain_ascii_digits(text):
    with pytest.raises(ConfigError, match="GBROKER|tick_seconds"):
        load_settings(env={"GBROKER_CONFIG": "/nonexistent/g.toml", "GBROKER_TICK_SECONDS": text})


def test_numbers_in_the_environment_are_read():
    env = {"GBROKER_CONFIG": "/nonexistent/g.toml", "GBROKER_TICK_SECONDS": "7.5", "GBROKER_MAX_SPOT_RECLAIMS": "4"}
    s = load_settings(env=env)
    assert (s.tick_seconds, s.max_spot_reclaims) == (7.5, 4)


def test_an_empty_variable_counts_as_unset(tmp_path, monkeypatch):
    import broker.config

    monkeypatch.setattr(broker.config, "DEFAULT_CONFIG_PATH", tmp_path / "default.toml")  # absent
    f = tmp_path / "g.toml"
    f.write_text('db_url = "sqlite:////srv/gb.db"\n')
    s = load_settings(f, env={"GBROKER_DB_URL": "", "GBROKER_TICK_SECONDS": ""})
    assert (s.db_url, s.tick_seconds) == ("sqlite:////srv/gb.db", 15.0)
    assert load_settings(env={"GBROKER_CONFIG": ""}).policy == "gbroker"  # not "cannot read ."


def test_the_gang_limits_are_read_from_the_environment():
    env = {"GBROKER_CONFIG": "/nonexistent/g.toml", "GBROKER_MAX_NODES": "4", "GBROKER_MAX_GPUS_PER_NODE": "2"}
    s = load_settings(env=env)
    assert (s.max_nodes, s.max_gpus_per_node) == (4, 2)
    with pytest.raises(ConfigError, match="max_nodes"):
        load_settings(env={**env, "GBROKER_MAX_NODES": "0"})


def test_a_gbroker_variable_nobody_reads_is_named_with_the_setting_it_resembles():
    from broker.config import env_notes

    notes = env_notes({"GBROKER_TICK_SECOND": "5", "GBROKER_SOKET": "/tmp/s", "GBROKER_FROBNICATE": "1",
                       "PATH": "/usr/bin", "GBROKER_SOCKET": "/tmp/s"})
    assert len(notes) == 3
    by_name = {n.split()[0]: n for n in notes}
    assert "did you mean GBROKER_TICK_SECONDS?" in by_name["GBROKER_TICK_SECOND"]
    assert "did you mean GBROKER_SOCKET?" in by_name["GBROKER_SOKET"]
    assert "did you mean" not in by_name["GBROKER_FROBNICATE"] and "is ignored" in by_name["GBROKER_FROBNICATE"]


def test_what_gbroker_sets_for_jobs_and_hooks_is_not_called_unknown():
    from broker.config import env_notes

    inside_a_job = {"GBROKER_JOB_ID": "7", "GBROKER_ATTEMPT": "2", "GBROKER_CHECKPOINT_DIR": "/ck",
                    "GBROKER_RESUME_FROM": "/ck/3", "GBROKER_WARNING_SIGNAL": "USR1", "GBROKER_WARNING_SECONDS": "60",
                    "GBROKER_PIECE": "4", "GBROKER_PIECE_FIRST": "4", "GBROKER_PIECE_LAST": "7",
                    "GBROKER_PIECE_STEP": "1", "GBROKER_ALERT_GROUP": "vision", "GBROKER_EVENT": "budget",
                    "GBROKER_TEST_LANES": "1", "GBROKER_DEVCLUSTER_DIR": "/tmp/dc", "GBROKER_CONFIG": "/etc/g.toml",
                    "GBROKER_MAX_NODES": "4"}
    assert env_notes(inside_a_job) == []


def test_every_gbroker_name_in_the_code_and_scripts_is_known():
    """The names gbroker sets for jobs and hooks are listed by hand (broker.config.ENV_OTHER);
    one added in the code or a script without it would be reported to users as a typo."""
    import re
    from pathlib import Path

    from broker.config import env_notes

    root = Path(__file__).resolve().parents[2]
    names = set()
    for folder in ("broker", "contrib", "policies"):
        for f in (root / folder).rglob("*"):
            if f.is_file() and f.suffix in ("", ".py", ".sh", ".toml", ".service"):
                names |= set(re.findall(r"GBROKER_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])", f.read_text(errors="replace")))
    assert len(names) > 30
    assert env_notes({n: "1" for n in names}) == []


def test_a_client_reads_only_the_socket_so_the_daemons_settings_do_not_stop_users_commands(tmp_path, monkeypatch):
    """A setting of a newer gbroker than a user's own install, or a mistake in a table only root can
    fix: the daemon and `gbroker config check` refuse it, a user's `gbroker status` still reaches the daemon."""
    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli
    from broker.config import client_socket

    f = tmp_path / "g.toml"
    f.write_text(f'socket = "{tmp_path}/lab.sock"\nsetting_of_a_later_release = 3\n[pools.a]\npartition = "x"\n')
    with pytest.raises(ConfigError, match="unknown setting 'setting_of_a_later_release'"):
        load_settings(f, env={})
    assert client_socket(f, env={}) == f"{tmp_path}/lab.sock"
    assert client_socket(f, env={"GBROKER_SOCKET": "/run/x.sock"}) == "/run/x.sock"
    assert client_socket(None, env={"GBROKER_CONFIG": str(f)}) == f"{tmp_path}/lab.sock"
    monkeypatch.delenv("GBROKER_SOCKET", raising=False)
    from broker.client import Client

    assert Client(config_path=str(f)).socket_path == f"{tmp_path}/lab.sock"  # the Python client, as the CLI
    out = CliRunner().invoke(cli, ["--config", str(f), "status"])
    assert out.exit_code == 6 and f"no answer on {tmp_path}/lab.sock" in out.output, out.output
    checked = CliRunner().invoke(cli, ["config", "check", str(f)])
    assert checked.exit_code == 2 and "setting_of_a_later_release" in checked.output, checked.output


@pytest.mark.parametrize(("text", "fragment"), [
    ("socket = 7\n", "socket = 7 is not a valid"),
    ("socket = \n", "cannot read"),
])
def test_a_client_still_refuses_a_socket_it_cannot_read(tmp_path, text, fragment):
    from broker.config import client_socket

    f = tmp_path / "g.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        client_socket(f, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        client_socket(tmp_path / "none.toml", env={})  # named: it must be there


def test_a_client_without_a_settings_file_takes_the_default_socket(tmp_path):
    from broker.config import client_socket, default_socket_path

    assert client_socket(None, env={"GBROKER_CONFIG": str(tmp_path / "none.toml")}) == default_socket_path()
