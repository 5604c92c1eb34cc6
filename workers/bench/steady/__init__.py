"""`bcw bench steady`: a fleet held connected for minutes, the way it is held for weeks.

`fleet` makes the sessions in bulk and runs the simulated gateways that flush them;
`figures` turns what was watched into the per-minute lines, the last line and the bounds
it is judged by (pure); `run` starts the servers and the liveness processes and watches.
"""
