"""The one map of worker kinds: name → `build(settings) -> Worker`. Read by `bcw run`.

Explicit on purpose: no registration by import side effect.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.runtime.settings import Settings
from workers.runtime.worker import Worker

WORKERS: dict[str, Callable[[Settings], Worker]] = {}
