"""`bcw`: the one entry point of bc-workers, one module per group of commands.

`main` parses arguments, reads settings and hands over to the group's handler; it is the
one place that turns errors into what an operator reads: one line naming the setting,
and an exit code (`common`). The groups: `provisioning` (migrate, provision, schemas,
auth), `running` (run, demo, sim), `operating` (dead-letters, commands, explain,
liveness, events) and `bench`.
"""

from workers.cli.main import main
from workers.cli.running import run_workers

__all__ = ["main", "run_workers"]
