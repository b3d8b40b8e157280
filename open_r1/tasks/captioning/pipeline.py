"""The whole humor-r1 chain in one process: data -> base pre-training -> trace synthesis -> SFT + merge -> (a round of
ratings on the SFT policy's captions, when the recipe has a ``ratings`` section) -> RM (+ blind RM) -> GRPO x seeds ->
best-of-N evaluation, with a wall-clock cap per stage (each stage's ``max_seconds``) and one results folder.

    python -m open_r1.tasks.captioning.pipeline --config configs/captioning/standin_demo.yaml      # make humor-demo
    python -m open_r1.tasks.captioning.pipeline --config configs/captioning/standin_h200.yaml --out $OUT

Each stage is its own module (``stage_<name>.py``, runnable alone with the same recipe; their docstrings state the
algorithm and the deviations from the seed). ``--stages`` runs a subset (the others' outputs must exist). Results:
``<work_dir>/results/pipeline.json`` (every stage's summary and time), ``results.md`` (the RM accuracies with the
blind control, the GRPO-vs-SFT checks per seed and split, the best-of-N tables), the eval's ``bon_eval.*`` per split;
``--out DIR`` copies the small ones there (at most 8 files).
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time

from open_r1.errors import OpenR1Error, RecipeError
from open_r1.tasks.captioning import stage_common as common

ORDER = ("data", "pretrain", "synthesize", "sft", "ratings", "rm", "grpo", "eval")
OPTIONAL = ("ratings",)  # run by default only where the recipe has the stage's section


def default_stages(recipe: dict) -> list[str]:
    return [s for s in ORDER if s not in OPTIONAL or s in recipe]


def parallel_jobs(recipe: dict, name: str) -> list[list[str]] | None:
    """With ``parallel: true`` in the recipe's stage section, the --set overrides of independent sub-jobs that run as
    separate processes at once (small models leave a GPU mostly idle): the two base models, the RM and its blind
    control, the GRPO seeds. None: run the stage in this process."""
    if not common.section(recipe, name).get("parallel"):
        return None
    if name == "pretrain":
        return [[f"pretrain.only={which}"] for which in ("policy", "rm_backbone")]
    if name == "rm":
        from open_r1.tasks.captioning.stage_rm import rm_seeds

        seeds = rm_seeds(recipe)
        jobs = [["rm.only=rm"] + ([f"rm.seed={seed}"] if len(seeds) > 1 else []) for seed in seeds]
        if common.section(recipe, "rm").get("blind", True):
            jobs.append(["rm.only=rm_blind"])
        return jobs
    if name == "grpo":
        from open_r1.tasks.captioning.stage_grpo import grpo_seeds

        return [[f"grpo.seeds=[{seed}]"] for seed in grpo_seeds(recipe)]
    return None


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def child_env(base: dict, sharing: int, cpus: int | None = None) -> dict:
    """The environment of a sub-job that shares the machine's cores with `sharing - 1` other processes: each gets
    an equal share of CPU threads (every process otherwise starts one OpenMP thread per core for its processor's
    and torch's CPU work, and several such processes oversubscribe the cores many times over), unless the user set
    the thread variables; and ``PYTHONFAULTHANDLER=1``, so a fatal signal (``timeout -s ABRT``) prints every thread's
    stack into the job's log."""
    env = dict(base)
    threads = str(max(1, (cpus or os.cpu_count() or 1) // max(1, sharing)))
    for key in THREAD_VARIABLES:
        env.setdefault(key, threads)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def launch_parallel(recipe: dict, name: str, jobs: list[list[str]], overrides: list[str],
                    sharing: int | None = None) -> list[tuple]:
    """Start a stage's sub-jobs as processes (logs under ``<work_dir>/logs``); `collect_parallel` waits for them.
    `sharing`: how many processes use the machine meanwhile (default: the jobs), for their CPU thread share."""
    import subprocess

    paths = common.Paths(recipe)
    logs = os.path.join(paths.root, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = []
    for i, sets in enumerate(jobs):
        result = os.path.join(logs, f"{name}_{i}.json")
        log_path = os.path.join(logs, f"{name}_{i}.log")
        command = [sys.executable, "-m", f"open_r1.tasks.captioning.stage_{name}", "--config",
                   recipe["_recipe_path"], "--result", result]
        for item in [*overrides, *sets]:
            command += ["--set", item]
        handle = open(log_path, "w")  # noqa: SIM115 - closed after the process ends, in collect_parallel
        env = child_env(os.environ, sharing or len(jobs))
        procs.append((subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env), handle, result,
                      log_path, sets))
        common.log(f"[pipeline] {name} job {i} ({' '.join(sets)}): log {log_path}")
    return procs


def collect_parallel(name: str, procs: list[tuple]) -> dict:
    merged: dict = {}
    failed = []
    for proc, handle, result, log_path, sets in procs:
        code = proc.wait()
        handle.close()
        with open(log_path) as f:
            ours = [line.rstrip() for line in f if line.startswith("[") or "error" in line.lower()]
        print("\n".join(ours[-25:]), flush=True)
        if code != 0 or not os.path.isfile(result):
            failed.append(f"{' '.join(sets)} (exit {code}, log {log_path})")
            continue
        part = common.read_json(result)
        if name == "grpo":
            merged.setdefault("runs", []).extend(part.get("runs", []))
        else:
            merged.update(part)
    if failed:
        raise OpenR1Error(f"stage {name}: sub-job(s) failed: {'; '.join(failed)}")
    return merged


def run_parallel(recipe: dict, name: str, jobs: list[list[str]], overrides: list[str]) -> dict:
    return collect_parallel(name, launch_parallel(recipe, name, jobs, overrides))


def early_starts(recipe: dict, stages) -> dict[str, str]:
    """``start_early: {rm: synthesize}`` in the recipe: start stage rm's parallel sub-jobs when stage synthesize
    begins (rm needs only the data and the RM backbone, so it can share the GPU with synthesis and SFT); its result
    is collected at its own place in the order. Only for parallel stages that come later in the order."""
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import stage_ratings

    wanted = recipe.get("start_early") or {}
    if not isinstance(wanted, dict):
        raise RecipeError("start_early must map a stage to the stage at whose start it begins, e.g. {rm: synthesize}")
    out = {}
    for stage, at in wanted.items():
        if stage not in ORDER or at not in ORDER or ORDER.index(at) >= ORDER.index(stage):
            raise RecipeError(f"start_early: {stage}: {at} must be a stage before it (order: {' '.join(ORDER)})")
        if not common.section(recipe, stage).get("parallel"):
            raise RecipeError(f"start_early: {stage} needs {stage}.parallel: true (its jobs run as processes)")
        if stage == "rm" and "ratings" in recipe and ORDER.index(at) <= ORDER.index("ratings") and (
                str(common.section(recipe, "rm").get("train_split", "train")) == stage_ratings.settings(recipe)["split"]):
            raise RecipeError(f"start_early: rm trains on the ratings stage's split (rm.train_split), so it cannot "
                              f"begin at {at}; drop start_early.rm or start it after ratings")
        if stage in stages:
            # the stage it waits for is not run: start at the first stage run after `at`, if any comes before it
            later = [s for s in stages if ORDER.index(at) <= ORDER.index(s) < ORDER.index(stage)]
            if later:
                out[later[0]] = stage
    return out


def check_recipe(recipe: dict) -> None:
    """Every stage's ``check_recipe``: its section's keys (an unknown one is a typo) and choices. The stages not run
    too: their sections are read for paths and job splits, and a typo there is a typo all the same."""
    for name in ORDER:
        importlib.import_module(f"open_r1.tasks.captioning.stage_{name}").check_recipe(recipe)


def load_checked_recipe(path: str, overrides: list[str] | None = None) -> dict:
    """`stage_common.load_recipe` and then `check_recipe`: for the scripts that read a recipe outside the pipeline
    (experiments/captioning/*), so a misspelt ``--set`` fails there too instead of being ignored."""
    recipe = common.load_recipe(path, overrides)
    check_recipe(recipe)
    return recipe


def preflight(recipe: dict, stages) -> None:
    """Before any stage runs: the recipe's keys and choices (`check_recipe`), and every stage's inputs (its module's
    ``inputs``) are on disk or made by a stage that runs before it, so a chain whose work_dir is gone fails at once
    with the stage to run, not minutes in."""
    check_recipe(recipe)
    for i, name in enumerate(stages):
        module = importlib.import_module(f"open_r1.tasks.captioning.stage_{name}")
        if hasattr(module, "inputs"):
            inputs = module.inputs(recipe)
            common.check_inputs(inputs, produced=stages[:i])
            if "data" in stages[:i]:
                check_split_names(recipe, name, inputs)


def check_split_names(recipe: dict, stage: str, inputs: dict) -> None:
    """A split that the data stage of this run is to write must be one of its names (`stage_data.split_names`), or
    already on disk (the stage keeps an existing stand-in): ``--set eval.splits=[test,od]`` fails here, not when the
    eval stage starts after every model trained."""
    from open_r1.tasks.captioning.stage_data import split_names
    from open_r1.tasks.captioning.stage_rm import scored_splits

    names, paths = split_names(recipe), common.Paths(recipe)
    named = [os.path.basename(item.path) for item in inputs.values() if item.made_by == "data"]
    # the splits a stage reads besides its inputs: the RM's held-out scoring, GRPO's in-training evaluation
    named += {"rm": scored_splits(recipe), "grpo": common.section(recipe, "grpo").get("eval_sets", [])}.get(stage, [])
    for split in named:
        if split not in names and not os.path.isdir(paths.split(split)):
            raise RecipeError(f"the {stage} stage reads the split {split!r}, which the data stage does not write (it "
                              f"writes {', '.join(names)}); name one of those in the {stage} section")


def run_pipeline(recipe: dict, stages=None, out: str | None = None, overrides: list[str] | None = None) -> dict:
    """Run ``stages`` in order (None: ``default_stages``)."""
    stages = default_stages(recipe) if stages is None else list(stages)
    starts_at = early_starts(recipe, stages)
    preflight(recipe, stages)  # before anything is written into the work_dir
    paths = common.Paths(recipe)
    os.makedirs(paths.results, exist_ok=True)
    summary_path = os.path.join(paths.results, "pipeline.json")
    summary = common.read_json(summary_path) if os.path.isfile(summary_path) else {"stages": {}}
    summary["recipe"] = recipe.get("_recipe_path")
    summary["device"] = _device_name()
    started = time.time()
    running: dict[str, tuple[float, list]] = {}  # stage -> (start time, its processes), started early
    try:
        for name in stages:
            if name in starts_at:
                early = starts_at[name]
                common.log(f"[pipeline] stage {early} starts early, beside {name} (elapsed {time.time() - started:.0f} s)")
                jobs = parallel_jobs(recipe, early)
                # this process keeps running stages meanwhile: it takes one share of the cores too
                running[early] = (time.time(), launch_parallel(recipe, early, jobs, overrides or [],
                                                              sharing=len(jobs) + 1))
                _share_threads(len(jobs) + 1)
            t0 = time.time()
            common.log(f"[pipeline] stage {name} (elapsed {t0 - started:.0f} s)")
            module = importlib.import_module(f"open_r1.tasks.captioning.stage_{name}")
            jobs = parallel_jobs(recipe, name)
            if name in running:
                t0, procs = running.pop(name)
                result = collect_parallel(name, procs)
                if not running:
                    _share_threads(1)
            else:
                result = run_parallel(recipe, name, jobs, overrides or []) if jobs else module.run(recipe)
            if jobs and hasattr(module, "finish"):
                result = module.finish(recipe, result)  # over the merged sub-jobs (the RM's seed choice)
            summary["stages"][name] = {"seconds": time.time() - t0, "result": result}
            common.write_json(summary_path, summary)
            if out:  # after every stage: a run cut short still returns what it measured
                with open(os.path.join(paths.results, "results.md"), "w") as handle:
                    handle.write(results_markdown(summary))
                copy_results(paths, out)
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
    common.write_json(summary_path, summary)
    markdown = results_markdown(summary)
    with open(os.path.join(paths.results, "results.md"), "w") as handle:
        handle.write(markdown)
    common.log(f"[pipeline] done in {summary['total_seconds']:.0f} s\n{markdown}")
    if out:
        copy_results(paths, out)
    return summary


_THREADS_AT_START: list[int] = []


def _share_threads(sharing: int) -> None:
    """This process's torch CPU threads while `sharing - 1` early jobs run beside it (1: back to the start value)."""
    import torch

    if not _THREADS_AT_START:
        _THREADS_AT_START.append(torch.get_num_threads())
    torch.set_num_threads(max(1, _THREADS_AT_START[0] // max(1, sharing)))


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}f}"


def _swap(swap: dict | None) -> str:
    return "–" if not swap else f"{swap['accuracy']:.3f} [{swap['ci_low']:.3f}, {swap['ci_high']:.3f}]"


def _stage_seconds(summary: dict) -> float:
    return sum(block.get("seconds", 0.0) for block in summary.get("stages", {}).values())


def results_markdown(summary: dict) -> str:
    lines = [f"# humor-r1 pipeline results ({summary.get('device')})", "",
             (f"recipe: `{summary.get('recipe')}`; stages {_stage_seconds(summary):.0f} s in all "
              f"(the last invocation {summary.get('total_seconds', 0):.0f} s)"), ""]
    stages = summary.get("stages", {})
    lines += ["| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {block['seconds']:.1f} |" for name, block in stages.items()]
    rm = (stages.get("rm") or {}).get("result") or {}
    if rm:
        lines += ["", "## Reward model: held-out pairwise accuracy (95 % bootstrap CI over contests)", "",
                  "| RM | split | accuracy | CI | pairs | contests | label/oracle agreement | image swap (own cartoon "
                  "wins) |", "|---|---|---|---|---|---|---|---|"]
        kept = (rm.get("rm") or {}).get("selected")
        labels = {"rm": "with image" + (f" (kept: seed {kept['seed']}, best on val)" if kept else "")}
        labels.update({key: f"with image, seed {key[4:]}" for key in sorted(rm) if key.startswith("rm_s")})
        labels["rm_blind"] = "image-blind"
        for key, label in labels.items():
            for split, r in ((rm.get(key) or {}).get("held_out") or {}).items():
                lines.append(f"| {label} | {split} | "
                             f"{_fmt(r['accuracy'])} | [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {r['n_pairs']} | "
                             f"{r['n_groups']} | {_fmt(r.get('oracle_agreement_of_labels'))} | "
                             f"{_swap(r.get('image_swap'))} |")
    ratings = (stages.get("ratings") or {}).get("result")
    if ratings:
        lines += ["", (f"Ratings round (simulated readers): {ratings['samples']} samples of the SFT policy, format "
                       f"{100 * ratings['format_rate']:.1f} %, {ratings['counts']['rated']} new captions rated (oracle "
                       f"mean {_fmt(ratings['oracle_rated_mean'])}, the candidates' {_fmt(ratings['oracle_candidates_mean'])}); "
                       f"{ratings['pairs_with_a_rated_caption']} of the RM's {ratings['pairs']} training pairs "
                       f"({ratings['pairs_of_two_rated_captions']} of two rated captions) in split "
                       f"`{os.path.basename(ratings['split'])}`.")]
    synth = (stages.get("synthesize") or {}).get("result")
    if synth:
        lines += ["", (f"Trace synthesis (real code path, {synth.get('engine')}): {synth.get('rows')} rows, kept "
                       f"{synth.get('kept')}, dropped truncated {synth.get('truncated')}, empty {synth.get('empty')}, "
                       f"caption-leaking {synth.get('leaks_caption')}; SFT traces: {synth.get('sft_traces')}.")]
    ev = (stages.get("eval") or {}).get("result") or {}
    checks = ev.get("must_show_grpo") or {}
    if checks:
        lines += ["", "## GRPO vs the SFT start (paired over cartoons; point estimate [95 % CI])", "",
                  "| run | split | Δ fail-as-zero σ(RM) | Δ oracle (emitted) | Δ oracle (fail = worst) "
                  "| Δ oracle (RM pick) | both up, oracle emitted (points / CIs) | both up, fail = worst (points / CIs) |",
                  "|---|---|---|---|---|---|---|---|"]

        def with_ci(value, ci):
            ci = ci or {}
            return f"{_fmt(value)} [{_fmt(ci.get('lo'))}, {_fmt(ci.get('hi'))}]"

        def yes(flag):
            return "yes" if flag else "no"

        for name, per_split in checks.items():
            for split, c in per_split.items():
                lines.append(f"| {name} | {split} | {with_ci(c['d_fail_as_zero'], c.get('fail_as_zero_ci'))} | "
                             f"{with_ci(c['d_oracle_emitted'], c.get('oracle_emitted_ci'))} | "
                             f"{with_ci(c.get('d_oracle_fail_as_worst'), c.get('oracle_fail_as_worst_ci'))} | "
                             f"{_fmt(c['d_oracle_pick'])} | {yes(c['both_up'])} / {yes(c.get('both_up_ci'))} | "
                             f"{yes(c.get('both_up_worst'))} / {yes(c.get('both_up_worst_ci'))} |")
    for split, block in (ev.get("splits") or {}).items():
        lines += ["", f"## Best-of-N, split {split}", "", block["table"]]
    return "\n".join(lines) + "\n"


def copy_results(paths: common.Paths, out: str) -> list[str]:
    """The small result files into `out` (flat, at most 8): pipeline.json, results.md, per split bon_eval.json/.md
    and the BoN plot of the first split."""
    os.makedirs(out, exist_ok=True)
    files = [os.path.join(paths.results, "pipeline.json"), os.path.join(paths.results, "results.md")]
    splits = sorted(d for d in os.listdir(paths.results) if d.startswith("eval_"))
    for split in splits:
        files.append(os.path.join(paths.results, split, "bon_eval.json"))
    for split in splits[:2]:
        files.append(os.path.join(paths.results, split, "bon_curve.png"))
    copied = []
    for path in files[:7]:
        if os.path.isfile(path):
            parent = os.path.basename(os.path.dirname(path))
            name = os.path.basename(path) if parent == "results" else f"{parent}_{os.path.basename(path)}"
            shutil.copy(path, os.path.join(out, name))
            copied.append(name)
    return copied


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m open_r1.tasks.captioning.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--stages", nargs="+", default=None, choices=ORDER,
                        help="a subset, in order (default: all; ratings only where the recipe has its section)")
    parser.add_argument("--out", default=None, help="copy the small result files here")
    args = parser.parse_args(argv)
    try:
        recipe = common.load_recipe(args.config, args.set)
        run_pipeline(recipe, args.stages, args.out, args.set)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
