#!/usr/bin/env python
"""Promote a candidate only when it scores higher: `python -m open_r1.submission.promote --help` (the same command)."""

from open_r1.submission.promote import cli

cli()
