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


def test_dockerfile_is_multi_stage_slim_pinned_non_root_with_bcw_as_entrypoint() -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, flags=re.M)
    assert base is not None  # the base image by digest: a rebuild gets the same bytes
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", base.group(1))
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?", DOCKERFILE, flags=re.M)
    assert [image for image, _ in stages] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
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
        ["make", "-n", "image", "ENGINE=docker"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version = current_version()
    assert f"docker build --build-arg VERSION={version} -t bc-workers:{version} ." in planned
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a venv and a pinned install: minutes on a loaded machine
def test_the_image_install_succeeds_in_a_fresh_venv(tmp_path: Path) -> None:
    """What the build stage does, done here: the files its COPY lines name, installed with
    its own pip command (pinned by constraints.txt); the result has no development tools."""
    source = tmp_path / "src"
    source.mkdir()
    copied = [
        name
        for line in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, flags=re.M)
        for name in line.split()
    ]
    assert {"pyproject.toml", "constraints.txt", "LICENSE", "workers", "migrations"} <= set(copied)
    for name in copied:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    installs = re.search(r'pip install --constraint (\S+) "\.\[(\w+)\]"', DOCKERFILE)
    assert installs is not None  # the product and its gRPC exporter extra, pinned
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--constraint",
            str(source / installs.group(1)),
            f"{source}[{installs.group(2)}]",
        ],
        check=True,
        timeout=600,
        cwd=source,
    )
    pins = _pins(ROOT / "constraints.txt")
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude", "bc-workers"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert _pins_of(frozen.splitlines()).items() <= pins.items()
    help_text = subprocess.run(
        [str(venv / "bin" / "bcw"), "--help"], check=True, capture_output=True, text=True
    ).stdout
    for command in ("migrate", "provision", "run", "dead-letters", "events"):
        assert command in help_text
    packaged = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; from workers.runtime.store.migrate import default_directory as d; "
            "print(d(), len(list(d().glob('*.sql'))), u.find_spec('workers.bench') is None)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not this checkout's packages
    ).stdout.split()
    assert "site-packages" in packaged[0] and int(packaged[1]) == len(
        list((ROOT / "migrations" / "core").glob("*.sql"))
    )
    assert packaged[2] == "True"  # the benchmarks and the fault proxy stay in the checkout
    bench = subprocess.run(
        [str(venv / "bin" / "bcw"), "bench", "runtime"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert bench.returncode == 2 and "development tool" in bench.stderr, bench.stderr
    assert "Traceback" not in bench.stderr
    licensed = list(
        (venv / "lib").glob("python3*/site-packages/bc_workers-*.dist-info/licenses/LICENSE")
    )
    assert licensed and "Apache License" in licensed[0].read_text()


def _pins_of(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def _pins(path: Path) -> dict[str, str]:
    return _pins_of(path.read_text().splitlines())


def test_every_dependency_is_pinned_within_its_range() -> None:
    """constraints.txt pins every requirement of pyproject.toml (extras included) at a
    version its range allows (`make constraints` rewrites it)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    pins = _pins(ROOT / "constraints.txt")
    for text in wanted:
        requirement = Requirement(text)
        if requirement.name == "bc-workers":
            continue
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in constraints.txt (make constraints)"
        assert requirement.specifier.contains(pins[name]), (name, pins[name])
