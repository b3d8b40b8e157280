#!/usr/bin/env python
"""Promote a candidate only when it scores higher: `python -m open_r1.promote --help` (the same command)."""

from open_r1.promote import cli

cli()
