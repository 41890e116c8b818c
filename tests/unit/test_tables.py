"""The one table printer: the CLI's, the reports' and the simulator's tables."""

from __future__ import annotations

import pytest

from broker.tables import table


def test_people_tables_are_left_aligned_without_trailing_spaces() -> None:
    got = table([[1, "train", None], [12, "a-much-longer-name", "x"]], ["ID", "NAME", "NOTE"])
    assert got == ("ID  NAME                NOTE\n"
                   "1   train\n"
                   "12  a-much-longer-name  x")


def test_short_rows_leave_their_last_columns_empty_and_long_ones_are_refused() -> None:
    assert table([["a"]], ["ONE", "TWO"]) == "ONE  TWO\na"
    assert table([], ["ONE", "TWO"]) == "ONE  TWO"
    with pytest.raises(ValueError, match="3 cells under 2 headers"):
        table([["a", "b", "c"]], ["ONE", "TWO"])


def test_figures_right_aligned_under_a_rule() -> None:
    got = table([["greedy", "1.000", "12.5%"], ["gbroker", "0.412", "100.0%"]], ["policy", "cost", "met"],
                numbers=True, rule=True)
    assert got == ("policy    cost     met\n"
                   "-------  -----  ------\n"
                   "greedy   1.000   12.5%\n"
                   "gbroker  0.412  100.0%")


def test_the_three_printers_are_this_one() -> None:
    from broker.cli import output
    from broker.report import render
    from broker.sim import report

    assert output.table is render.table is report.table is table
