"""Operations: Prometheus metrics, health, the TCP listener, notifications and their outbox, systemd.

``stats`` keeps what only the running daemon knows (tick times, Slurm call
errors, the lease); ``metrics`` turns it and the database into Prometheus
families at scrape time; ``health`` decides /healthz and /readyz;
``listener`` serves the three on the opt-in TCP port; ``notify`` turns the
event log into outbox rows and ``outbox`` delivers them, their text written
for each target's markup by ``markup``; ``systemd`` speaks
sd_notify and journald's priority prefixes; ``reload`` applies a SIGHUP.

May import (the layers below it, docs/ARCHITECTURE.md): the domains
(broker.jobs, broker.nodes, broker.money), broker.state and what is below
it; prometheus_client. Never the wiring, the transport, the daemon or the
CLI: the daemon builds the listener, the wiring lists the notify tick.
"""
