"""The worker image: no Docker engine runs here, so the Dockerfile is checked for what an
SRE looks for, and the install its build stage performs is done for real in a fresh
virtual environment (a wheel built from this checkout, with its migrations)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_dockerfile_is_multi_stage_slim_non_root_with_bcw_as_entrypoint() -> None:
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?", DOCKERFILE, flags=re.M)
    assert len(stages) == 2 and all(image.startswith("python:3.11-slim") for image, _ in stages)
    final = DOCKERFILE.split("\nFROM ")[-1]
    assert "COPY --from=build /opt/bcw /opt/bcw" in final
    assert re.search(r"^USER 10001", final, flags=re.M)
    assert 'ENTRYPOINT ["bcw"]' in final
    assert "pip install" not in final and "apt-get" not in final  # no build tools at runtime
    assert "--create-home --home-dir /home/bcw" in final and "HOME=/home/bcw" in final
    assert 'org.opencontainers.image.version="${VERSION}"' in final


def test_make_image_tags_the_image_with_the_version() -> None:
    from tests.upgrade.release import current_version

    planned = subprocess.run(
        ["make", "-n", "image", "ENGINE=docker"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    version = current_version()
    assert f"docker build --build-arg VERSION={version} -t bc-workers:{version} ." in planned
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


@pytest.mark.slow
def test_the_image_install_succeeds_in_a_fresh_venv(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("schemas", "workers", "migrations"):  # what the Dockerfile copies
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    # as the build stage installs it: the product and its gRPC exporter extra
    installs = re.search(r'pip install "\.\[(\w+)\]"', DOCKERFILE)
    assert installs is not None
    subprocess.run([*pip, f"{source}[{installs.group(1)}]"], check=True, timeout=600)
    help_text = subprocess.run(
        [str(venv / "bin" / "bcw"), "--help"], check=True, capture_output=True, text=True
    ).stdout
    for command in ("migrate", "provision", "run", "dead-letters", "events"):
        assert command in help_text
    packaged = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from workers.runtime.store.migrate import default_directory as d; print(d(), len(list(d().glob('*.sql'))))"],
        check=True, capture_output=True, text=True, cwd=tmp_path,  # not this checkout's packages
    ).stdout.split()  # fmt: skip
    assert "site-packages" in packaged[0] and int(packaged[1]) == len(
        list((ROOT / "migrations" / "core").glob("*.sql"))
    )
