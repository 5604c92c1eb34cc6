"""`bcw`: the one entry point of bc-workers, one module per group of commands.

`main` parses arguments, reads settings and hands over to the group's handler; it is the
one place that turns errors into what an operator reads: one line naming the setting,
and an exit code (`common`). The groups: `provisioning` (migrate, provision, schemas,
auth), `running` (run, demo, sim), `operating` (dead-letters, commands, explain,
liveness, events) and `bench`. `entry` is the command itself: this package imports
nothing, so that `bcw run` defers its stop signals before any heavy import.
"""
