"""A worker process running the tally worker through `bcw`'s own entry function, for the
tests that kill or signal a real process. Settings come from the environment."""

import sys

from tests.integration.support import build_tally
from workers.cli import run_workers
from workers.runtime.base.settings import Settings

if __name__ == "__main__":
    settings = Settings()
    sys.exit(run_workers(settings, [build_tally(settings)]))
