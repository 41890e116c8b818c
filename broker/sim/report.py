"""Plain-text tables for the simulator's results."""

from __future__ import annotations

from typing import Any

from broker.tables import table


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary_table(out: dict[str, Any]) -> str:
    s = out["setting"]
    head = (
        f"{out['samples']} samples on {len(out['traces'])} traces; W={s['work_hours']:g} h, "
        f"D={s['deadline_hours']:g} h, d={s['changeover_hours']:g} h, nodes={s['nodes']}"
    )
    rows = [
        [
            r["policy"],
            f"{r['cost_ratio_mean']:.3f}",
            pct(r["gap_to_optimal_mean"]),
            pct(r["deadline_met"]),
            f"{r['spot_hours_mean']:.1f}",
            f"{r['ondemand_hours_mean']:.1f}",
            f"{r['cost_usd_mean']:.2f}",
        ]
        for r in out["summary"]
    ]
    body = table(
        rows,
        ["policy", "cost/on-demand", "gap to optimum", "deadlines met", "spot h", "on-demand h", "mean $"],
        numbers=True, rule=True,
    )
    tail = f"({out['seconds']} s)"
    if out.get("skipped_traces"):
        tail += f"; skipped (too few instances): {', '.join(out['skipped_traces'])}"
    return f"{head}\n{body}\n{tail}"


def workload_table(out: dict[str, Any]) -> str:
    rows = [
        [
            r["policy"],
            f"{r['cost_usd']:.2f}",
            f"{r['cost_ratio']:.3f}",
            f"{r['deadlines_met']}/{r['deadlines']}",
            f"{r['gpu_hours_lost_to_reclaims']:.1f}",
            f"{r['spot_gpu_hours']:.1f}",
            f"{r['ondemand_gpu_hours']:.1f}",
            str(r["reclaims"]),
        ]
        for r in out["summary"]
    ]
    body = table(
        rows,
        ["policy", "total $", "cost/on-demand", "deadlines met", "GPU-h lost", "spot GPU-h", "on-demand GPU-h", "reclaims"],
        numbers=True, rule=True,
    )
    return f"{out['jobs']} jobs on {out['trace']}\n{body}\n({out['seconds']} s)"


def pools_table(out: dict[str, Any]) -> str:
    s = out["setting"]
    pools = [p["name"].rsplit("/", 1)[-1].removesuffix(".json") for p in out["pools"]]
    head = (
        f"{out['samples']} samples over {len(pools)} pools; W={s['work_hours']:g} h, "
        f"D={s['deadline_hours']:g} h, d={s['changeover_hours']:g} h, nodes={s['nodes']}"
    )
    rows = []
    for r in out["summary"]:
        by_pool = r["spot_hours_by_pool"]
        rows.append([
            r["policy"],
            f"{r['cost_ratio_mean']:.3f}",
            pct(r["gap_to_optimal_mean"]),
            pct(r.get("saving_vs_best_pool_up_mean")),
            pct(r["deadline_met"]),
            f"{r['ondemand_hours_mean']:.1f}",
            " / ".join(f"{by_pool[p]:.1f}" for p in pools) if r["policy"] != "omniscient" else "-",
        ])
    body = table(
        rows,
        ["policy", "cost/on-demand", "gap to optimum", "saving vs best-pool UP", "deadlines met", "on-demand h",
         "spot h per pool (" + ", ".join(pools) + ")"],
        numbers=True, rule=True,
    )
    return f"{head}\n{body}\n({out['seconds']} s)"
