"""A worker process running the tally worker through `bcw`'s own entry function, for the
tests that kill or signal a real process. Settings come from the environment."""

import sys

from workers.runtime.base.waiting import defer_stop_signals

defer_stop_signals()  # before the imports below: a test may stop it while it starts

from tests.integration.support import build_tally  # noqa: E402
from workers.cli.running import run_workers  # noqa: E402
from workers.settings import Settings  # noqa: E402

if __name__ == "__main__":
    settings = Settings()
    sys.exit(run_workers(settings, [build_tally(settings)]))
