"""The TLS a database URL asks for, read as asyncpg reads it (`libpq.tls`): the URL's
parameter, else the libpq variable, else ~/.postgresql; and the settings refusing, in one
line naming the setting, a TLS file that cannot be read or a verifying mode without a CA."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from workers.runtime.base import libpq
from workers.settings import Settings, describe

PARAMS = {
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslcrl": "PGSSLCRL",
}
HOME = Path("/home/bcw")


@given(
    mode_in_url=st.sampled_from([None, *libpq.MODES]),
    mode_in_env=st.sampled_from([None, *libpq.MODES]),
    in_url=st.sets(st.sampled_from(sorted(PARAMS))),
    in_env=st.sets(st.sampled_from(sorted(PARAMS))),
    defaults=st.sets(st.sampled_from(["root.crt", "root.crl", "postgresql.crt", "postgresql.key"])),
)
def test_the_url_wins_over_the_variable_and_the_variable_over_the_default(
    mode_in_url: str | None,
    mode_in_env: str | None,
    in_url: set[str],
    in_env: set[str],
    defaults: set[str],
) -> None:
    query = [f"{p}=/url/{p}" for p in sorted(in_url)]
    if mode_in_url:
        query.append(f"sslmode={mode_in_url}")
    url = "postgresql://u:pw@db:5432/bcw" + ("?" + "&".join(query) if query else "")
    environ = {PARAMS[p]: f"/env/{p}" for p in in_env}
    if mode_in_env:
        environ["PGSSLMODE"] = mode_in_env
    found = libpq.tls(url, environ, HOME, lambda path: Path(path).name in defaults)
    mode = mode_in_url or mode_in_env or "prefer"
    assert found.mode == mode
    assert found.mode_origin == (
        "BCW_DATABASE_URL" if mode_in_url else "PGSSLMODE" if mode_in_env else "default"
    )
    files = {f.param: f for f in found.files}
    for param, default in zip(
        PARAMS, ["root.crt", "postgresql.crt", "postgresql.key", "root.crl"], strict=True
    ):
        loaded = libpq.MODES.index(mode) >= libpq.MODES.index(
            "require" if param in ("sslrootcert", "sslcrl") else "allow"
        )
        if not loaded:
            assert param not in files
        elif param in in_url:
            assert (files[param].path, files[param].origin) == (f"/url/{param}", "BCW_DATABASE_URL")
        elif param in in_env:
            assert (files[param].path, files[param].origin) == (f"/env/{param}", PARAMS[param])
        elif default in defaults:
            assert files[param].path == str(HOME / ".postgresql" / default)
        else:
            assert param not in files


def test_an_unknown_sslmode_is_named_where_it_was_given() -> None:
    with pytest.raises(ValueError, match=r"^BCW_DATABASE_URL: its sslmode 'verify' is not one of"):
        libpq.tls("postgresql://db/x?sslmode=verify", {}, None)
    with pytest.raises(ValueError, match=r"^PGSSLMODE: 'on' is not one of"):
        libpq.tls("postgresql://db/x", {"PGSSLMODE": "on"}, None)


CA_URL = "postgresql://u:hunter2@db:5432/bcw?sslmode=verify-full&sslrootcert={ca}"


# one case a row, read down its columns: kept out of the formatter (fmt: skip)
@pytest.mark.parametrize(
    ("url", "env", "line"),
    [
        (CA_URL.replace("{ca}", "{missing}"), {}, "BCW_DATABASE_URL: its sslrootcert={missing} does not exist"),
        ("postgresql://db/bcw?sslmode=verify-full", {"PGSSLROOTCERT": "{missing}"}, "PGSSLROOTCERT: {missing} does not exist"),
        ("postgresql://db/bcw?sslmode=require&sslcert={ca}&sslkey={missing}", {}, "BCW_DATABASE_URL: its sslkey={missing} does not exist"),
        ("postgresql://db/bcw", {"PGSSLCERT": "{missing}"}, "PGSSLCERT: {missing} does not exist"),
        ("postgresql://db/bcw?sslmode=verify-ca&sslrootcert={dir}", {}, "BCW_DATABASE_URL: its sslrootcert={dir} is not a readable file"),
        ("postgresql://db/bcw?sslmode=verify-full", {}, "BCW_DATABASE_URL: sslmode=verify-full verifies the server, but no CA file is given"),
        ("postgresql://db/bcw", {"PGSSLMODE": "verify-ca"}, "PGSSLMODE: sslmode=verify-ca verifies the server, but no CA file is given"),
        ("postgresql://db/bcw?sslmode=bogus", {}, "BCW_DATABASE_URL: its sslmode 'bogus' is not one of"),
        ("postgresql://db/bcw?sslmode=verify-full&sslrootcert=system", {}, "BCW_DATABASE_URL: its sslrootcert=system: asyncpg does not know `system`"),
    ],
)  # fmt: skip
def test_settings_refuse_tls_that_can_never_work_in_one_line(
    url: str, env: dict[str, str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    names = {"ca": str(ca), "missing": str(tmp_path / "nope.pem"), "dir": str(tmp_path)}
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.postgresql/root.crt
    monkeypatch.setenv("BCW_DATABASE_URL", url.format(**names))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**names))
    with pytest.raises(ValidationError) as raised:
        Settings()
    lines = describe(raised.value)
    assert len(lines) == 1 and lines[0].startswith(line.format(**names)), lines
    assert "hunter2" not in lines[0]


@pytest.mark.parametrize(
    ("url", "env"),
    [
        (CA_URL, {}),
        ("postgresql://db/bcw?sslmode=verify-full", {"PGSSLROOTCERT": "{ca}"}),
        ("postgresql://db/bcw?sslmode=disable", {"PGSSLROOTCERT": "{missing}"}),  # not loaded
        ("postgresql://db/bcw?sslmode=prefer", {"PGSSLROOTCERT": "{missing}"}),  # not loaded
        ("postgresql://db/bcw?sslmode=require", {}),  # encrypted, not verified: libpq's own
    ],
)
def test_settings_take_tls_that_can_work(
    url: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    names = {"ca": str(ca), "missing": str(tmp_path / "nope.pem")}
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("BCW_DATABASE_URL", url.format(**names))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**names))
    Settings()
