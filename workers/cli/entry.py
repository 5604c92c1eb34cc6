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

#: what a command whose reader went away (`bcw config | head -1`) exits with: 128 + SIGPIPE,
#: as a program the signal ends (`cat`, `git log`), so `set -o pipefail` reads it alike
EXIT_CLOSED_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """`bcw`; a closed stdout ends it quietly, exit `EXIT_CLOSED_PIPE` (no traceback, no
    "Exception ignored" at exit: Python's documented way, stdout pointed at devnull)."""
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help and usage errors: their output flushed here
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
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
