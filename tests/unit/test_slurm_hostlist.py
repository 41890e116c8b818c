"""Hostlist expansion and compression without calling Slurm."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.slurm.hostlist import compress, expand, slurm_sorted


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("spot1", ["spot1"]),
        ("spot[1-3,5]", ["spot1", "spot2", "spot3", "spot5"]),
        ("spot[1-2],od1", ["spot1", "spot2", "od1"]),
        ("od[1-2],spot[3-4]", ["od1", "od2", "spot3", "spot4"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-a[1,3]-x", ["gpu-a1-x", "gpu-a3-x"]),
        ("spot1,spot1", ["spot1"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
        (None, []),
    ],
)
def test_expand(text: str | None, want: list[str]) -> None:
    assert expand(text) == want


@pytest.mark.parametrize("bad", ["spot[1-", "spot]1", "spot[a-b]", "spot[3-1]"])
def test_expand_refuses_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        expand(bad)


def test_compress_is_a_plain_list_when_nothing_shares_a_prefix() -> None:
    assert compress(["spot1", "od2"]) == "od2,spot1"  # sorted, as Slurm writes a hostlist


@pytest.mark.parametrize("bad", ["", "a,b", "a b", "a=b", "a[1]"])
def test_compress_refuses_non_names(bad: str) -> None:
    with pytest.raises(ValueError):
        compress([bad])


def test_count_and_limit_never_expand_a_huge_hostlist() -> None:
    import time

    from broker.slurm.hostlist import TooManyNodes, count

    assert count("spot[1-4],od[1-2],x") == 7
    assert count("r[1-2]n[01-03]") == 6
    t = time.monotonic()
    assert count("n[1-2000000]") == 2_000_000
    with pytest.raises(TooManyNodes):
        expand("n[1-2000000]", limit=10_000)
    with pytest.raises(TooManyNodes):
        expand("a[1-1000]b[1-1000]", limit=10_000)
    assert time.monotonic() - t < 0.5
    assert expand("spot[1-3]", limit=3) == ["spot1", "spot2", "spot3"]


def test_compress_writes_ranges() -> None:
    names = [f"spot{i}" for i in range(1, 200)]
    assert compress(names) == "spot[1-199]"
    assert compress(list(reversed(names)) + names) == "spot[1-199]"  # any order, duplicates dropped
    assert compress([]) == ""


# What Slurm 22.05's `scontrol show hostlistsorted` prints for the same names.
@pytest.mark.parametrize(
    ("names", "want"),
    [
        ("spot3,spot1,spot2,spot5", "spot[1-3,5]"),
        ("spot10,spot9,od2,spot1,n08,n8,n100,n9,n09,login,login1", "login,login1,n[8-9,08-09,100],od2,spot[1,9-10]"),
        ("122,123,a,a0,a00,a01,a1", "[122-123],a,a[0-1,00-01]"),
        ("r10n1,r2n1,r2n2,a01x,a1x", "a01x,a1x,r2n[1-2],r10n1"),
        ("n098,n099,n100,n99,spot9,spot10,spot010", "n[99,098-100],spot[9-10,010]"),
        ("gpu-od2,gpu-spot1,gpu-spot2,gpu-od1", "gpu-od[1-2],gpu-spot[1-2]"),
        ("n08,n09,n10,n11", "n[08-11]"),
    ],
)  # fmt: skip
def test_compress_writes_what_slurm_writes(names: str, want: str) -> None:
    assert compress(names.split(",")) == want
    assert expand(want) == slurm_sorted(names.split(","))


def test_a_suffix_too_long_for_slurm_stays_whole() -> None:
    long = "n" + "1" * 19
    assert compress([long, "n" + "1" * 18 + "2"]) == f"{long},n{'1' * 18}2"


node_names = st.lists(
    st.builds(
        lambda prefix, number, pad: prefix + str(number).zfill(pad),
        st.sampled_from(["spot", "od", "gpu-a", "r1n", "r10n", "a", "a0", "x_y", ""]),
        st.integers(0, 1200),
        st.sampled_from([0, 0, 0, 2, 3, 4]),
    )
    | st.sampled_from(["spot", "login", "a"])  # names without a number
    | st.from_regex(r"[a-z][a-z0-9_.-]{0,6}[0-9]{0,3}", fullmatch=True),
    max_size=60,
)


@given(node_names)
def test_compress_round_trips_through_expand(names: list[str]) -> None:
    text = compress(names)
    assert expand(text) == slurm_sorted(names)
    assert set(expand(text)) == set(names)
    assert compress(expand(text)) == text
    assert compress(slurm_sorted(names)[::-1]) == text
