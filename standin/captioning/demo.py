"""The captioning chain on the stand-in: the real stages (``open_r1.tasks.captioning.pipeline``) with the stand-in's
own around them: generated data -> from-scratch bases (or the shipped start policy, ``pretrain.policy.start``) ->
trace synthesis -> templated traces -> SFT -> (a round of simulated ratings, where the recipe has a ``ratings``
section) -> RM -> GRPO -> best-of-N eval, the hidden rule scoring the RM's held-out labels (``stage_rm``) and the
eval's captions (``stage_eval``).

    python -m standin.captioning.demo --config configs/captioning/standin_demo.yaml     # make humor-demo
"""

import argparse
import functools

from open_r1.errors import RecipeError
from open_r1.jsonio import read_recipe
from open_r1.tasks.captioning import config, pipeline, stage_sft, stage_synthesize
from standin.captioning import (
    parallel,
    stage_data,
    stage_eval,
    stage_grpo,
    stage_pretrain,
    stage_ratings,
    stage_rm,
    stage_traces,
)

STAGES = (
    stage_data,
    stage_pretrain,
    stage_synthesize,
    stage_traces,
    stage_sft,
    stage_ratings,
    stage_rm,
    stage_grpo,
    stage_eval,
)


def stages_of(path: str, overrides: list[str] = ()) -> tuple:
    """`STAGES`, without the ratings round (it is optional) when the recipe at `path` has no ``ratings`` section and no
    override names one."""
    try:
        has_ratings = "ratings" in read_recipe(path)
    except RecipeError:
        has_ratings = True  # the pipeline's own parse reports the problem
    wanted = has_ratings or any(item.startswith("ratings.") for item in overrides)
    return tuple(s for s in STAGES if s is not stage_ratings or wanted)


def load_recipe(path: str, overrides: list[str] | None = None):
    """The parsed recipe of the demo's stages (for the experiments/captioning harnesses)."""
    return config.parse_recipe(path, overrides, stages_of(path, overrides or []), parallel.RunConfig)


def main(argv=None) -> int:
    # --job-result FILE: this process is one sub-job of a parallel stage (parallel.launch_parallel starts it)
    job = argparse.ArgumentParser("python -m standin.captioning.demo", add_help=False, allow_abbrev=False)
    job.add_argument("--job-result")
    job, argv = job.parse_known_args(argv)
    path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else ""
    return pipeline.main(
        argv,
        stages_of(path, argv),  # argv: its --set items are the overrides
        prog="python -m standin.captioning.demo",
        run=functools.partial(parallel.run_pipeline, job_result=job.job_result),
        run_config=parallel.RunConfig,
    )


if __name__ == "__main__":
    raise SystemExit(main())
