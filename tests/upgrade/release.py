"""The previous release, found and installed beside this checkout.

A release is a version in `pyproject.toml`, an entry `## [X.Y.Z]` in `CHANGELOG.md` and a
tag `vX.Y.Z`. The previous release is the highest version in the changelog below the
current one. Its commit is its tag; a checkout without tags finds it in the history: the
last commit before `pyproject.toml`'s version changed to the current one (checked to
carry the previous version). It is installed from that commit's tree, as a user would
install it, into a virtualenv of its own, cached under `.bcw/releases/<commit>`."""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bcw" / "releases"
HEADING_RE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\]", re.MULTILINE)
VERSION_RE = re.compile(r'^version = "([^"]+)"', re.MULTILINE)


class ReleaseError(RuntimeError):
    """The changelog names a release that cannot be found or installed."""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str

    @property
    def source(self) -> Path:
        """Its source tree (see `install`)."""
        return CACHE / self.commit / "src"

    @property
    def bcw(self) -> Path:
        """Its `bcw`, installed (see `install`)."""
        return CACHE / self.commit / "venv" / "bin" / "bcw"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def current_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def previous_version() -> str | None:
    """The highest version of the changelog below the current one (None: none yet)."""
    current = _parse(current_version())
    listed = [
        tuple(int(p) for p in m) for m in HEADING_RE.findall((REPO / "CHANGELOG.md").read_text())
    ]
    older = sorted(v for v in listed if v < current)
    return ".".join(str(p) for p in older[-1]) if older else None


def _version_at(commit: str) -> str | None:
    match = VERSION_RE.search(_git("show", f"{commit}:pyproject.toml"))
    return match.group(1) if match else None


def previous_release() -> Release | None:
    version = previous_version()
    if version is None:
        return None
    try:
        return Release(
            version, _git("rev-parse", "--verify", "-q", f"refs/tags/v{version}^{{commit}}")
        )
    except ReleaseError:
        pass  # a checkout without tags: the history says where
    current = current_version()
    bump = None  # the oldest commit so far that carries the current version
    for commit in _git("log", "--format=%H", "--", "pyproject.toml").splitlines():
        if _version_at(commit) != current:
            break
        bump = commit
    if bump is not None:
        before = _git("rev-parse", f"{bump}^")
        if _version_at(before) == version:
            return Release(version, before)
    raise ReleaseError(
        f"CHANGELOG.md lists {version}, but neither tag v{version} nor a commit before the "
        f"version became {current} carries it"
    )


def install(release: Release) -> Path:
    """The release's `bcw`, from its commit's tree in a virtualenv of its own (once: later
    calls, in any test process, find it ready)."""
    home = CACHE / release.commit
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "installed").exists():
            return release.bcw
        for stale in ("src", "venv"):
            shutil.rmtree(home / stale, ignore_errors=True)
        (home / "src").mkdir()
        archive = subprocess.run(
            ["git", "archive", release.commit], cwd=REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        pip = [str(home / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        done = subprocess.run(
            [*pip, str(home / "src")], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise ReleaseError(
                f"installing {release.version} ({release.commit[:12]}): {done.stderr[-2000:]}"
            )
        (home / "installed").touch()
    return release.bcw
