"""Node providers: what makes the instance behind a Slurm node exist or not (local, command, AWS).

``base`` holds the contract, the registry (a provider's module is imported
only when it is chosen, so ``command`` never imports boto3) and the orphan
sweep plan; ``hooks`` what Slurm's ResumeProgram and SuspendProgram need,
shared by the daemon and the CLI; ``runner`` the one way a provider runs a
site's command (argv, no shell, a timeout).

In the nodes layer (docs/ARCHITECTURE.md). May import: the base modules,
``policies`` and ``broker.slurm``'s plain helpers (``hostlist``), nothing
that loads the ORM: the CLI's power hooks import ``hooks`` and call a
provider themselves when the daemon does not answer.
"""
