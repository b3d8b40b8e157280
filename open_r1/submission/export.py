r"""Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python -m open_r1.submission.export --checkpoint runs/demo/grpo --out submission
    python -m open_r1.submission.export --checkpoint runs/lora/checkpoint-300 \
        --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json); the processor
keeps the training vision-token budget. Given a run dir, the keep-best checkpoint is exported (the best in-training OOD
score, open_r1/run/keep_best.py), else the final model, and the export time is recorded for the next round's budget.
The result is verified (loads with Qwen2VLForConditionalGeneration and generates) in a temp dir beside --out, with
modes 0755/0644, then installed atomically (`open_r1.submission`); a replaced submission is kept as
<out>.prev-<timestamp>. A submission holding its selfcheck report (selfcheck.json) is never replaced without
--replace: the new model goes to <out>.candidate-<timestamp> and the commands to score and promote it are printed.
An --out that holds something other than a model is replaced only with --force.
"""

import argparse
import logging
import os
import time

from peft import PeftModel

from open_r1 import modeling
from open_r1.checks import check_checkpoint
from open_r1.errors import CliHelp, ExportError, setup_logging
from open_r1.jsonio import read_json
from open_r1.noise import quiet_library_noise
from open_r1.run.budget import record_export_seconds
from open_r1.run.keep_best import resolve_export_checkpoint
from open_r1.run.resume import find_resume_checkpoint
from open_r1.submission.install import check_target, exit_cli, installing, kept_path, locked, run_cli
from open_r1.submission.report import REPORT_FILE, report_set_paths
from open_r1.submission.verify import COUNTING_GRADER_CLASS, VerifyReport, verify_submission

logger = logging.getLogger(__name__)
TRAINING_META_FILE = "training_meta.json"
_START = time.time()  # import time of this module: the budget reserve covers the whole export process


def is_model_dir(path: str) -> bool:
    """What export and promote replace without --force: a saved model (its config.json)."""
    return os.path.isfile(os.path.join(path, "config.json"))


def _read_meta(checkpoint: str) -> dict:
    for folder in (checkpoint, os.path.dirname(os.path.abspath(checkpoint))):  # or checkpoint-N/'s run dir
        path = os.path.join(folder, TRAINING_META_FILE)
        if os.path.isfile(path):
            return read_json(path)
    return {}


def load_for_export(checkpoint: str, base_model: str | None = None):
    """The full model from a checkpoint dir: full weights as saved, or base + LoRA adapter merged."""
    adapter_config = os.path.join(checkpoint, "adapter_config.json")
    if not os.path.isfile(adapter_config):
        return modeling.load_model(checkpoint, dtype="auto", attn_implementation="sdpa"), checkpoint
    base = (
        base_model
        or _read_meta(checkpoint).get("base_model")
        or read_json(adapter_config).get("base_model_name_or_path")
    )
    if not base:
        raise ExportError(f"{checkpoint} is a LoRA adapter with no recorded base model; pass --base-model")
    model = modeling.load_model(base, dtype="auto", attn_implementation="sdpa")
    return PeftModel.from_pretrained(model, checkpoint).merge_and_unload(), base


