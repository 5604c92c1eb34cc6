"""Review of issue #60 (shows a defect; expected to FAIL until fixed): the ledger's row
rule (`policies.LEDGER_BEFORE_0_4`) hides every migration after 0024 from a worker's
login unless it reads with `migrate.LEDGER_READ`; the liveness worker's
`BCW_LIVENESS_RANGE_SIGHT=auto` decision (`workers/liveness/sight.py`, `switched_on`)
reads the ledger without it, so as its own login it never sees `RANGED_MIGRATION` and
range sight stays off on every production install (on as the owner, as tests run)."""

from __future__ import annotations

import asyncpg

from tests.integration.security import conftest as security
from workers.liveness.sight import switched_on

logins = security.logins  # the fixture: a login per group


async def test_range_sight_auto_decides_the_same_as_the_liveness_login(
    logins: dict[str, str], database_url: str
) -> None:
    owner = await asyncpg.connect(database_url)
    login = await asyncpg.connect(logins["bcw_liveness"])
    try:
        as_owner = await switched_on(owner, "auto")
        as_login = await switched_on(login, "auto")
    finally:
        await owner.close()
        await login.close()
    assert as_owner is True  # a schema this release installed: no older liveness worker
    assert as_login == as_owner  # fails: the login sees migrations up to 0024 only
