#!/usr/bin/env python
"""Proxy experiment: GRPO recipes x seeds from one warm start, scored with the selfcheck protocol before and after.

    # GPU (one H200): after experiments/proxy/sft_warmstart.py has written models/proxy-warmstart and data/proxy
    python -m experiments.proxy.proxy_experiment --warmstart models/proxy-warmstart --data data/proxy --out
    runs/proxy-results \\
        --work-dir /tmp/proxy-work --seeds 0 1 2 --ablation-seeds 0 --budget-minutes 4.5
    # CPU smoke test (< 2 min): tiny random model, tiny data, 2 steps, weak_baseline and ours, seed 0
    python -m experiments.proxy.proxy_experiment --tiny --out /tmp/proxy-tiny

Arms (`experiments.proxy.proxy.ARMS`, recipes in experiments/proxy/configs/): `weak_baseline`, `ours` and ablations
of ours; each a GRPO run through `open_r1.grpo` in its own process, all at once on the one GPU. Every arm generates
the same completions per optimizer step (`--generation-batch`) and stops at the same step: fixed (`--no-sync
--max-steps N`) or, by default, the largest step every arm can reach before the training deadline (`--budget-minutes`
minus `--eval-reserve`), projected from the arms' speeds and raised while every arm is at least 2 steps short of it.
The start model ("before") and every run are then scored with the selfcheck protocol on the first `--eval-limit` rows
of val, compositional and ood_val (LoRA runs merged).

Output dir: results.json, RESULTS.md (tables, verdict, ablations, every run's command), acc_by_count.png and
logs.tar.gz; `python -m experiments.proxy.make_results results.json` rebuilds RESULTS.md and the PNG.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from experiments.proxy import proxy
from open_r1.tasks.counting import protocol

TINY_GRPO_OVERRIDES = [
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--dtype",
    "float32",
    "--max_pixels",
    str(proxy.TINY_MAX_PIXELS),
    "--num_generations",
    "2",
    "--max_completion_length",
    "8",
    "--max_train_samples",
    "16",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmstart", default=None, help="start model dir (experiments/proxy/sft_warmstart.py --out)")
    parser.add_argument(
        "--data", default=None, help="dir with train/val/compositional/ood_val (data/proxy; --tiny: <out>/data)"
    )
    parser.add_argument(
        "--out",
        default="runs/proxy-results",
        help="results dir (results.json, RESULTS.md, acc_by_count.png, logs.tar.gz)",
    )
    parser.add_argument("--work-dir", default=None, help="run dirs, specs, per-job logs (default <out>/work)")
    parser.add_argument("--arms", nargs="+", default=None, choices=list(proxy.ARMS), help="arms to run (default all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds of weak_baseline and ours (0 1)")
    parser.add_argument("--ablation-seeds", nargs="+", type=int, default=[0], help="seeds of the ablations (0)")
    parser.add_argument("--max-steps", type=int, default=None, help="step cap of every arm (YAML's 400; tiny 2)")
    parser.add_argument("--no-sync", action="store_true", help="no common stop step: every arm runs --max-steps")
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="wall budget of the whole experiment from its start, evaluation and report included (4.5; tiny: none)",
    )
    parser.add_argument(
        "--end-at",
        type=float,
        default=None,
        help="Unix time by which everything must be written (instead of --budget-minutes), e.g. "
        "START+510 for a call that began at START: adapts to however long the warm start took",
    )
    parser.add_argument(
        "--eval-reserve", type=float, default=90.0, help="seconds kept after training for evaluation and the report"
    )
    parser.add_argument(
        "--generation-batch",
        type=int,
        default=None,
        help="completions per optimizer step, every arm (the YAMLs' 256; tiny 4)",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="completions per forward/backward (the YAMLs' per_device_train_batch_size, 128; tiny 4)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"learning rate of every full fine-tuning arm (YAML's; LoRA gets {proxy.LORA_LR_FACTOR:g}x)",
    )
    parser.add_argument("--grpo-extra", default="", help="extra open_r1.grpo overrides for every arm, one string")
    parser.add_argument("--eval-limit", type=int, default=None, help="first N rows of each eval split (400; tiny 4)")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="generation batch of evaluation (200)")
    parser.add_argument(
        "--eval-max-new-tokens",
        type=int,
        default=None,
        help=f"evaluation budget (the protocol's {protocol.EVAL_MAX_NEW_TOKENS}; tiny 16)",
    )
    parser.add_argument("--parallel", type=int, default=None, help="jobs at once (default: all)")
    parser.add_argument("--threads-per-job", type=int, default=None, help="OMP threads per job")
    parser.add_argument(
        "--gpus",
        default=None,
        help="comma-separated GPU ids; jobs are spread over them round-robin (CUDA_VISIBLE_DEVICES "
        "per job). Default: every job sees the GPUs this process sees",
    )
    parser.add_argument("--save-models", action="store_true", help="keep each run's final model in its run dir")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (tiny model and data, 2 steps)")
    parser.add_argument("--no-before", action="store_true", help="skip evaluating the start model")
    args = parser.parse_args(argv)
    tiny = args.tiny
    defaults = {
        "data": os.path.join(args.out, "data") if tiny else "data/proxy",  # tiny: under --out, not the working tree
        "arms": list(proxy.MAIN_ARMS) if tiny else list(proxy.ARMS),
        "seeds": [0] if tiny else [0, 1],
        "max_steps": 2 if tiny else None,
        "generation_batch": 4 if tiny else None,
        "micro_batch": 4 if tiny else None,
        "eval_limit": 4 if tiny else 400,
        "eval_batch_size": 4 if tiny else 200,
        "eval_max_new_tokens": 16 if tiny else protocol.EVAL_MAX_NEW_TOKENS,
        "budget_minutes": None if tiny else 4.5,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if tiny:
        args.no_sync = True
    if not tiny and not args.warmstart:
        parser.error("--warmstart is required (a model dir from experiments/proxy/sft_warmstart.py), or use --tiny")
    return args


def log(message: str) -> None:
    print(f"[proxy {time.strftime('%H:%M:%S')}] {message}", flush=True)


def recipe_value(arm: str, key: str):
    return proxy.read_recipe(proxy.ARMS[arm].config_path()).get(key)


def generation_geometry(args, arms: list[str]) -> tuple[int, int, int]:
    """(generation batch, micro-batch, accumulation) shared by every arm; checks whole groups for every arm."""
    batch = args.generation_batch
    if batch is None:
        sizes = {
            int(recipe_value(a, "per_device_train_batch_size"))
            * int(recipe_value(a, "gradient_accumulation_steps") or 1)
            for a in arms
        }
        batch = max(sizes)
    micro = args.micro_batch or min(int(recipe_value(a, "per_device_train_batch_size")) for a in arms)
    micro = min(micro, batch)
    if batch % micro:
        raise SystemExit(f"error: --generation-batch {batch} is not a multiple of --micro-batch {micro}")
    for arm in arms:
        groups = 2 if args.tiny else proxy.arm_num_generations(arm)
        if batch % groups:
            raise SystemExit(f"error: generation batch {batch} is not divisible by {arm}'s num_generations {groups}")
    return batch, micro, batch // micro


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.time()
    command = "python -m experiments.proxy.proxy_experiment " + proxy.shell_join(
        sys.argv[1:] if argv is None else list(argv)
    )
    out_dir = Path(args.out).resolve()
    work = Path(args.work_dir).resolve() if args.work_dir else out_dir / "work"
    for sub in ("specs", "logs", "results", "progress", "predictions", "runs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    control_path = work / "control.json"
    control_path.unlink(missing_ok=True)

    # Data and start model
    data_dir = Path(args.data).resolve()
    required = {"train": 1, **{s: (args.eval_limit or 1) for s in proxy.EVAL_SPLITS}}
    sizes = dict(proxy.TINY_SIZES if args.tiny else proxy.PROXY_SIZES)
    for split in proxy.EVAL_SPLITS:
        sizes[split] = max(sizes[split], args.eval_limit or 0)
    proxy.ensure_splits(
        data_dir,
        sizes,
        seed=0,
        required=required,
        image_size=proxy.TINY_IMAGE_SIZE if args.tiny else proxy.PROXY_IMAGE_SIZE,
        ood_image_size=proxy.TINY_OOD_IMAGE_SIZE if args.tiny else proxy.PROXY_OOD_IMAGE_SIZE,
        progress=not args.tiny,
        log=log,
    )
    if args.warmstart:
        warm = Path(args.warmstart).resolve()
    else:  # --tiny without a warm start: a random tiny Qwen2-VL (tests the tooling, not the method)
        from open_r1.tiny_models import build_qwen2vl

        warm = build_qwen2vl(work / "tiny-start", seed=0, max_pixels=proxy.TINY_MAX_PIXELS)
    from open_r1 import modeling

    modeling.check_model_dir(str(warm))
    start_info = describe_start(warm)

    # Jobs
    batch, micro, accumulation = generation_geometry(args, args.arms)
    max_steps = args.max_steps or int(recipe_value("ours", "max_steps") or 400)
    sync = not args.no_sync
    end_at = args.end_at or (started + 60.0 * args.budget_minutes if args.budget_minutes else None)
    budget = end_at - started if end_at else None
    if budget is not None and budget < args.eval_reserve + 60:
        log(
            f"warning: only {budget:.0f} s left for the experiment ({args.eval_reserve:.0f} s of it kept for "
            "evaluation): expect very few steps"
        )
    train_deadline = max(started + 30.0, end_at - args.eval_reserve) if end_at else None
    hard_deadline = train_deadline + 10.0 if train_deadline else None
    kill_at = end_at - 8.0 if end_at else None  # stragglers are stopped so that the report is still written
    extra = args.grpo_extra.split() if args.grpo_extra else []
    jobs = []
    if not args.no_before:
        jobs.append({"job": "before", "kind": "before", "arm": None, "seed": None})
    for arm in args.arms:
        seeds = args.seeds if proxy.ARMS[arm].role != "ablation" else args.ablation_seeds
        for seed in seeds:
            jobs.append({"job": f"{arm}-s{seed}", "kind": "train", "arm": arm, "seed": seed})
    eval_cfg = {
        "data_dir": str(data_dir),
        "splits": list(proxy.EVAL_SPLITS),
        "limit": args.eval_limit,
        "batch_size": args.eval_batch_size,
        "max_new_tokens": args.eval_max_new_tokens,
    }
    for job in jobs:
        name = job["job"]
        job.update(
            spec=str(work / "specs" / f"{name}.json"),
            log=str(work / "logs" / f"{name}.log"),
            result=str(work / "results" / f"{name}.json"),
            predictions=str(work / "predictions" / f"{name}.json"),
            eval=eval_cfg,
            cpu=args.tiny,
        )
        if job["kind"] == "before":
            job["model"] = str(warm)
            continue
        arm, seed = job["arm"], job["seed"]
        overrides = proxy.arm_overrides(arm, learning_rate=args.lr)
        run_dir = work / "runs" / name
        argv = [
            "--config",
            str(proxy.ARMS[arm].config_path()),
            "--model_name_or_path",
            str(warm),
            "--dataset_name",
            str(data_dir / "train"),
            "--output_dir",
            str(run_dir),
            "--seed",
            str(seed),
            "--max_steps",
            str(max_steps),
            "--per_device_train_batch_size",
            str(micro),
            "--gradient_accumulation_steps",
            str(accumulation),
            *overrides,
            *(TINY_GRPO_OVERRIDES if args.tiny else []),
            *extra,
        ]
        job.update(
            grpo_argv=argv,
            overrides=overrides,
            run_dir=str(run_dir),
            sync={
                "progress": str(work / "progress" / f"{name}.json"),
                "control": str(control_path) if sync else None,
                "hard_deadline": hard_deadline,
            },
            save_model=str(run_dir / "final") if args.save_models else None,
        )
        Path(job["sync"]["progress"]).unlink(missing_ok=True)
    for job in jobs:
        Path(job["result"]).unlink(missing_ok=True)
        proxy.write_json(job["spec"], job)

    log(
        f"{len(jobs)} jobs ({', '.join(j['job'] for j in jobs)}); generation batch {batch} = {accumulation} x {micro}; "
        f"max_steps {max_steps}; sync {'on' if sync else 'off'}; budget "
        f"{f'{budget:.0f} s' if budget else 'none'}; work dir {work}"
    )
    stop_at = run_jobs(jobs, args, sync, control_path, train_deadline, max_steps, kill_at)

    # Collect
    runs, before = [], None
    for job in jobs:
        result = proxy.read_json(job["result"], None) or {
            "status": "killed",
            "error": "no result (killed or crashed; see log)",
        }
        if result.get("status") in ("running", "evaluating"):  # stopped by the budget before it finished
            result["status"] = "partial" if result.get("splits") else "killed"
            result.setdefault("error", "stopped at the end of the budget before its evaluation finished")
        result.update(
            job=job["job"], arm=job["arm"], seed=job["seed"], kind=job["kind"], log=os.path.relpath(job["log"], work)
        )
        if job["kind"] == "before":
            result["command"] = (
                f"python selfcheck.py --model {warm} --sets "
                + " ".join(str(data_dir / s) for s in proxy.EVAL_SPLITS)
                + f" --limit {args.eval_limit}"
            )
            before = result
            continue
        steps_done = result.get("steps", max_steps)
        argv = list(job["grpo_argv"])
        argv[argv.index("--max_steps") + 1] = str(steps_done)
        result["command"] = "python -m open_r1.grpo " + proxy.shell_join(argv)
        result["rerun"] = (
            f"python -m experiments.proxy.proxy_experiment --warmstart {warm} --data {data_dir} --arms {job['arm']} "
            f"--seeds {job['seed']} --ablation-seeds {job['seed']} --no-sync --max-steps {steps_done} "
            f"--generation-batch {batch} --micro-batch {micro} --eval-limit {args.eval_limit} --no-before"
            + (f" --lr {args.lr:g}" if args.lr else "")
            + (" --tiny" if args.tiny else "")
            + (f" --grpo-extra {proxy.shell_join([args.grpo_extra])}" if args.grpo_extra else "")
        )
        runs.append(result)

    arm_order = [a for a in proxy.ARMS if a in args.arms]
    results = {
        "schema": proxy.RESULTS_SCHEMA,
        "meta": {
            "created": dt.datetime.now().isoformat(timespec="seconds"),
            "command": command,
            "results_json": "results.json",
            "rebuild_command": f"python -m experiments.proxy.make_results {out_dir / 'results.json'}",
            "versions": package_versions(),
            "tiny": args.tiny,
            "splits": list(proxy.EVAL_SPLITS),
            "eval_limit": args.eval_limit,
            "eval_max_new_tokens": args.eval_max_new_tokens,
            "eval_template": protocol.EVAL_TEMPLATE,
            "generation_batch_size": batch,
            "micro_batch": micro,
            "max_steps": max_steps,
            "sync": sync,
            "stop_at": stop_at,
            "budget_seconds": budget,
            "wall_seconds": time.time() - started,
            "start": start_info,
            "data": {
                "dir": str(data_dir),
                "sizes": proxy.split_sizes_on_disk(data_dir),
                **{
                    k: (start_info.get("sft_report") or {}).get("data", {}).get(k)
                    for k in ("image_size", "ood_image_size")
                },
            },
            "device": next((r.get("device") for r in runs + [before or {}] if r.get("device")), None),
        },
        "arms": {
            a: {**{k: v for k, v in vars(proxy.ARMS[a]).items()}, "overrides": proxy.arm_overrides(a, args.lr)}
            for a in arm_order
        },
        "arm_order": arm_order,
        "before": before,
        "runs": runs,
    }
    if args.tiny:
        results["meta"]["data"].update(image_size=proxy.TINY_IMAGE_SIZE, ood_image_size=proxy.TINY_OOD_IMAGE_SIZE)
    results_path = out_dir / "results.json"
    proxy.write_json(results_path, results)
    md_path, png_path = proxy.write_report(results, out_dir / "RESULTS.md", out_dir / "acc_by_count.png")
    with tarfile.open(out_dir / "logs.tar.gz", "w:gz") as tar:
        for sub in ("logs", "specs", "results", "predictions"):
            tar.add(work / sub, arcname=sub)
        if control_path.exists():
            tar.add(control_path, arcname="control.json")
    log(f"wrote {results_path}, {md_path}, {png_path}, {out_dir / 'logs.tar.gz'} ({time.time() - started:.0f} s)")
    print_summary(results)
    return results


def package_versions() -> dict:
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "datasets", "peft", "accelerate"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def describe_start(warm: Path) -> dict:
    info: dict = {"path": str(warm)}
    report = proxy.read_json(warm / "sft_report.json", None)
    if report:
        info.update(
            sft_report={k: v for k, v in report.items() if k != "loss_curve"}, parameters_m=report.get("parameters_m")
        )
    else:
        try:
            from transformers import AutoConfig

            from open_r1.tiny_models import count_parameters

            info["parameters_m"] = count_parameters(AutoConfig.from_pretrained(str(warm))) / 1e6
        except Exception:  # noqa: BLE001 - informative only
            pass
    return info


def run_jobs(
    jobs: list[dict],
    args,
    sync: bool,
    control_path: Path,
    train_deadline: float | None,
    max_steps: int,
    kill_at: float | None,
) -> int | None:
    """Start the workers (at most --parallel at once), decide the common stop step, wait, kill past the budget."""
    parallel = args.parallel or len(jobs)
    train_jobs = [j for j in jobs if j["kind"] == "train"]
    if sync and parallel < len(jobs):
        log(
            f"warning: --parallel {parallel} < {len(jobs)} jobs: queued arms cannot be synchronised; "
            "they run to the step decided for the first ones (or their deadline)"
        )
    cpus = os.cpu_count() or 1
    threads = args.threads_per_job or max(1, cpus // max(1, min(parallel, len(jobs))))
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    env["PYTHONPATH"] = os.pathsep.join([str(proxy.REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    launched = 0
    pending, running = list(jobs), {}
    stop_at = None
    last_report = last_decision = 0.0
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            handle = open(job["log"], "w")
            job_env = dict(env, CUDA_VISIBLE_DEVICES=gpus[launched % len(gpus)]) if gpus else env
            launched += 1
            proc = subprocess.Popen(
                [sys.executable, "-m", "experiments.proxy.proxy", "worker", "--spec", job["spec"]],
                cwd=str(proxy.REPO_ROOT),
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=job_env,
            )
            running[job["job"]] = (job, proc, handle, time.time())
            where = f" on GPU {job_env['CUDA_VISIBLE_DEVICES']}" if gpus else ""
            log(f"started {job['job']} (pid {proc.pid}){where}")
        for name, (job, proc, handle, t_start) in list(running.items()):
            if (code := proc.poll()) is not None:
                handle.close()
                del running[name]
                log(f"{name} finished with exit code {code} after {time.time() - t_start:.0f} s")
        now = time.time()
        if sync and train_deadline is not None and train_jobs and now - last_decision > 5:
            last_decision = now
            progress = {}
            for job in train_jobs:
                record = proxy.read_json(job["sync"]["progress"], None)
                if record is None and job["job"] not in running and job not in pending:
                    record = {"done": True}  # exited before it trained
                progress[job["job"]] = record
            if stop_at is None:
                decided = proxy.decide_stop_at(progress, now, train_deadline, max_steps)
            else:  # re-projected every few seconds: raised while no arm is near it, never lowered
                decided = proxy.raise_stop_at(stop_at, progress, now, train_deadline, max_steps)
            if decided is not None and decided != stop_at:
                steps = {k: (v or {}).get("step") for k, v in progress.items()}
                proxy.write_json(
                    control_path,
                    {
                        "stop_at": decided,
                        "decided_at": now,
                        "steps": steps,
                        "train_deadline": train_deadline,
                        "previous": stop_at,
                    },
                )
                log(
                    f"common stop step: {decided}{f' (raised from {stop_at})' if stop_at is not None else ''} "
                    f"(steps now {steps}; training deadline in {train_deadline - now:.0f} s)"
                )
                stop_at = decided
        if now - last_report > 30:
            last_report = now
            steps = {j["job"]: (proxy.read_json(j["sync"]["progress"], None) or {}).get("step") for j in train_jobs}
            log(f"progress: {steps}")
        if kill_at is not None and now > kill_at and running:
            for name, (job, proc, handle, _) in running.items():
                log(f"budget exceeded: terminating {name} (pid {proc.pid})")
                proc.terminate()
            deadline = time.time() + 15
            for name, (job, proc, handle, _) in list(running.items()):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                handle.close()
            running.clear()
            pending.clear()
        time.sleep(0.5)
    if sync and stop_at is None:
        log("no common stop step was decided (arms ended first): rollouts may differ; see the table")
    return stop_at if stop_at is not None else (None if sync else max_steps)


def print_summary(results: dict) -> None:
    summary = proxy.summarize(results)
    splits = results["meta"]["splits"]
    print("\nrecipe            " + "".join(f"{s:>22}" for s in splits))
    before = results.get("before")
    if before and before.get("status") in proxy.USABLE_STATUSES:
        print("before            " + "".join(f"{proxy._fmt(proxy._acc(before, s)):>22}" for s in splits))
    for arm, row in summary["table"].items():
        cells = "".join(f"{(proxy._fmt(v['mean']) + ' ± ' + proxy._fmt(v['range'])):>22}" for v in row.values())
        print(f"{arm:<18}{cells}")
    for split, v in summary["verdict"].items():
        print(
            f"verdict {split}: ours - weak = {v['delta']:+.1f} (spread {v['spread']:.1f}) -> "
            f"{'beats' if v['beats'] else 'does not beat'} by more than the spread"
        )


if __name__ == "__main__":
    main()
