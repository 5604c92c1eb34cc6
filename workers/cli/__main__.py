"""`python -m workers.cli …` is `bcw …` (the tests and benchmarks start workers this way)."""

import sys

from workers.cli.entry import main

sys.exit(main())
