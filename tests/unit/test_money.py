from decimal import Decimal

import pytest

from broker.amount import cost_micros, format_money, parse_money


@pytest.mark.parametrize(
    "text,micros",
    [("12000", 12_000_000_000), ("412.30", 412_300_000), ("$1,200.50", 1_200_500_000), (3, 3_000_000),
     (Decimal("0.000001"), 1), ("-5", -5_000_000), ("12_000", 12_000_000_000), ("1,234,567.5", 1_234_567_500_000)],
)
def test_parse_money(text, micros):
    assert parse_money(text) == micros


@pytest.mark.parametrize("bad", ["", "abc", "1.0000001", "nan", "inf", "1e400000", "1,5", "12.000,50", "1$2",
                                 "1,20", "+5", True, "1e3", "1 000", "\u0661\u0662"])
def test_parse_money_refuses(bad):
    with pytest.raises(ValueError):
        parse_money(bad)


def test_a_decimal_comma_is_refused_with_what_to_write():
    with pytest.raises(ValueError, match=r"write the decimal point as '\.', e\.g\. 1\.50"):
        parse_money("1,5")


@pytest.mark.parametrize(("written", "readings"), [("1,500", "1500 or 1.5?"), ("$12,000", "$12000 or $12?"),
                                                   ("-1,500", "-1500 or -1.5?")])
def test_one_thousands_group_without_a_point_is_ambiguous(written, readings):
    """1,500 is 1500 in one lab and 1.5 in another: refused, with both readings."""
    with pytest.raises(ValueError, match="is ambiguous") as info:
        parse_money(written)
    assert readings in str(info.value) and f"{written}.00" in str(info.value), str(info.value)
    assert parse_money(f"{written}.00") == parse_money(written.replace(",", ""))


@pytest.mark.parametrize("written", ["0,918", "0,918,000", "-0,5"])
def test_a_leading_zero_group_is_a_decimal_comma(written):
    with pytest.raises(ValueError, match=r"write the decimal point as '\.'"):
        parse_money(written)


def test_cost_is_exact_and_rounds_half_even_once():
    # 3.06 $/GPU-h for 4 GPUs over 90 minutes
    assert cost_micros(3_060_000, 5400, 4) == 18_360_000
    # one second at 1 micro/hour: 1/3600 of a micro -> rounds to 0; 1800 s -> 0.5 -> half-even 0; 5400 s -> 1.5 -> 2
    assert cost_micros(1, 1) == 0
    assert cost_micros(1, 1800) == 0
    assert cost_micros(1, 5400) == 2
    # splitting a period in two never differs from the whole by more than a micro
    whole = cost_micros(918_000, 7 * 3600 + 17, 8)
    parts = cost_micros(918_000, 3 * 3600, 8) + cost_micros(918_000, 4 * 3600 + 17, 8)
    assert abs(whole - parts) <= 1


def test_format_money():
    assert format_money(1_234_567_890) == "$1,234.57"
    assert format_money(-412_300_000) == "-$412.30"
    assert format_money(0) == "$0.00"
