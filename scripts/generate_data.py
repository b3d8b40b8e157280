#!/usr/bin/env python
"""Render the CLEVR-style / OOD counting splits: `python -m open_r1.tasks.counting.scenes --help` (the same command)."""

from open_r1.tasks.counting.scenes.cli import main

raise SystemExit(main())
