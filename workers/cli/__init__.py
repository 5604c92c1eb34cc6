"""`bcw`: the one entry point of bc-workers, one module per group of commands.

`main` parses arguments, reads settings and hands over to the group's handler; it is the
one place that turns errors into what an operator reads: one line naming the setting,
and an exit code (`common`). The groups: `provisioning` (migrate, provision, schemas),
`authorizing` (auth nats, auth db), `running` (run, demo, sim), `operating` (config,
dead-letters, commands, explain, liveness, events), `quarantining` and `bench`. `entry`
is the command itself: this package imports nothing, so that `bcw run` defers its stop
signals before any heavy import; it also ends a command whose stdout closed, exit 141.
The top floor: may use every room of `workers/`; nothing imports it.
"""
