"""The simulator: replay spot traces to compare placement policies (``gbroker simulate``).

Owns loading traces (``trace``), what a job sees of the market over time
(``feed``), one job under one policy (``engine``), the single-job and
workload modes (``single``, ``workload``), the offline optimum
(``optimum``) and the result tables (``report``). It calls the very policy
objects the daemon uses (principle 1), in simulated time.

In the top layer with the CLI (docs/ARCHITECTURE.md): nothing in the daemon
imports it. May import: ``policies``, ``broker.amount`` and the base
modules; never the database or Slurm, so it runs anywhere.
"""
