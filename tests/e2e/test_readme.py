"""The README's commands, run as a user would paste them: every line of its `sh` blocks,
in order, in one bash session at the checkout's root — but the few that cannot run here,
each named below with why (and each still a line of the README)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NOT_HERE = {
    "make image && docker push …": "a container engine and a registry (the image's install "
    "is checked by tests/chart/test_image.py)",
    "helm install fleet charts/bc-workers -f my-values.yaml": "a cluster (the chart renders "
    "and validates in tests/chart/)",
    "bcw events --type 'node.*'": "a deployed system, followed until Ctrl-C (bcw events "
    "runs below, against the demo)",
    "make test": "the run this test is part of",
}


def readme_commands(text: str) -> list[str]:
    """The command lines of the `sh` blocks, in order, without their comments."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def test_the_parser_keeps_commands_and_drops_comments() -> None:
    text = "```sh\nmake demo   # a comment\n            # its second line\nkill %1\n```\n"
    assert readme_commands(text) == ["make demo", "kill %1"]


@pytest.mark.slow
@pytest.mark.foreground
@pytest.mark.timeout(600)
def test_the_readme_commands_run_in_order() -> None:
    commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {c for c in commands if c in NOT_HERE} == set(NOT_HERE)  # no stale excuse
    runnable = [c for c in commands if c not in NOT_HERE]
    assert runnable[0] == "make demo"
    script = "\n".join(
        [
            "set -euo pipefail",
            "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",  # a failed step leaves no demo
            *[f"echo '$ {c}'\n{c}" for c in runnable],
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BCW_")}
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = shell.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        out, _ = shell.communicate()
        pytest.fail(f"the README's commands did not finish:\n{out[-4000:]}")
    assert shell.returncode == 0, out[-4000:]
    assert out.count("all checks hold") == 2, out[-4000:]  # make demo, then the kept one
    status = out.split("$ .venv/bin/bcw liveness status")[1]
    assert re.search(r"^node-gw-0\s+\d+", status, flags=re.M), status[:2000]
    events = out.split("$ .venv/bin/bcw events --all --count 5")[1].split("\n$ ")[0]
    assert len([line for line in events.splitlines() if line.strip()]) >= 5, events
    explained = out.split("$ .venv/bin/bcw explain node-1")[1]
    assert "node-1" in explained and "connected" in explained, explained[:2000]
    assert not (ROOT / ".bcw" / "demo" / "env").exists()  # the demo stopped and cleaned up


def test_the_diagram_names_the_real_processes_and_streams() -> None:
    from schemas.subjects import Subjects
    from workers.registry import WORKERS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    [diagram] = re.findall(r"^```mermaid\n(.*?)^```", text, flags=re.M | re.S)
    subjects = Subjects("bc")
    streams = {
        subjects.facts_stream,
        subjects.events_stream,
        subjects.gateway_stream,
        f"{subjects.dead_stream}_&lt;worker&gt;",  # each publisher's own
    }
    assert set(re.findall(r'\[\["([A-Za-z_&;]+)"\]\]', diagram)) == streams
    drawn = set(re.findall(r"\b[a-z]+\b", diagram))
    assert set(WORKERS) <= drawn
    assert "outbox relay" in diagram and "gateways" in diagram
    assert f"{subjects.root}.facts.&lt;gateway&gt;.&lt;type&gt;" in diagram
