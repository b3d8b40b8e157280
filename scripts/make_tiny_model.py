#!/usr/bin/env python
"""Build a tiny random VLM for tests and demos: `python -m open_r1.tiny_models --help` (the same command)."""

from open_r1.tiny_models import main

raise SystemExit(main())
