"""What a user writes in a job file is never silently ignored, changed or misread; messages say what to write."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker.errors import SpecError
from broker.spec import MAX_JOB_ID, JobSpec, load_job_file, parse_spec, spec_from_dict, spec_to_dict

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
BOM = "\ufeff"


def job(**fields: Any) -> dict[str, Any]:
    return {"group": "vision-lab", "time_limit": "2h", "command": ["python", "train.py"], **fields}


def parse(**fields: Any) -> JobSpec:
    return parse_spec(job(**fields), now=NOW)


def refused(**fields: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse(**fields)
    return info.value


# -- 1: an integer pieces is ambiguous ---------------------------------------------------------


def test_integer_pieces_is_refused_with_both_readings() -> None:
    err = refused(pieces=40)
    assert err.message == "pieces: pieces = 40 is ambiguous"
    assert err.hint == 'write pieces = "1-40" for 40 pieces, or pieces = "40" for the single index 40'


def test_pieces_strings_stay_slurm_grammar() -> None:
    assert parse(pieces="40").array().indices == (40,)
    assert len(parse(pieces="1-40").array().indices) == 40


# -- 2: only "none" turns the warning off ------------------------------------------------------


@pytest.mark.parametrize("value", ["", " ", "SIG", "sig"])
def test_empty_warning_signal_is_refused(value: str) -> None:
    err = refused(warning_signal=value)
    assert err.message.startswith("warning_signal: ") and "names no signal" in err.message
    assert err.hint is not None and '"USR1"' in err.hint and '"none"' in err.hint


@pytest.mark.parametrize("value", ["none", "None", " NONE "])
def test_none_turns_the_warning_off(value: str) -> None:
    assert parse(warning_signal=value, checkpoint={"style": "signal", "dir": "/ck"}).warning_signal is None


def test_signal_names_still_read_with_or_without_sig() -> None:
    assert parse(warning_signal="sigusr2").warning_signal == "USR2"
    assert parse(warning_signal="TERM").warning_signal == "TERM"
    with pytest.raises(SpecError, match="not a signal a job can be warned with"):
        parse(warning_signal="SIGNONE")


# -- 3: job numbers are bounded when read ------------------------------------------------------


@pytest.mark.parametrize("number", [2**63, MAX_JOB_ID + 1, 10**40])
def test_after_refuses_a_job_number_too_large(number: int) -> None:
    with pytest.raises(SpecError, match="after: .* is not a job number"):
        parse(after=[number])
    with pytest.raises(SpecError, match="after: .* is not a job number"):
        spec_from_dict(job(after=[number]), now=NOW)


def test_after_takes_the_largest_job_number() -> None:
    assert parse(after=[MAX_JOB_ID]).after == (MAX_JOB_ID,)


def test_spec_does_not_import_broker_jobs() -> None:
    code = "import sys, broker.spec\nprint(','.join(m for m in sys.modules if m.startswith('broker.jobs')))\n"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root)}, check=True)
    assert out.stdout.strip() == ""


# -- 4: a blank inline sweep entry ---------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_inline_sweep_entry_is_refused_by_position(blank: str) -> None:
    err = refused(sweep=["--lr 1", blank, "--lr 3"])
    assert err.message.startswith("sweep line 2: ") and "empty" in err.message
    with pytest.raises(SpecError, match="sweep line 2: .*empty"):
        spec_from_dict(job(sweep=["--lr 1", blank, "--lr 3"]), now=NOW)


def test_a_stored_sweep_is_read_as_it_was() -> None:
    stored = spec_from_dict(job(sweep=["--lr 1", "", "--lr 3"], pieces=None))
    assert stored.sweep == (("--lr", "1"), (), ("--lr", "3"))


# -- 5: a sweep file's errors name the line in the file ----------------------------------------


def test_sweep_file_error_names_its_line_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "lr.txt"
    path.write_text("# learning rates\n\n--lr 1\n\n--lr '2\n")
    err = refused(sweep=str(path))
    assert err.message.startswith(f"sweep {path} line 5: ")


def test_sweep_file_skips_blank_lines_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "lr.txt"
    path.write_text("# learning rates\n\n--lr 1\n  \n--lr 2\n")
    spec = parse(sweep=str(path))
    assert spec.sweep == (("--lr", "1"), ("--lr", "2")) and spec.pieces == "1-2"
    assert spec_from_dict(spec_to_dict(spec), now=NOW) == spec


def test_sweep_file_of_comments_only_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lr.txt"
    path.write_text("# nothing yet\n\n")
    with pytest.raises(SpecError, match="has no lines of arguments"):
        parse(sweep=str(path))


# -- 6: a byte-order mark ------------------------------------------------------------------------


def test_sweep_file_with_a_bom_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lr.txt"
    path.write_text(BOM + "--lr 1\n--lr 2\n", encoding="utf-8")
    err = refused(sweep=str(path))
    assert "byte-order mark" in err.message and "UTF-8 BOM" in err.message
    assert err.hint is not None and "without one" in err.hint


def test_job_file_with_a_bom_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(BOM + 'group = "vision-lab"\ntime_limit = "2h"\ncommand = ["train"]\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_job_file(str(path))
    assert info.value.message == (f"job file {path}: starts with a byte-order mark "
                                  "(a UTF-8 BOM, as some Windows editors write)")
    assert info.value.hint is not None and "without one" in info.value.hint


def test_script_with_a_bom_is_refused() -> None:
    err = refused(command=None, script=BOM + "#!/bin/bash\necho hi\n")
    assert "byte-order mark" in err.message


# -- 7: whole-number fields hint the user's own number -----------------------------------------


@pytest.mark.parametrize(("fld", "value", "hint"), [
    ("gpus_per_node", "4", "write gpus_per_node = 4"),
    ("nodes", " 2 ", "write nodes = 2"),
    ("max_retries", "3", "write max_retries = 3"),
    ("chunk", "10", "write chunk = 10"),
    ("tasks_per_node", "4", "write tasks_per_node = 4"),
    ("gpus_per_node", 4.0, "write gpus_per_node = 4"),
    ("gpus_per_node", "four", "write a whole number without quotes, e.g. gpus_per_node = 1"),
])
def test_whole_number_hint_uses_the_value_written(fld: str, value: Any, hint: str) -> None:
    extra = {"pieces": "1-100"} if fld == "chunk" else {}
    err = refused(**{fld: value}, **extra)
    assert err.message.startswith(f"{fld}: must be a whole number")
    assert err.hint == hint


@pytest.mark.parametrize(("value", "number"), [("80G", 80), ("80GB", 80), ("80", 80), ("40 gb", 40),
                                               (80.0, 80), ("lots", 80)])
def test_gpu_mem_gb_hint_says_whole_gb(value: Any, number: int) -> None:
    err = refused(gpu_mem_gb=value)
    assert err.hint is not None and "whole number of GB" in err.hint
    assert err.hint.endswith(f"write gpu_mem_gb = {number}")


# -- 8: gpus is not gpu ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["gpus", "gpu_count", "ngpus"])
def test_gpu_count_keys_hint_gpus_per_node(key: str) -> None:
    err = refused(**{key: 2})
    assert err.message == f"{key}: unknown key"
    assert err.hint is not None and err.hint.startswith("did you mean gpus_per_node?")


def test_other_unknown_keys_still_get_the_closest_spelling() -> None:
    assert refused(time_limt="1h").hint == "did you mean time_limit?"


# -- 9: only ASCII digits are numbers ------------------------------------------------------------


@pytest.mark.parametrize("value", ["\u0669\u0660", "\u00b2", "\u0661h", "\u0661:00:00"])
def test_time_limit_takes_only_ascii_digits(value: str) -> None:
    err = refused(time_limit=value)
    assert err.message.startswith("time_limit: ") and "0-9" in err.message
    assert "invalid literal" not in err.message


@pytest.mark.parametrize("value", ["\u0661\u0666G", "\u0661\u0666", "\u00b2M"])
def test_mem_takes_only_ascii_digits(value: str) -> None:
    with pytest.raises(SpecError, match="mem: .* is not a size"):
        parse(mem=value)


def test_relative_deadline_takes_only_ascii_digits() -> None:
    with pytest.raises(SpecError, match="deadline: .*0-9"):
        parse(deadline="+\u0663\u0666h")


def test_pieces_take_only_ascii_digits() -> None:
    with pytest.raises(SpecError, match="pieces: .*0-9"):
        parse(pieces="\u0661-\u0664")


def test_gpu_type_of_other_digits_is_not_called_a_count() -> None:
    err = refused(gpu="\u0662")
    assert "gpu:2 means two GPUs" not in err.message
    assert "gpu:2 means two GPUs" in refused(gpu="2").message


def test_ascii_sizes_and_durations_still_read() -> None:
    spec = parse(time_limit="90", mem="16G")
    assert spec.time_limit_s == 5400 and spec.mem_mb == 16 * 1024


# -- 10: booleans hint what to write -------------------------------------------------------------


@pytest.mark.parametrize(("value", "hint"), [
    ("no", "write interruptible = false"), ("False", "write interruptible = false"),
    ("off", "write interruptible = false"), (0, "write interruptible = false"),
    ("yes", "write interruptible = true"), ("true", "write interruptible = true"),
    ("on", "write interruptible = true"), (1, "write interruptible = true"),
    ("maybe", "write interruptible = true or interruptible = false, without quotes"),
])
def test_boolean_hint_says_what_to_write(value: Any, hint: str) -> None:
    err = refused(interruptible=value)
    assert err.message == f"interruptible: must be true or false, got {value!r}"
    assert err.hint == hint


# -- deadlines and durations written almost right --------------------------------------------
def test_a_deadline_date_joined_to_an_offset_is_refused_for_what_it_is() -> None:
    with pytest.raises(SpecError) as info:
        parse(deadline="2026-12-31+02:00")
    assert "is not an ISO-8601 date-time" in str(info.value) and "has no time zone" not in str(info.value)


def test_a_toml_date_as_deadline_asks_for_a_time_and_zone() -> None:
    from datetime import date

    with pytest.raises(SpecError) as info:
        parse(deadline=date(2026, 12, 1))
    assert "2026-12-01 is a day, not a moment" in str(info.value) and "datetime.date" not in str(info.value)
    assert 'deadline = "2026-12-01T18:00:00+02:00"' in str(info.value)


def test_minutes_without_a_unit_say_what_to_write() -> None:
    with pytest.raises(SpecError) as info:
        parse(time_limit="1h30")
    assert "'1h30' is not a duration (the minutes need their unit: write 1h30m)" in str(info.value)
    with pytest.raises(SpecError) as info:
        parse(time_limit="soon")
    assert "'soon' is not a duration\n" in str(info.value) + "\n" and "(not a duration)" not in str(info.value)


def test_a_program_name_with_a_space_is_two_arguments_written_as_one() -> None:
    with pytest.raises(SpecError) as info:
        parse(command=["python t.py", "--lr", "1"])
    assert "'python t.py' is one argument with a space" in str(info.value)
    assert 'command = ["python", "t.py", "--lr", "1"]' in str(info.value)
    assert parse(command=["/opt/My Tools/train", "x"]).command == ("/opt/My Tools/train", "x")
    assert parse(command=["./my tool", "x"]).command == ("./my tool", "x")
    with pytest.raises(SpecError) as info:  # the hint is TOML that reads back: JSON strings
        parse(command=["python -c", "print('hi')"])
    assert 'command = ["python", "-c", "print(\'hi\')"]' in str(info.value)


@pytest.mark.parametrize(("field", "value", "named"), [("pieces", "1\u2013400", "U+2013 EN DASH"),
                                                       ("time_limit", "2\u00a0h", "U+00A0 NO-BREAK SPACE")])
def test_a_character_outside_ascii_is_named(field: str, value: str, named: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(**{field: value})
    assert f"at 2 is {named}; write it in plain ASCII" in str(info.value), str(info.value)


# -- what Slurm reads otherwise than people often mean: taken as written, and said ------------------


@pytest.mark.parametrize(("fields", "said"), [
    ({"time_limit": "1:30"},
     'time_limit "1:30" is 1m30s (minutes:seconds, as sbatch reads it); if you meant 1h30m, '
     'write "1:30:00" or "1h30m"'),
    ({"time_limit": "12:00"},
     'time_limit "12:00" is 12m (minutes:seconds, as sbatch reads it); if you meant 12h, write "12:00:00" or "12h"'),
    ({"mem": 16}, 'mem 16 is 16 MB per node (a bare number is MB, as sbatch reads it); '
                  'if you meant gigabytes, write "16G"'),
    ({"mem_per_gpu": " 64 "}, 'mem_per_gpu "64" is 64 MB per GPU (a bare number is MB, as sbatch reads it); '
                              'if you meant gigabytes, write "64G"'),
    ({"pieces": "40"}, 'pieces "40" is one piece, index 40 (Slurm\'s --array grammar); '
                       'if you meant 40 pieces, write "1-40"'),
])
def test_a_value_slurm_reads_otherwise_is_taken_as_written_and_said(fields: dict[str, Any], said: str) -> None:
    spec = parse(**fields)
    assert spec.cautions == (said,)
    assert (spec.time_limit_s, spec.mem_mb, spec.mem_per_gpu_mb, spec.pieces) == (
        {"1:30": 90, "12:00": 720}.get(fields.get("time_limit", ""), 7200), 16 if "mem" in fields else None,
        64 if "mem_per_gpu" in fields else None, fields.get("pieces"))


@pytest.mark.parametrize("fields", [
    {"time_limit": "24:00"}, {"time_limit": "45:00"}, {"time_limit": "90"}, {"time_limit": "1:30:00"},
    {"time_limit": "1h30m"}, {"time_limit": "0-1:30"}, {"mem": "16M"}, {"mem": "16G"}, {"mem": 2048},
    {"mem": "1024"}, {"mem_per_gpu": "512m"}, {"pieces": "1"}, {"pieces": "1-40"}, {"pieces": "40,41"},
])
def test_what_reads_as_people_mean_it_is_not_cautioned(fields: dict[str, Any]) -> None:
    assert parse(**fields).cautions == ()


def test_cautions_are_said_once_and_are_no_part_of_the_job() -> None:
    spec = parse(time_limit="1:30", mem=16, pieces="40")
    assert len(spec.cautions) == 3
    plain = parse(time_limit="90s", mem="16M", pieces="40")
    assert plain.cautions == ('pieces "40" is one piece, index 40 (Slurm\'s --array grammar); '
                              'if you meant 40 pieces, write "1-40"',)
    assert spec == plain and hash(spec) == hash(plain) and "cautions" not in spec_to_dict(spec)
    # The daemon's check of the fields a job file's parse sent: its time and size are written out
    # ("90s", "16M"), so only what stays as written is said again (the CLI says each once).
    assert spec_from_dict(spec_to_dict(spec), now=NOW).cautions == plain.cautions
    assert spec_from_dict(spec_to_dict(spec)).cautions == ()  # a stored spec, read back: said at its submit


def test_a_caution_names_the_sbatch_line_that_wrote_the_value() -> None:
    spec = parse_spec({"group": "vision-lab", "script": {"text": "#!/bin/bash\n#SBATCH --time=2:00\nhostname\n"}},
                      now=NOW)
    assert spec.time_limit_s == 120
    assert spec.cautions == ('time_limit "2:00", from script line 2 (\'#SBATCH --time=2:00\'), is 2m (minutes:seconds, '
                             'as sbatch reads it); if you meant 2h, write "2:00:00" or "2h"',)


def test_a_refused_request_says_its_cautions_too() -> None:
    """"1:30" read as 90 s is often why a request is refused: the refusal says so."""
    err = refused(time_limit="1:30", warning_signal="USR1")
    assert err.message.startswith("warning_signal: the warning would come 45s after the start (time limit 90s")
    assert err.hint is not None and err.hint.endswith(
        '\n  note: time_limit "1:30" is 1m30s (minutes:seconds, as sbatch reads it); if you meant 1h30m, '
        'write "1:30:00" or "1h30m"')
    assert str(err).count("time_limit \"1:30\" is 1m30s") == 1
    several = refused(time_limit="1:30", mem=16, gpus_per_node=99, nodes=0)
    assert several.hint is not None and several.hint.count("\n  note: ") == 2, several.hint


@pytest.mark.parametrize(("pieces", "meant"), [("40%4", "1-40%4"), (" 40%4 ", "1-40%4"), ("12", "1-12")])
def test_a_single_index_is_cautioned_with_its_limit_at_a_time(pieces: str, meant: str) -> None:
    assert parse(pieces=pieces).cautions[0].endswith(f'write "{meant}"')
