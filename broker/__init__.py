"""gbroker: a batch job broker in front of Slurm partitions.

Places GPU jobs on spot or on-demand capacity, checkpoints and resumes them
when spot nodes are reclaimed, releases idle nodes, and keeps an exact money
ledger per group, user and semester.

The layers, the design principles and the map of every package are in
docs/ARCHITECTURE.md. May import: nothing (this module only carries the
version); each subpackage's docstring says what it may import.
"""

__version__ = "0.1.0"
