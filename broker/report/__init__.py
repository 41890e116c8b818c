"""Reports for people and programs: tables, CSV, JSON (``render``) and charts (``plot``).

Standard library only, except ``plot`` (matplotlib, the ``plot`` extra), which
is imported only when a chart is asked for.

In the top layer with the CLI (docs/ARCHITECTURE.md), and only the CLI
imports it. May import: ``broker.cli.output`` (the table printer) and the
base modules. Never the database: it formats what the daemon answered.
"""
