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