def export_submission(
    checkpoint: str,
    out: str,
    base_model: str | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    verify: bool = True,
    replace_scored: bool = False,
    expected_class: str | None = COUNTING_GRADER_CLASS,
    force: bool = False,
) -> VerifyReport:
    """Merge (if LoRA), save and verify beside `out`, then install it (`installing`). A scored `out` (holding its
    selfcheck.json) is kept unless `replace_scored`: the new model goes beside it as `<out>.candidate-<time>`
    (report.path). `expected_class`: as in `verify_submission`; `force`: replace an `out` that holds no model."""
    if not os.path.isdir(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} does not exist; train first (bash train.sh) or pass --checkpoint")
    in_run = os.path.basename(checkpoint.rstrip("/")).startswith("checkpoint-")
    run_dir = os.path.dirname(os.path.abspath(checkpoint.rstrip("/"))) if in_run else checkpoint
    out = os.path.abspath(out.rstrip("/") or out)
    inputs = [base_model, checkpoint if in_run else None]
    check_target(out, "--out / SUBMISSION", "the submission", inputs, run_dir, own=is_model_dir, force=force)
    problem = check_checkpoint(checkpoint)
    if problem:
        loadable = find_resume_checkpoint(run_dir) if in_run else None
        fix = (
            f"export the newest checkpoint that loads: --checkpoint {loadable}"
            if loadable
            else "export another checkpoint (--checkpoint <run dir>/checkpoint-N) or re-train"
        )
        raise ExportError(
            f"checkpoint {checkpoint} does not load: {problem}. {fix}; the submission at {out} is unchanged"
        )
    with locked(out):  # from reading its report to the install: a promote on `out` meanwhile is refused
        scored = None if replace_scored else read_json(os.path.join(out, REPORT_FILE), None)
        scored = scored if isinstance(scored, dict) else None
        meta = _read_meta(checkpoint)
        model, base = load_for_export(checkpoint, base_model)
        processor = modeling.load_processor(  # the training run's vision-token budget unless given
            checkpoint if os.path.isfile(os.path.join(checkpoint, "preprocessor_config.json")) else base,
            meta.get("min_pixels") if min_pixels is None else min_pixels,
            meta.get("max_pixels") if max_pixels is None else max_pixels,
        )
        dest = out if scored is None else kept_path(out, "candidate")
        with installing(
            dest, kept_path(out, "prev"), keep_new=True, error=ExportError, what="writing the new model"
        ) as staging:
            logger.info(f"[export] writing merged model from {checkpoint} into {staging}")
            model.save_pretrained(staging, safe_serialization=True)
            processor.save_pretrained(staging)
            modeling.write_compat_processor_files(staging)
            model.generation_config.save_pretrained(staging)
            report = verify_submission(
                staging, generate=verify, expected_class=expected_class, task=meta.get("task", "counting")
            )  # probed under the run's own task
            if not report.ok:
                raise ExportError(
                    "the exported model failed verification: "
                    + "; ".join(report.problems)
                    + f". The submission at {out} is unchanged"
                )
            for warning in report.warnings:
                logger.warning(f"[export] warning: {warning}")
        report.path = dest
        if scored is None:
            print(f"[export] submission ready: {out}")  # the product: where the model is
            return report
        sets = report_set_paths(scored).values()
        sets_arg = f" --sets {' '.join(sets)}" if sets else ""
        limit_arg = f" --limit {scored['limit']}" if scored.get("limit") else ""
        print(
            f"[export] {out} holds a scored submission ({scored.get('mean_accuracy_pct')}% mean accuracy in its "
            f"{REPORT_FILE}): kept. The new model is at {report.path}; score it the same way and promote it if it is "
            f"better: python selfcheck.py --model {report.path}{sets_arg}{limit_arg} && "
            f"python -m open_r1.submission.promote --candidate {report.path} --submission {out} (or export with "
            "--replace to overwrite without comparing)"
        )
        return report


def main(argv=None) -> int:
    setup_logging()
    quiet_library_noise()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=CliHelp)
    parser.add_argument("--checkpoint", required=True, help="training output dir or a checkpoint-N dir")
    parser.add_argument("--out", required=True, help="submission dir to write (replaced atomically)")
    parser.add_argument(
        "--base-model", default=None, help="base model for a LoRA adapter (without it: the one recorded)"
    )
    parser.add_argument(
        "--min-pixels",
        type=int,
        default=None,
        help="processor min_pixels (without it: the training run's, from training_meta.json)",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="processor max_pixels (without it: the training run's, from training_meta.json)",
    )
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    parser.add_argument(
        "--any-family",
        action="store_true",
        help=f"verify as a model of its own family (Qwen2.5-VL, Qwen3-VL), not as the counting "
        f"submission the grader loads with {COUNTING_GRADER_CLASS}",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help=f"replace a scored submission (one with {REPORT_FILE}) without comparing; by default "
        "the new model is written beside it as <out>.candidate-<timestamp>",
    )
    parser.add_argument("--force", action="store_true", help="replace an --out that holds something other than a model")
    args = parser.parse_args(argv)
    started = _START if argv is None else time.time()

    def work() -> int:
        export_submission(
            resolve_export_checkpoint(args.checkpoint),
            args.out,
            args.base_model,
            args.min_pixels,
            args.max_pixels,
            verify=not args.no_verify_generate,
            replace_scored=args.replace,
            expected_class=None if args.any_family else COUNTING_GRADER_CLASS,
            force=args.force,
        )
        if os.path.isfile(os.path.join(args.checkpoint, TRAINING_META_FILE)):  # a run dir: feed the budget
            try:
                record_export_seconds(args.checkpoint, time.time() - started)
            except OSError as exc:
                logger.warning(f"warning: could not record the export time in {args.checkpoint}: {exc}")
        return 0

    return run_cli("export", args.out, work)


def cli(argv=None) -> None:  # the console script open-r1-export
    exit_cli(main, argv)


if __name__ == "__main__":
    cli()
