"""Exact money: integer micro-units of the currency (1 USD = 1_000_000).

Never float. Prices are micro-units per GPU-hour; durations are whole seconds.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal

MICROS_PER_UNIT = 1_000_000
SECONDS_PER_HOUR = 3600


_AMOUNT = re.compile(r"-?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:_[0-9]+)*)(?:\.[0-9]+)?")
"""'12000', '412.30', '$1,200.50', '-5', '12_000': commas only between groups of three digits,
'.' the only decimal mark, '$' only before the digits."""


def parse_money(text: str | int | Decimal) -> int:
    """'12000', '412.30', '$1,200.50' -> micro-units. Raises ValueError (a decimal comma, '1,5',
    is refused, never read as 15; '1,500', which is 1500 or 1.5 by where one lives, is refused too)."""
    if isinstance(text, bool):
        raise ValueError(f"not an amount of money: {text!r}")
    if isinstance(text, int):
        return text * MICROS_PER_UNIT
    raw = str(text).strip()
    if not isinstance(text, Decimal) and not _AMOUNT.fullmatch(raw):
        hint = " (write the decimal point as '.', e.g. 1.50)" if re.fullmatch(r"-?\$?[0-9]+,[0-9]{1,2}", raw) else ""
        raise ValueError(f"not an amount of money: {text!r}{hint}")
    if not isinstance(text, Decimal):
        if re.match(r"-?\$?0,", raw):  # no number starts with a thousands group of 0: a decimal comma
            raise ValueError(f"not an amount of money: {text!r} (write the decimal point as '.', e.g. "
                             f"{raw.replace(',', '.', 1)})")
        group = re.fullmatch(r"(-?\$?)([0-9]{1,3}),([0-9]{3})", raw)
        if group:  # one thousands group and no point: 1,500 is 1500 in one lab and 1.5 in another
            sign, whole, part = group.groups()
            as_point = Decimal(f"{whole}.{part}").normalize()
            raise ValueError(f"{text!r} is ambiguous: {sign}{whole}{part} or {sign}{as_point}? "
                             f"(write {sign}{whole}{part}, or {raw}.00 with the thousands separator)")
    s = raw.replace("$", "").replace(",", "").replace("_", "")
    try:
        d = Decimal(s)
    except Exception as exc:  # decimal.InvalidOperation
        raise ValueError(f"not an amount of money: {text!r}") from exc
    if not d.is_finite():
        raise ValueError(f"not an amount of money: {text!r}")
    try:
        micros = (d * MICROS_PER_UNIT).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    except ArithmeticError:
        raise ValueError(f"amount out of range: {text!r}") from None
    if micros != d * MICROS_PER_UNIT:
        raise ValueError(f"more than 6 decimal places: {text!r}")
    return int(micros)


def cost_micros(price_micros_per_hour: int, seconds: int, units: int = 1) -> int:
    """Cost of `units` (GPUs or nodes) for `seconds` at a per-hour price.

    Rounded half-even to the micro-unit once, at the end.
    """
    num = price_micros_per_hour * seconds * units
    q, r = divmod(num, SECONDS_PER_HOUR)
    if 2 * r > SECONDS_PER_HOUR or (2 * r == SECONDS_PER_HOUR and q % 2 == 1):
        q += 1
    return q


_shown_as = "$"
"""How money is written: the lab's currency (``currency`` in the settings; see ``show_in``)."""


def currency_prefix(code: str) -> str:
    """``$`` for USD, else the ISO code and a space (``EUR 1,234.50``)."""
    return "$" if code == "USD" else f"{code} "


def show_in(code: str) -> None:
    """Write money in ``code`` from now on (the daemon calls it with its settings, and again on SIGHUP)."""
    global _shown_as
    _shown_as = currency_prefix(code)


def format_money(micros: int, currency: str | None = None) -> str:
    """1234567890 -> '$1,234.57' (rounded to cents for display only).

    ``currency``: a prefix to write instead of the lab's currency."""
    sign = "-" if micros < 0 else ""
    cents = (abs(micros) + 5_000) // 10_000
    return f"{sign}{_shown_as if currency is None else currency}{cents // 100:,}.{cents % 100:02d}"
