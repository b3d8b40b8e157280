#!/usr/bin/env python
"""Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python scripts/export_submission.py --checkpoint runs/demo --out submission
    python scripts/export_submission.py --checkpoint runs/lora/checkpoint-300 --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json). The processor
keeps the training vision-token budget. The result is verified (loads with Qwen2VLForConditionalGeneration and
generates) in a temp dir beside --out before it replaces anything; a replaced submission is kept as
<out>.prev-<timestamp>.

Given a run dir, the exported checkpoint is the keep-best one (open_r1/keep_best.py: the best in-training OOD score
recorded in eval_history.json / best_checkpoint.json), else the final model. The export time is recorded in the run
dir (budget_timings.json) so the next round's time budget reserves the measured value.
"""
import argparse
import os
import sys
import time

_START = time.time()  # before the heavy imports: the budget reserve covers the whole export process

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from open_r1.export import ExportError, export_submission  # noqa: E402
from open_r1.modeling import ModelError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="training output dir or a checkpoint-N dir")
    parser.add_argument("--out", required=True, help="submission dir to write (replaced atomically)")
    parser.add_argument("--base-model", default=None, help="base model for a LoRA adapter (default: recorded one)")
    parser.add_argument("--min-pixels", type=int, default=None)
    parser.add_argument("--max-pixels", type=int, default=None)
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    args = parser.parse_args(argv)
    from open_r1.keep_best import resolve_export_checkpoint

    started = _START if argv is None else time.time()
    checkpoint = resolve_export_checkpoint(args.checkpoint)
    try:
        export_submission(checkpoint, args.out, args.base_model, args.min_pixels, args.max_pixels,
                          verify=not args.no_verify_generate)
    except (ExportError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if os.path.isfile(os.path.join(args.checkpoint, "training_meta.json")):  # a run dir: feed the next budget
        from open_r1.callbacks import record_export_seconds

        try:
            record_export_seconds(args.checkpoint, time.time() - started)
        except OSError as exc:
            print(f"warning: could not record the export time in {args.checkpoint}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
