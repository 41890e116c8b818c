"""Budget burn-down charts (matplotlib, the ``plot`` extra; imported only for --plot).

One line per group: money left over the semester, from the budget down,
with the forecast at the recent burn rate drawn dashed from now on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

MICROS_PER_UNIT = 1_000_000


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text)  # 3.11 reads the trailing Z


def plot_burndown(data: dict[str, Any], path: str) -> int:
    """Draw ``data`` (the daemon's ``burndown`` answer) into ``path`` (PNG). Returns the number of groups."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.dates import date2num
    except ImportError as exc:  # pragma: no cover (depends on the install)
        from broker.errors import BrokerError

        raise BrokerError("--plot needs matplotlib", hint="pip install 'gbroker[plot]'") from exc
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for i, series in enumerate(data["series"]):
        color = f"C{i % 10}"
        xs = [float(date2num(_t(t))) for t, _ in series["points"]]
        ys = [v / MICROS_PER_UNIT for _, v in series["points"]]
        ax.step(xs, ys, where="post", color=color, label=f"{series['group']} (budget "
                f"{series['amount_micros'] / MICROS_PER_UNIT:,.0f})")
        if series["forecast"]:
            fx = [float(date2num(_t(t))) for t, _ in series["forecast"]]
            fy = [v / MICROS_PER_UNIT for _, v in series["forecast"]]
            ax.plot(fx, fy, linestyle="--", color=color,
                    label=f"{series['group']} forecast" + (f" (runs out {series['runout_at'][:10]})"
                                                           if series.get("runout_at") else ""))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axvline(float(date2num(_t(data["now"]))), color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlim(float(date2num(_t(data["starts_at"]))), float(date2num(_t(data["ends_at"]))))
    ax.xaxis_date()
    ax.set_title(f"Budget burn-down, semester {data['semester']}")
    ax.set_ylabel("money left")
    ax.grid(True, alpha=0.3)
    if data["series"]:
        ax.legend(loc="upper right", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(data["series"])
