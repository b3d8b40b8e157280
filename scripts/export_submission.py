#!/usr/bin/env python
"""Export a trained run as a submission: `python -m open_r1.export --help` (this file is the same command)."""

from open_r1.export import cli

cli()
