"""Jobs: a job's life from submission to its last attempt.

Owns submission (checks, the sbatch of each attempt), placement (which
capacity a job or attempt gets, from the policy and the market), the
reconcile tick (following Slurm, settling ended runs, recovering from
reclaims, deadline moves), the job socket handlers and the views the CLI shows.

May import (the layers below it, docs/ARCHITECTURE.md): broker.nodes,
broker.money (admission, the ledger's charges), broker.state, broker.caller,
broker.ownership, broker.market, broker.userfiles, broker.slurm, broker.db,
policies and the base modules (spec, states, config, clock, errors, proc,
checkpoint). Never the wiring, the transport (api, client), the CLI or the
daemon.
"""
