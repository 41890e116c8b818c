"""Reports for people and programs: tables, CSV, JSON (``render``) and charts (``plot``).

Standard library only, except ``plot`` (matplotlib, the ``plot`` extra), which
is imported only when a chart is asked for.
"""
