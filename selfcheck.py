#!/usr/bin/env python
"""Self-check a model dir on the grader's protocol: `open-r1-selfcheck --help` (this file is the same command)."""

from open_r1.tasks.counting.selfcheck import *  # noqa: F403  (its functions, for callers that `import selfcheck`)
from open_r1.tasks.counting.selfcheck import cli

if __name__ == "__main__":
    cli()
