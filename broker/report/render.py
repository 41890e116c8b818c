"""Spend reports, budget overviews and ledger lines as aligned tables and CSV.

Input is the plain data the daemon answers with (``broker.money.reporting``);
money arrives as integer micro-units next to display strings, and CSV carries
both: cents for people, micro-units for exact sums.
"""

from __future__ import annotations

import csv
import io
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from broker.tables import table

MICROS = Decimal(1_000_000)


def money_plain(micros: int) -> str:
    """1234567890 -> '1234.57' (no currency sign, for CSV)."""
    return str((Decimal(micros) / MICROS).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


REPORT_COLUMNS = ("spend", "gpu_hours", "spot_share_pct", "saved", "lost")


def report_table(data: dict[str, Any]) -> str:
    by = data["by"].upper()
    rows = [[r["key"], r["spend"], r["gpu_hours"], f"{r['spot_share_pct']}%", r["saved"], r["lost"]]
            for r in data["rows"]]
    t = data["total"]
    rows.append(["TOTAL", t["spend"], t["gpu_hours"], f"{t['spot_share_pct']}%", t["saved"], t["lost"]])
    out = [
        f"Semester {data['semester']} ({data['starts_at']} .. {data['ends_at']}), by {data['by']}",
        "",
        table(rows, [by, "SPEND", "GPU-HOURS", "SPOT", "SAVED VS ON-DEMAND", "LOST TO RECLAIMS"]),
    ]
    if data.get("budgets"):
        out += ["", budget_table(data["budgets"], data["semester"])]
    return "\n".join(out)


def report_csv(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["semester", data["by"], "spend", "spend_micros", "gpu_hours", "spot_share_pct", "saved",
                "saved_micros", "lost", "lost_micros"])
    for r in [*data["rows"], data["total"]]:
        w.writerow([data["semester"], r["key"], money_plain(r["spend_micros"]), r["spend_micros"], r["gpu_hours"],
                    r["spot_share_pct"], money_plain(r["saved_micros"]), r["saved_micros"],
                    money_plain(r["lost_micros"]), r["lost_micros"]])
    return buf.getvalue()


def budget_table(budgets: list[dict[str, Any]], semester: str) -> str:
    if not budgets:
        return f"No budgets in {semester} that you can see."
    rows = []
    for b in budgets:
        fc = b.get("forecast") or {}
        if fc.get("runs_out_before_semester_end"):
            runout = fc["runout_at"][:10]
        else:
            runout = "after semester end" if fc.get("runout_at") else "-"
        state = "AT LIMIT" if b["at_limit"] else ""
        rows.append([b["group"], b["amount"], b["spent"], f"{b['pct_spent']:.1f}%", b["reserved"], b["left"],
                     fc.get("burn_per_day", "-"), runout, state])
    return table(rows, ["GROUP", "BUDGET", "SPENT", "USED", "RESERVED", "LEFT", "BURN/DAY", "RUNS OUT", ""]) \
        + f"\n(semester {semester}; burn rate over the last {budgets[0].get('forecast', {}).get('window_days', 7)} days)"


LEDGER_FIELDS = ("id", "slurm_job_id", "run_index", "job_id", "account", "user", "kind", "partition", "capacity",
                 "pool", "gpu_type", "node", "tag", "period_start", "period_end", "seconds", "gpus", "price_micros", "amount_micros",
                 "ondemand_micros")


def ledger_table(lines: list[dict[str, Any]]) -> str:
    if not lines:
        return "No charges yet."
    rows = [[c["slurm_job_id"] or c["node"], c["run_index"] if c["run_index"] is not None else "", c["job_id"] or "",
             c["account"], c["user"], c["partition"], c["tag"], c["period_start"], c["seconds"], c["gpus"],
             money_plain(c["price_micros"]), c["amount"]] for c in lines]
    total = sum(c["amount_micros"] for c in lines)
    return table(rows, ["SLURM/NODE", "RUN", "JOB", "ACCOUNT", "USER", "PARTITION", "TAG", "FROM", "SECONDS",
                        "GPUS", "PRICE/GPU-H", "AMOUNT"]) + f"\n{len(lines)} lines, total {money_plain(total)}"


def ledger_csv(lines: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(LEDGER_FIELDS)
    for c in lines:
        w.writerow(["" if c.get(f) is None else c.get(f) for f in LEDGER_FIELDS])
    return buf.getvalue()
