"""Real faults: a TCP proxy that cuts, refuses or blackholes; servers stopped and
restarted; kill -9; a three-server JetStream cluster. Their lengths are the point."""
