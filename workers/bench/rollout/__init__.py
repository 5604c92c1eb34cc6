"""`bcw bench rollout`: every gateway of a connected fleet drained in turn, P at a time,
its daemons redialling the others with real Hellos, while commands stay in flight.

`plan` says which gateways drain together, the daemons' back-off and how the commands
are spread (pure); `tally` turns what was watched into the lines and the last line
(pure); `gateways` makes the fleet in bulk and the gateways that hold it; `daemons`
drives the fake daemons that redial; `run` holds the steady state and rolls;
`poweron` is the power-on herd at the gateways' limits (`--power-on`).
"""
