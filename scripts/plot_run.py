#!/usr/bin/env python
"""Table and plot of a run's evaluated checkpoints: `python -m open_r1.run.keep_best --help` (the same command)."""

from open_r1.run.keep_best import main

raise SystemExit(main())
