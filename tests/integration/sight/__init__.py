"""What the liveness controller sees of each gateway: blind, seen again, gone, restarted —
reference gateways under a running liveness worker, and sweeps run one by one on the
database's clock."""
