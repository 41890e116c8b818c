"""`python -m broker` is the `gbroker` command."""

from broker.cli.main import main

main()
