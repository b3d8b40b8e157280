"""The stand-in's parallel sub-jobs: ``parallel: true`` in a section runs its ``jobs`` as processes at once (small
models leave a GPU mostly idle); ``start_early: {rm: synthesize}`` starts them when an earlier stage begins. A runner
for ``open_r1.tasks.captioning.pipeline.run_pipeline`` (the real chain runs its stages one by one)."""

import dataclasses
import logging
import os
import subprocess
import sys
import time

from open_r1.errors import OpenR1Error, RecipeError
from open_r1.jsonio import read_json, write_json
from open_r1.tasks.captioning import config, pipeline
from open_r1.tasks.captioning.config import help_field

logger = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
ENTRY = "standin.captioning.demo"


@dataclasses.dataclass
class RunConfig(config.RunConfig):
    """The real recipe's top-level keys and the stand-in's ``start_early``."""

    start_early: dict | None = help_field(
        None, "{stage: earlier stage}: start a parallel stage's jobs when the earlier one begins, e.g. {rm: synthesize}"
    )


def jobs(stage, recipe) -> list[list[str]] | None:
    """A stage's sub-jobs (its ``jobs``: each a list of ``--set`` overrides), None when it runs in this process."""
    return stage.jobs(*recipe.args(stage)) if hasattr(stage, "jobs") else None


def early_starts(recipe, stages, run: list[str]) -> dict[str, str]:
    """``start_early: {rm: synthesize}``: {the run stage at whose start: the parallel stage that starts then}. The
    early stage must read nothing that a stage between them writes."""
    by_name = {stage.NAME: stage for stage in stages}
    order = list(by_name)
    out = {}
    for name, at in (recipe.run.start_early or {}).items():
        if name not in order or at not in order or order.index(at) >= order.index(name):
            raise RecipeError(f"start_early: {name}: {at} must be a stage before it (order: {' '.join(order)})")
        if not jobs(by_name[name], recipe):
            raise RecipeError(f"start_early: {name} needs {name}.parallel: true (its jobs run as processes)")
        between = {
            p: s for s in order[order.index(at) : order.index(name)] for p in pipeline.outputs(recipe, by_name[s])
        }
        for item in by_name[name].inputs(*recipe.args(by_name[name])).values():
            if item.path in between:
                raise RecipeError(
                    f"start_early: {name} reads {item.path}, which the {between[item.path]} stage writes "
                    f"after {at} begins; drop start_early.{name} or start it later"
                )
        if name in run:  # the stage it waits for may not run: start at the first run stage after `at`
            later = [s for s in run if order.index(at) <= order.index(s) < order.index(name)]
            if later:
                out[later[0]] = name
    return out


