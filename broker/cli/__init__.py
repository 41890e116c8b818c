"""The `gbroker` command (click): thin. Parse, ask the daemon over the socket, print.

Owns the commands for researchers (``jobs``), lab admins (``admin``),
reports, the simulator, Slurm's node hooks and starting the daemon
(``daemon_cmd``), and the printing of tables and JSON (``output``). The CLI
never loads the ORM on its way to the daemon (principle 2): the daemon, the
simulator and the hooks' fallback are imported inside the commands that run
them.

In the top layer, with ``broker.report`` and ``broker.sim`` (docs/ARCHITECTURE.md).
May import: anything below it, the heavy parts lazily. Nothing imports the
CLI but ``broker.__main__`` and ``broker.report`` (its table printer).
"""
