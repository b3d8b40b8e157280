"""One family of errors for every entry point, each message naming the problem and the fix: every entry point
catches `OpenR1Error` and prints `error: <message>` with exit status 2, never a traceback. The subclasses stay
`ValueError`/`RuntimeError`s so callers that catch the builtin kinds keep working.
"""

import argparse
import dataclasses
import logging
import os
import sys


class OpenR1Error(Exception):
    """Base class: a user-facing problem whose message says what is wrong and what to do."""


class RecipeError(OpenR1Error, ValueError):
    """A recipe setting that cannot work; the message names the setting and the fix."""


class BudgetError(RecipeError):
    """A time_budget value that cannot be parsed."""


class RewardConfigError(RecipeError):
    """A reward list or reward params that cannot be built (bad param name or value, duplicates, stray kwargs)."""


class UnknownRewardError(RewardConfigError):
    """A reward name that is not registered."""


class TrainerOptionError(RecipeError):
    """A trainer speed/recipe lever that cannot be used in this setup."""


class DataError(OpenR1Error, ValueError):
    """A data set that cannot be used (missing dir, wrong columns, unreadable image, bad gold answer)."""


class ModelError(OpenR1Error, ValueError):
    """A model directory that cannot be used; the message names the problem and the fix."""


class ExportError(OpenR1Error, RuntimeError):
    """An export that cannot be completed; the previous submission is left in place."""


class PromoteError(OpenR1Error, RuntimeError):
    """A promotion that cannot be done (bad report, unverifiable candidate)."""


class SceneArgumentError(OpenR1Error, ValueError):
    """A bad argument to the scene generator's API or command line."""


class SceneGenerationError(OpenR1Error, RuntimeError):
    """No acceptable scene could be sampled (e.g. objects cannot all stay visible at a tiny image size)."""


class DiskFullError(OpenR1Error, OSError):
    """A write that found its disk full (a run resumes from its newest complete checkpoint)."""


def help_field(default, text: str, **kwargs):
    """A settings dataclass field with its help (the recipe parsers' --help and ``--help-recipe`` list it); a list or
    dict default is copied for each instance."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": text}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": text}, **kwargs)


def error_exit(exc: BaseException) -> int:
    """What an entry point does with a user-facing error: one `error: <message>` line on stderr, exit status 2."""
    print(f"error: {exc}", file=sys.stderr)
    return 2


class _Stderr(logging.Handler):
    """Writes to sys.stderr as it is at each record (a redirect or a test's capture made after the setup)."""

    def emit(self, record):
        print(self.format(record), file=sys.stderr, flush=True)


def setup_logging() -> None:
    """Every entry point's first call (library code only calls `logging.getLogger(__name__)`): `[HH:MM:SS] message`
    records on stderr, the project's own at INFO and third-party ones at WARNING; on a distributed rank other than 0
    only warnings, so N processes do not print N copies."""
    logging.basicConfig(handlers=[_Stderr()], format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S", force=True)
    rank0 = all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK"))
    for name in ("open_r1", "standin", "experiments", "__main__"):
        logging.getLogger(name).setLevel(logging.INFO if rank0 else logging.WARNING)


# a full disk as the writers word it: Python's OSError (ENOSPC, EDQUOT), safetensors' writer, torch.save's zip writer
DISK_FULL = ("No space left on device", "Disk quota exceeded", "PytorchStreamWriter failed writing", "unexpected pos")


def user_error(exc: BaseException) -> OpenR1Error | None:
    """The project's own error behind `exc`, or None: one from a worker process arrives chained as the cause
    (`datasets`) or re-raised with the worker's traceback as its message (torch's DataLoader). A full disk is one too
    (`DISK_FULL`; torch.save's writer names no cause, hence "most likely")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OpenR1Error):
            text, head = str(exc), f"{type(exc).__name__}: "
            if "Traceback (most recent call last)" in text and head in text:  # the DataLoader's re-raise
                return type(exc)(text[text.rindex(head) + len(head) :].strip())
            return exc
        line = next((text for text in str(exc).splitlines() if any(sign in text for sign in DISK_FULL)), None)
        if line and "/torch_" not in line and "/dev/shm" not in line:  # a full shared memory is not the output disk
            return DiskFullError(
                f"writing failed, most likely on a full disk ({line.strip()[:300]}): free space or "
                "write to a larger disk (OUTPUT_DIR / SUBMISSION / --out), then re-run the same "
                "command (a training run resumes from its newest complete checkpoint)"
            )
        exc = exc.__cause__ or exc.__context__
    return None


class CliHelp(argparse.RawDescriptionHelpFormatter):
    """The --help of every entry point: descriptions as written, each option's default shown unless None or False
    (argparse's own hook, as ArgumentDefaultsHelpFormatter uses it)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text or not text:
            return action.help
        return f"{text} (default: %(default)s)"


def cli_parser(prog: str, description: str | None, parser_class=argparse.ArgumentParser, **kwargs):
    """The parser of every console script: named as the script (also under python -m), CliHelp's help, and no
    prefix abbreviations (`--min-vote` is an error, not a silent `--min-votes`)."""
    return parser_class(prog=prog, description=description, formatter_class=CliHelp, allow_abbrev=False, **kwargs)
