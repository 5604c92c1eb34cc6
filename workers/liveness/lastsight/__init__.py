"""A session's last sight, as the liveness worker keeps it from the gateways' flushes:
the two ways (a row per session, `rows`; range rows, `workers.liveness.sight`), the one
place that chooses between them once per process (`seam.LastSight`), and the order in
which the worker's transactions lock the rows that hold a sight (`locks.LOCK_ORDER`).
It uses the liveness worker's other modules and the runtime; the handler
(`workers.liveness.apply`) and the sweep use it.
"""
