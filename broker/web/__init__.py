"""The read-only web dashboard on the ops listener, and its sign-in tokens.

``app`` answers the dashboard's requests through the socket's own handlers
with the signed-in user's ``Caller``; ``pages`` renders HTML (every value
escaped), ``charts`` inline SVG; ``auth`` mints, lists, revokes and checks
tokens (``token_*`` socket operations, listed by ``broker/wiring.py``);
``nodes`` adds up node time per node. Served by ``broker/ops/listener.py``.

May import (the layers below it, docs/ARCHITECTURE.md): the domains
(broker.jobs, broker.nodes, broker.money), broker.state and what is below
it; the standard library. Never the transport, the daemon or the CLI: the
daemon hands the dashboard its handler table and how to name a uid's caller.
"""
