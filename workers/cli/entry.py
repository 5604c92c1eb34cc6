"""The `bcw` command itself (`[project.scripts]`, and `python -m workers.cli`).

Kept apart from `main` so that it imports nothing heavy before a `bcw run` defers its stop
signals: the imports of every command group take a second on an idle node and several on
a loaded one, and a SIGTERM in that window (a pod deleted, a Deployment rolled, as it
comes up) would otherwise end the process unhandled, exit -15, instead of a clean exit 0.

It checks the standard `OTEL_*` variables first (`otel_env.check`, which imports no part
of OpenTelemetry): the SDK reads some of them as it is imported, and fails there with a
traceback (span limits) or logs one (`OTEL_PYTHON_CONTEXT`); a bad one is one line, exit 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv)[:1] == ["run"]:
        from workers.runtime.base.waiting import defer_stop_signals

        defer_stop_signals()  # `run_workers` hands what came meanwhile to its event loop
    from workers.runtime.base.errors import SettingError
    from workers.runtime.observability import otel_env

    try:
        otel_env.check(os.environ)  # before anything imports the SDK
    except SettingError as error:
        print(f"bcw: {error}", file=sys.stderr)
        return 2
    from workers.cli.main import main as bcw

    return bcw(argv)
