#!/usr/bin/env python
"""Export a trained run as a submission: `python -m open_r1.submission.export --help` (the same command)."""

from open_r1.submission.export import cli

cli()
