"""Errors raised by the scene generator.

``SceneArgumentError`` means the caller asked for something impossible or ambiguous (the message says how to fix
it); the command line prints it as a single ``error: ...`` line and exits with status 2 without writing anything.
"""
from __future__ import annotations


class SceneArgumentError(ValueError):
    """A bad argument to the scene generator's API or command line."""


class SceneGenerationError(RuntimeError):
    """No acceptable scene could be sampled (e.g. objects cannot all stay visible at a tiny image size)."""
