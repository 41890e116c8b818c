"""Nodes: powering cloud and spot nodes up and down, and billing their time.

Owns the node manager (the Slurm power hooks and the node tick), the release
policy (which idle node to give back), node sessions (the billed time of each
power-up), what Slurm says about nodes, the node socket handlers, and the
providers (``providers/``: local, command, AWS) that create and delete
instances.

May import (the layers below it, docs/ARCHITECTURE.md): broker.money,
broker.state, broker.caller, broker.ownership, broker.market,
broker.userfiles, broker.slurm, broker.db, policies and the base modules.
Never broker.jobs, the wiring, the transport, the CLI or the daemon.
"""
