"""Money: prices, the ledger, budgets, quotas, alerts, forecasts and reports.

Everything is integer micro-units (``broker.amount``). Owns the price book
(``pricing``; loaded from the database and turned into a node's price per
node-hour by ``pricebook``), what node time costs (``nodecost``: the one
function that prices a stretch of node time, for the ledger's idle lines,
node sessions and ``gbroker node report``), charging runs and idle node time
(``charging``, ``ledger``), admission against budgets and quotas, budget
alerts, the spend forecast, the spend reports and the budget socket handlers.

May import (the layers below it, docs/ARCHITECTURE.md): broker.state,
broker.caller, broker.ownership, broker.market, broker.userfiles, broker.db,
broker.slurm (accounting), policies and the base modules. Never broker.jobs
or broker.nodes, the wiring, the transport, the CLI or the daemon.
"""
