"""Every setting of a `bcw` process: the runtime's (`workers.runtime.base.settings`) and
each worker's own (`workers/<name>/settings.py`), composed into the one `Settings` the
entry point reads from the environment and every worker's `build` is given.

Beside the registry: the runtime knows no worker, so the composition is here. The
variables, their secrets, `bcw config` and the refusals are the runtime's `Catalog` of
this composition; `python -m workers.settings FILE…` rewrites the docs' settings tables
(`make docs`).
"""

from __future__ import annotations

import sys

from pydantic import Field

from workers.liveness.settings import LivenessSettings
from workers.quarantine.settings import QuarantineSettings
from workers.replay.settings import ReplaySettings
from workers.runtime.base import settings_docs
from workers.runtime.base.settings import Catalog, RuntimeSettings


class Settings(RuntimeSettings):
    """Everything a `bcw` process reads from its environment: the runtime's settings and
    the workers' groups."""

    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings)
    liveness: LivenessSettings = Field(default_factory=LivenessSettings)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)


CATALOG = Catalog(Settings)
#: every group by its class name: `Settings` (the process's own settings), the runtime's
#: groups, the workers'
GROUPS = CATALOG.groups

secret_files = CATALOG.secret_files
read_secret_files = CATALOG.read_secret_files
unknown_variables = CATALOG.unknown_variables
effective = CATALOG.effective
describe = CATALOG.describe


if __name__ == "__main__":
    raise SystemExit(settings_docs.main(sys.argv[1:], GROUPS))
