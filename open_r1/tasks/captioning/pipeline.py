"""The humor-r1 chain in one process: trace synthesis -> SFT + merge -> RM (+ blind RM) -> GRPO x seeds -> best-of-N
evaluation, on prepared data (``open-r1-caption-prepare``), with one results folder.

    open-r1-caption --config configs/captioning/real_qwen3vl2b.yaml --out $OUT
    python -m standin.captioning.demo --config configs/captioning/standin_demo.yaml     # make humor-demo

A stage is a module (``stage_<name>.py``: its section's ``Config`` or ``parse``, ``inputs``, ``outputs``, ``run``,
optionally ``check``, ``jobs``, ``finish``/``merge``, ``markdown``); `main` takes the ordered stages, so the stand-in
(``standin/captioning/demo.py``) runs its own stages (data, pre-training, ratings) around these. The recipe is parsed
once, every section before any stage runs, and every stage's inputs are checked (on disk, or written by a stage that
runs before it). ``--stages`` runs a subset. ``parallel: true`` in a section runs its ``jobs`` as processes at once
(small models leave a GPU mostly idle); ``start_early: {rm: synthesize}`` starts them when an earlier stage begins.
Results: ``<work_dir>/results/pipeline.json`` and ``results.md``; ``--out DIR`` copies the small result files there.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import time

from open_r1.errors import OpenR1Error, RecipeError
from open_r1.jsonio import read_json, write_json
from open_r1.tasks.captioning import config, stage_eval, stage_grpo, stage_rm, stage_sft, stage_synthesize

STAGES = (stage_synthesize, stage_sft, stage_rm, stage_grpo, stage_eval)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def outputs(recipe, stage) -> list[str]:
    return stage.outputs(recipe) if hasattr(stage, "outputs") else []


def preflight(recipe, stages, run: list[str]) -> None:
    """Before any stage runs (the sections are parsed already): each run stage's own checks, and its inputs on
    disk or written by a stage that runs before it, so a chain whose work_dir is gone fails at once naming the
    stage to run, not minutes in."""
    makers = {path: stage.NAME for stage in stages for path in outputs(recipe, stage)}
    produced: list[str] = []
    for stage in stages:
        if stage.NAME in run:
            if hasattr(stage, "check"):
                stage.check(recipe)
            config.check_inputs(stage.inputs(recipe), produced, makers)
            produced += outputs(recipe, stage)


def early_starts(recipe, stages, run: list[str]) -> dict[str, str]:
    """``start_early: {rm: synthesize}``: {the run stage at whose start: the parallel stage that starts then}. The
    early stage must read nothing that a stage between them writes."""
    order = [stage.NAME for stage in stages]
    by_name = {stage.NAME: stage for stage in stages}
    out = {}
    for name, at in (recipe.run.start_early or {}).items():
        if name not in order or at not in order or order.index(at) >= order.index(name):
            raise RecipeError(f"start_early: {name}: {at} must be a stage before it (order: {' '.join(order)})")
        if not (hasattr(by_name[name], "jobs") and by_name[name].jobs(recipe)):
            raise RecipeError(f"start_early: {name} needs {name}.parallel: true (its jobs run as processes)")
        between = {p: s for s in order[order.index(at):order.index(name)] for p in outputs(recipe, by_name[s])}
        for item in by_name[name].inputs(recipe).values():
            if item.path in between:
                raise RecipeError(f"start_early: {name} reads {item.path}, which the {between[item.path]} stage writes "
                                  f"after {at} begins; drop start_early.{name} or start it later")
        if name in run:  # the stage it waits for may not run: start at the first run stage after `at`
            later = [s for s in run if order.index(at) <= order.index(s) < order.index(name)]
            if later:
                out[later[0]] = name
    return out


def child_env(base: dict, sharing: int, cpus: int | None = None) -> dict:
    """A sub-job's environment: an equal share of the CPU threads among `sharing` processes (each would otherwise
    start one OpenMP thread per core), unless the user set them; ``PYTHONFAULTHANDLER=1`` (stacks on a fatal signal)."""
    env = dict(base)
    threads = str(max(1, (cpus or os.cpu_count() or 1) // max(1, sharing)))
    for key in THREAD_VARIABLES:
        env.setdefault(key, threads)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def launch_parallel(recipe, entry: str, name: str, jobs: list[list[str]], sharing: int | None = None) -> list[tuple]:
    """Start a stage's sub-jobs (``python -m <entry> --stages <name> --job-result F --set ...``; logs under
    ``<work_dir>/logs``); `collect_parallel` waits for them."""
    logs = os.path.join(recipe.paths.root, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = []
    for i, sets in enumerate(jobs):
        result, log_path = os.path.join(logs, f"{name}_{i}.json"), os.path.join(logs, f"{name}_{i}.log")
        command = [sys.executable, "-m", entry, "--config", recipe.path, "--stages", name, "--job-result", result]
        for item in [*recipe.overrides, *sets]:
            command += ["--set", item]
        handle = open(log_path, "w")  # noqa: SIM115 - closed after the process ends, in collect_parallel
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                env=child_env(os.environ, sharing or len(jobs)))
        procs.append((proc, handle, result, log_path, sets))
        config.log(f"[pipeline] {name} job {i} ({' '.join(sets)}): log {log_path}")
    return procs


def collect_parallel(stage, recipe, procs: list[tuple]) -> dict:
    parts, failed = [], []
    for proc, handle, result, log_path, sets in procs:
        code = proc.wait()
        handle.close()
        with open(log_path) as f:
            ours = [line.rstrip() for line in f if line.startswith("[") or "error" in line.lower()]
        print("\n".join(ours[-25:]), flush=True)
        if code != 0 or not os.path.isfile(result):
            failed.append(f"{' '.join(sets)} (exit {code}, log {log_path})")
        else:
            parts.append(read_json(result))
    if failed:
        raise OpenR1Error(f"stage {stage.NAME}: sub-job(s) failed: {'; '.join(failed)}")
    merged = stage.merge(parts) if hasattr(stage, "merge") else {k: v for part in parts for k, v in part.items()}
    return stage.finish(recipe, merged) if hasattr(stage, "finish") else merged


_THREADS_AT_START: list[int] = []


def _share_threads(sharing: int) -> None:
    """This process's torch CPU threads while `sharing - 1` early jobs run beside it (1: back to the start value)."""
    import torch  # deferred: heavy

    if not _THREADS_AT_START:
        _THREADS_AT_START.append(torch.get_num_threads())
    torch.set_num_threads(max(1, _THREADS_AT_START[0] // max(1, sharing)))


def run_pipeline(recipe, stages=STAGES, run: list[str] | None = None, out: str | None = None,
                 entry: str = "open_r1.tasks.captioning.pipeline") -> dict:
    """Run the `run` stages (default: all) of `stages` in order; `entry`: the module a parallel sub-job runs."""
    run = [stage.NAME for stage in stages] if run is None else list(run)
    starts_at = early_starts(recipe, stages, run)
    preflight(recipe, stages, run)  # before anything is written into the work_dir
    paths = recipe.paths
    summary_path = os.path.join(paths.results, "pipeline.json")
    summary = read_json(summary_path, default=None) or {"stages": {}}
    summary.update(recipe=recipe.path, device=_device_name())
    started = time.time()
    by_name = {stage.NAME: stage for stage in stages}
    running: dict[str, tuple[float, list]] = {}  # stage -> (start time, its processes), started early
    try:
        for name in run:
            stage = by_name[name]
            if name in starts_at:
                early = starts_at[name]
                config.log(f"[pipeline] stage {early} starts early, beside {name}")
                jobs = by_name[early].jobs(recipe)
                # this process keeps running stages meanwhile: it takes one share of the cores too
                running[early] = (time.time(), launch_parallel(recipe, entry, early, jobs, sharing=len(jobs) + 1))
                _share_threads(len(jobs) + 1)
            t0 = time.time()
            config.log(f"[pipeline] stage {name} (elapsed {t0 - started:.0f} s)")
            jobs = stage.jobs(recipe) if hasattr(stage, "jobs") else None
            if name in running:
                t0, procs = running.pop(name)
                result = collect_parallel(stage, recipe, procs)
                if not running:
                    _share_threads(1)
            elif jobs:
                result = collect_parallel(stage, recipe, launch_parallel(recipe, entry, name, jobs))
            else:
                result = stage.run(recipe)
            summary["stages"][name] = {"seconds": time.time() - t0, "result": result}
            write_json(summary_path, summary)
            if out:  # after every stage: a run cut short still returns what it measured
                write_results(summary, stages, paths, out)
    finally:
        if running:
            _share_threads(1)
        for _, procs in running.values():  # a failed stage: do not leave early jobs running
            for proc, handle, *_ in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                handle.close()
    summary["total_seconds"] = time.time() - started
    write_json(summary_path, summary)
    config.log(f"[pipeline] done in {summary['total_seconds']:.0f} s\n{write_results(summary, stages, paths, out)}")
    return summary


def _device_name() -> str:
    import torch  # deferred: heavy

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def results_markdown(summary: dict, stages=STAGES) -> str:
    blocks = summary.get("stages", {})
    seconds = sum(block.get("seconds", 0.0) for block in blocks.values())
    lines = [f"# humor-r1 pipeline results ({summary.get('device')})", "",
             f"recipe: `{summary.get('recipe')}`; stages {seconds:.0f} s in all (the last invocation "
             f"{summary.get('total_seconds', 0):.0f} s)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {block['seconds']:.1f} |" for name, block in blocks.items()]
    for stage in stages:
        result = (blocks.get(stage.NAME) or {}).get("result")
        if result and hasattr(stage, "markdown"):
            lines += stage.markdown(result)
    return "\n".join(lines) + "\n"


def write_results(summary: dict, stages, paths: config.Paths, out: str | None) -> str:
    """``results.md``, and with `out` the small result files copied there (flat, at most 7)."""
    markdown = results_markdown(summary, stages)
    os.makedirs(paths.results, exist_ok=True)
    with open(os.path.join(paths.results, "results.md"), "w") as handle:
        handle.write(markdown)
    if out:
        os.makedirs(out, exist_ok=True)
        splits = sorted(d for d in os.listdir(paths.results) if d.startswith("eval_"))
        files = [os.path.join(paths.results, f) for f in ("pipeline.json", "results.md")]
        files += [os.path.join(paths.results, s, "bon_eval.json") for s in splits]
        files += [os.path.join(paths.results, s, "bon_curve.png") for s in splits[:2]]
        for path in [f for f in files if os.path.isfile(f)][:7]:
            parent = os.path.basename(os.path.dirname(path))
            shutil.copy(path, os.path.join(out, os.path.basename(path) if parent == "results"
                                           else f"{parent}_{os.path.basename(path)}"))
    return markdown


def recipe_help(stages) -> str:
    """Every recipe key: the top level's, then each section's, with its default and help (the dataclass fields)."""
    lines = []
    for where, cls in (("", config.RunConfig), ("models.", config.Models),
                       *((f"{s.NAME}.", getattr(s, "Config", getattr(s, "Settings", None))) for s in stages)):
        for field in dataclasses.fields(cls):
            if field.init:
                default = field.default_factory() if callable(field.default_factory) else field.default
                lines.append(f"{where}{field.name} (default: {default!r}): {field.metadata.get('help', '')}")
    return "\n".join(lines) + "\ngrpo.*: any open_r1.grpo recipe key (python -m open_r1.grpo --help-all)"


def main(argv=None, stages=STAGES, entry: str = "open_r1.tasks.captioning.pipeline", oracle=None) -> int:
    """The CLI over `stages`; `entry` is this CLI's module (its parallel sub-jobs run it), `oracle` the eval's hidden
    rule where the data has one (the stand-in's)."""
    names = [stage.NAME for stage in stages]
    class Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass  # the defaults shown, the description as written

    parser = argparse.ArgumentParser(prog=f"python -m {entry}", description=__doc__, formatter_class=Help)
    parser.add_argument("--config", help="the recipe (configs/captioning/*.yaml); required but for --help-recipe")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a recipe key (repeatable), e.g. --set rm.max_seconds=60")
    parser.add_argument("--stages", nargs="+", default=None, choices=names, help="a subset, in order (none given: all)")
    parser.add_argument("--help-recipe", action="store_true", help="list every recipe key with its default and help")
    parser.add_argument("--out", default=None, help="copy the small result files here")
    parser.add_argument("--job-result", default=None, help=argparse.SUPPRESS)  # a parallel sub-job's summary file
    args = parser.parse_args(argv)
    if args.help_recipe:
        print(recipe_help(stages))
        return 0
    if not args.config:
        parser.error("the following arguments are required: --config")
    try:
        recipe = config.parse_recipe(args.config, args.set, stages)
        recipe.oracle = oracle
        if args.job_result:  # one sub-job of a parallel stage, in this process
            (stage,) = [s for s in stages if s.NAME == args.stages[0]]
            preflight(recipe, stages, [stage.NAME])
            write_json(args.job_result, stage.run(recipe))
        else:
            run_pipeline(recipe, stages, args.stages, args.out, entry)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
