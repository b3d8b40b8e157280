"""The eval stage as the stand-in runs it: the real one (``open_r1.tasks.captioning.stage_eval``) with the hidden
rule (``oracle_eval``) scoring the captions of every policy, and its tables in the results."""

from open_r1.tasks.captioning import stage_eval
from open_r1.tasks.captioning.stage_eval import NAME, TAKES, Config, check, inputs, markdown  # noqa: F401
from standin.captioning import oracle_eval


def run(*args) -> dict:
    return stage_eval.run(*args, measure=oracle_eval)
