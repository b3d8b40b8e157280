#!/usr/bin/env python
"""Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python scripts/export_submission.py --checkpoint runs/demo --out submission
    python scripts/export_submission.py --checkpoint runs/lora/checkpoint-300 --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json). The processor
keeps the training vision-token budget. The result is verified (loads with Qwen2VLForConditionalGeneration and
generates) in a temp dir beside --out before it replaces anything; a replaced submission is kept as
<out>.prev-<timestamp>.
"""
import argparse
import os
import sys

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
    try:
        export_submission(args.checkpoint, args.out, args.base_model, args.min_pixels, args.max_pixels,
                          verify=not args.no_verify_generate)
    except (ExportError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
