"""Money: prices, the ledger, budgets, quotas, alerts, forecasts and reports.

Everything is integer micro-units (``amount``). Owns the price book
(``pricing``), charging runs and node time (``charging``, ``ledger``),
admission against budgets and quotas, budget alerts, the spend forecast, the
spend reports and the budget socket handlers.

May import (the layers below it, docs/ARCHITECTURE.md): broker.state,
broker.caller, broker.ownership, broker.market, broker.userfiles, broker.db,
broker.slurm (accounting), policies and the base modules. Never broker.jobs
or broker.nodes, the wiring, the transport, the CLI or the daemon.
"""
