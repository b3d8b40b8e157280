"""Errors raised by the scene generator.

``SceneArgumentError`` means the caller asked for something impossible or ambiguous (the message says how to fix
it); the command line prints it as a single ``error: ...`` line and exits with status 2 without writing anything.
"""
from __future__ import annotations

from open_r1.errors import SceneArgumentError, SceneGenerationError  # noqa: F401  (re-exported)


