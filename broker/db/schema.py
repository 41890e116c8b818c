"""Every table on one metadata: importing this module loads each table module.

The table modules import ``broker.db.base`` (and ``models`` for the jobs table
their keys name), never the other way round, so nothing else knows the list.
Alembic's environment and the schema tests read ``metadata`` from here.
"""

from __future__ import annotations

from broker.db import array_models, ledger_models, models, node_models, ops_models, web_models
from broker.db.base import Base

TABLE_MODULES = (models, ledger_models, node_models, ops_models, array_models, web_models)
metadata = Base.metadata
