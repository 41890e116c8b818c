"""The database: SQLAlchemy models, small store functions, Alembic migrations.

Only the daemon imports this package (principle 2); the CLI never does, so it
starts without loading the ORM. Entry points: ``broker.db.store`` (the
functions), ``broker.db.engine`` (engines and sessions), ``broker.db.migrate``
(``upgrade_to_head``). The tables: ``base`` (what they share), one module per
domain (``models``: jobs, attempts, events; ``ledger_models``, ``node_models``,
``ops_models``, ``array_models``, ``web_models``), ``schema`` (all of them on one
metadata).

May import: the base modules (``states``, ``spec``, ``errors``) and
``policies`` (for ``Capacity``). Never broker.slurm, the market, the daemon's
state or a domain: the store holds no Slurm, policy or money rules.
"""
