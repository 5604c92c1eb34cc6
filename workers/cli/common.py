"""What every command group of `bcw` shares: the documented exit codes and the type of the
subcommand table the groups add their commands to."""

from __future__ import annotations

import argparse
from typing import TypeAlias

EXIT_FAILED = 1
EXIT_BAD_SETTINGS = 2
EXIT_REFUSED = 3

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
