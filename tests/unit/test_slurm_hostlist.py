"""Hostlist expansion without calling Slurm."""

from __future__ import annotations

import pytest

from broker.slurm.hostlist import compress, expand


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


def test_compress_is_a_plain_list() -> None:
    assert compress(["spot1", "od2"]) == "spot1,od2"


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
