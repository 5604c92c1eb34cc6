"""What `bcw` prints, as a user reads it: a command whose output is piped into one that
stops reading (`bcw config | head -1`) ends quietly, exit 141 (as a program SIGPIPE
ends); each subcommand's help page is its own; durations are said in the unit given.

What is real: the `bcw` command in a subprocess; the pipe is closed before it writes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.support import bcw


def _into_closed_pipe(*args: str) -> tuple[int, str]:
    """`bcw args` with its stdout a pipe nobody reads any more; (exit code, stderr)."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args], stdout=write, stderr=subprocess.PIPE
    )
    os.close(write)
    os.close(read)  # before the command writes a line: its first write meets a closed pipe
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("args", [("config",), ("config", "--json")])
def test_a_closed_pipe_ends_the_command_quietly_exit_141(args: tuple[str, ...]) -> None:
    code, err = _into_closed_pipe(*args)
    assert (code, err) == (141, "")


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("dead-letters", "list", "--help")])
def test_a_help_page_into_a_closed_pipe_says_nothing_more(args: tuple[str, ...]) -> None:
    # argparse drops a help page it cannot write and exits 0; what it buffered is 141
    code, err = _into_closed_pipe(*args)
    assert code in (0, 141) and err == ""


async def test_each_dead_letters_action_has_its_own_help() -> None:
    code, listed = await bcw("dead-letters", "list", "--help")
    assert code == 0
    assert listed.startswith("usage: bcw dead-letters list")
    assert "--json" in listed and "--dry-run" not in listed and "--yes" not in listed
    code, redrive = await bcw("dead-letters", "redrive", "--help")
    assert code == 0
    assert redrive.startswith("usage: bcw dead-letters redrive")
    assert "--dry-run" in redrive and "--json" not in redrive
    code, out = await bcw("dead-letters", "redrive", "--json")  # list's option: refused
    assert code == 2 and "unrecognized arguments: --json" in out


async def test_bcw_config_says_each_duration_as_it_was_written() -> None:
    import json

    given = {
        "BCW_LIVENESS_HEARTBEAT_INTERVAL": "90s",
        "BCW_CONSUMER_ACK_WAIT": "1.5m",
        "BCW_DATABASE_LOCK_TIMEOUT": "2500ms",
        "BCW_REPLAY_DISPATCH_INTERVAL": "3",
    }
    code, out = await bcw("config", **given)
    assert code == 0, out
    shown = dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)
    assert shown["BCW_LIVENESS_HEARTBEAT_INTERVAL"] == "90s"  # not 90.0
    assert shown["BCW_CONSUMER_ACK_WAIT"] == "1.5m"
    assert shown["BCW_DATABASE_LOCK_TIMEOUT"] == "2500ms"
    assert shown["BCW_REPLAY_DISPATCH_INTERVAL"] == "3"
    assert shown["BCW_QUARANTINE_HOLD_MAX"] == "5m"  # a default: its largest whole unit
    code, out = await bcw("config", "--json", **given)  # a script's: seconds, numbers
    values = json.loads(out)
    assert (values["BCW_LIVENESS_HEARTBEAT_INTERVAL"], values["BCW_CONSUMER_ACK_WAIT"]) == (90, 90)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"BCW_CONSUMER_ACK_WAIT": "0"},
            "bcw: BCW_CONSUMER_ACK_WAIT: must be more than 0s (got '0')",
        ),
        (
            {"BCW_CONSUMER_ACK_WAIT": "-500ms"},
            "bcw: BCW_CONSUMER_ACK_WAIT: must be more than 0s (got '-500ms')",
        ),
        (
            {"BCW_NATS_FACTS_MAX_AGE": "1m"},
            "bcw: BCW_NATS_FACTS_MAX_AGE: must be at least 2m (got '1m')",
        ),
        (
            {"BCW_CONSUMER_NAK_DELAY": "-5"},
            "bcw: BCW_CONSUMER_NAK_DELAY: must be at least 0s (got '-5')",
        ),
        (
            {"BCW_LIVENESS_HEARTBEAT_INTERVAL": "-10s"},
            "bcw: BCW_LIVENESS_HEARTBEAT_INTERVAL: must be a positive duration (45s, 5m, 2h, 7d) (got '-10s')",
        ),
        (
            {"BCW_DATABASE_COMMAND_TIMEOUT": "90s"},
            "bcw: BCW_DATABASE_COMMAND_TIMEOUT (90s) must be below BCW_CONSUMER_ACK_WAIT (1m): a slow "
            "statement would outlive the fact's delivery",
        ),
    ],
)
async def test_a_bad_duration_is_refused_in_units_as_written(
    env: dict[str, str], line: str
) -> None:
    code, out = await bcw("config", **env)
    assert (code, out.strip()) == (2, line)