def child_env(base: dict, sharing: int, cpus: int | None = None) -> dict:
    """A sub-job's environment: an equal share of the CPU threads among `sharing` processes (each would otherwise
    start one OpenMP thread per core), unless the user set them; ``PYTHONFAULTHANDLER=1`` (stacks on a fatal signal)."""
    threads = str(max(1, (cpus or os.cpu_count() or 1) // max(1, sharing)))
    return {**dict.fromkeys(THREAD_VARIABLES, threads), "PYTHONFAULTHANDLER": "1", **base}


def launch_parallel(recipe, name: str, jobs: list[list[str]], sharing: int | None = None) -> list[tuple]:
    """Start a stage's sub-jobs (``python -m standin.captioning.demo --stages <name> --job-result F --set ...``;
    logs under ``<work_dir>/logs``); `collect_parallel` waits for them."""
    logs = os.path.join(recipe.paths.root, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = []
    for i, sets in enumerate(jobs):
        result, log_path = os.path.join(logs, f"{name}_{i}.json"), os.path.join(logs, f"{name}_{i}.log")
        command = [sys.executable, "-m", ENTRY, "--config", recipe.path, "--stages", name, "--job-result", result]
        for item in [*recipe.overrides, *sets]:
            command += ["--set", item]
        handle = open(log_path, "w")  # noqa: SIM115 - closed after the process ends, in collect_parallel
        proc = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=child_env(os.environ, sharing or len(jobs))
        )
        procs.append((proc, handle, result, log_path, sets))
        logger.info(f"[pipeline] {name} job {i} ({' '.join(sets)}): log {log_path}")
    return procs


def collect_parallel(stage, recipe, procs: list[tuple]) -> dict:
    parts, failed = [], []
    for proc, handle, result, log_path, sets in procs:
        code = proc.wait()
        handle.close()
        with open(log_path) as f:
            ours = [line.rstrip() for line in f if line.startswith("[") or "error" in line.lower()]
        print("\n".join(ours[-25:]), file=sys.stderr)  # the job's own log lines, already time-stamped
        if code != 0 or not os.path.isfile(result):
            failed.append(f"{' '.join(sets)} (exit {code}, log {log_path})")
        else:
            parts.append(read_json(result))
    if failed:
        raise OpenR1Error(f"stage {stage.NAME}: sub-job(s) failed: {'; '.join(failed)}")
    merged = stage.merge(parts) if hasattr(stage, "merge") else {k: v for part in parts for k, v in part.items()}
    return stage.finish(*recipe.args(stage), merged) if hasattr(stage, "finish") else merged


_THREADS_AT_START: list[int] = []


def _share_threads(sharing: int) -> None:
    """This process's torch CPU threads while `sharing - 1` early jobs run beside it (1: back to the start value)."""
    import torch  # deferred: heavy

    if not _THREADS_AT_START:
        _THREADS_AT_START.append(torch.get_num_threads())
    torch.set_num_threads(max(1, _THREADS_AT_START[0] // max(1, sharing)))


def run_pipeline(
    recipe,
    stages,
    run: list[str] | None = None,
    out: str | None = None,
    job_result: str | None = None,
) -> dict:
    """`pipeline.run_pipeline` with a runner that runs a stage with ``jobs`` as processes (started early where
    ``start_early`` says; early jobs still running when it ends, a failed stage included, are ended); `job_result`:
    this process is one sub-job of a parallel stage (``--job-result``), whose result it writes there."""
    if job_result:
        (stage,) = [s for s in stages if s.NAME == run[0]]
        pipeline.preflight(recipe, stages, [stage.NAME])
        result = stage.run(*recipe.args(stage))
        write_json(job_result, result)
        return result
    by_name = {stage.NAME: stage for stage in stages}
    starts_at = early_starts(recipe, stages, list(by_name) if run is None else list(run))
    running: dict[str, tuple[float, list]] = {}  # stage -> (start time, its processes), started early

    def runner(stage) -> tuple[float, dict]:
        if stage.NAME in starts_at:
            early = starts_at[stage.NAME]
            logger.info(f"[pipeline] stage {early} starts early, beside {stage.NAME}")
            early_jobs = jobs(by_name[early], recipe)
            # this process keeps running stages meanwhile: it takes one share of the cores too
            running[early] = (time.time(), launch_parallel(recipe, early, early_jobs, len(early_jobs) + 1))
            _share_threads(len(early_jobs) + 1)
        t0 = time.time()
        own = jobs(stage, recipe)
        if stage.NAME in running:
            t0, procs = running.pop(stage.NAME)
            result = collect_parallel(stage, recipe, procs)
            if not running:
                _share_threads(1)
        elif own:
            result = collect_parallel(stage, recipe, launch_parallel(recipe, stage.NAME, own))
        else:
            result = stage.run(*recipe.args(stage))
        return t0, result

    try:
        return pipeline.run_pipeline(recipe, stages, run, out, runner=runner)
    finally:
        if running:
            _share_threads(1)
        for _, procs in running.values():
            for proc, handle, *_ in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                handle.close()
