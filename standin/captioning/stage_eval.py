"""The eval stage as the stand-in runs it: the real one (``open_r1.tasks.captioning.stage_eval``) with the hidden
rule (``oracle_eval``) scoring the captions of every policy, and its tables in the results."""

import functools

from open_r1.tasks.captioning import stage_eval
from open_r1.tasks.captioning.stage_eval import NAME, TAKES, Config, check, inputs, markdown  # noqa: F401
from standin.captioning import oracle_eval

run = functools.partial(stage_eval.run, measure=oracle_eval)
