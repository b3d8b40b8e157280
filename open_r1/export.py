"""Write a submission: full merged Qwen2-VL weights + tokenizer + processor + chat template + generation config.

Atomic by construction: everything is written into a temporary directory beside the target, verified there the
way the grader loads it (`Qwen2VLForConditionalGeneration.from_pretrained`, `AutoProcessor`, one greedy
generation under the eval protocol), and only then renamed into place. An existing submission is moved aside to
`<target>.prev-<timestamp>` first, so neither a crash nor a bad export loses a finished model.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

from open_r1 import modeling
from open_r1.errors import ExportError, ModelError  # noqa: F401  (re-exported)
from open_r1.run.keep_best import read_json
from open_r1.tasks.counting import protocol

TRAINING_META_FILE = "training_meta.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
EXPECTED_ARCHITECTURE = "Qwen2VLForConditionalGeneration"


@dataclass
class VerifyReport:
    path: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sample_completion: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _read_meta(checkpoint: str) -> dict:
    path = os.path.join(checkpoint, TRAINING_META_FILE)
    if os.path.isfile(path):
        with open(path) as handle:
            return json.load(handle)
    parent = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), TRAINING_META_FILE)
    if os.path.isfile(parent):  # checkpoint-N/ inside a run dir
        with open(parent) as handle:
            return json.load(handle)
    return {}


def load_for_export(checkpoint: str, base_model: str | None = None, dtype="auto"):
    """The full model from a checkpoint dir: full weights as saved, or base + LoRA adapter merged."""
    adapter_config = os.path.join(checkpoint, "adapter_config.json")
    if os.path.isfile(adapter_config):
        from peft import PeftModel

        with open(adapter_config) as handle:
            adapter_base = json.load(handle).get("base_model_name_or_path")
        base = base_model or _read_meta(checkpoint).get("base_model") or adapter_base
        if not base:
            raise ExportError(f"{checkpoint} is a LoRA adapter with no recorded base model; pass --base-model")
        model = modeling.load_model(base, dtype=dtype, attn_implementation="sdpa")
        model = PeftModel.from_pretrained(model, checkpoint).merge_and_unload()
        return model, base
    return modeling.load_model(checkpoint, dtype=dtype, attn_implementation="sdpa"), checkpoint


def _probe_image():
    """A small deterministic image for the load-and-generate check (no dataset needed)."""
    import numpy as np
    from PIL import Image

    grid = np.indices((96, 144)).sum(axis=0) % 32
    return Image.fromarray((np.stack([grid * 8, grid * 4, 255 - grid * 8], axis=-1)).astype("uint8"))


def verify_submission(path: str, generate: bool = True, strict_answer: bool = False, image=None,
                      question: str = "How many items are there in the image?") -> VerifyReport:
    """Check a submission dir the way the grader will load it. Never raises for a bad dir: it reports."""
    report = VerifyReport(path=path)
    if not os.path.isdir(path):
        report.problems.append(f"{path} does not exist")
        return report
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        report.problems.append("config.json is missing: not a saved transformers model")
        return report
    with open(config_path) as handle:
        config = json.load(handle)
    if config.get("model_type") != modeling.QWEN2_VL_MODEL_TYPE or EXPECTED_ARCHITECTURE not in (
        config.get("architectures") or []
    ):
        report.problems.append(
            f"wrong architecture: config.json says model_type={config.get('model_type')!r}, "
            f"architectures={config.get('architectures')}; the grader loads {EXPECTED_ARCHITECTURE}"
        )
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        report.problems.append("adapter_config.json present: a LoRA adapter must be merged into full weights")
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        report.problems.append("processor file preprocessor_config.json is missing: save the processor too")
    for name in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(path, name)):
            report.problems.append(f"tokenizer file {name} is missing: save the tokenizer (processor.save_pretrained)")
    if not any(os.path.isfile(os.path.join(path, n)) for n in CHAT_TEMPLATE_FILES) and "chat_template" not in (
        read_json(os.path.join(path, "tokenizer_config.json")) or {}
    ):
        report.problems.append("chat template is missing (chat_template.jinja): the prompt cannot be built")
    if not os.path.isfile(os.path.join(path, "generation_config.json")):
        report.warnings.append("generation_config.json is missing: eos ids fall back to config.json")
    report.problems.extend(_check_weights(path))
    if report.problems or not generate:
        return report
    try:
        import torch

        model = modeling.load_model(path, dtype="auto", attn_implementation="sdpa")
        if torch.cuda.is_available():  # a 2B model generates 256 tokens in seconds on a GPU, minutes on a CPU
            model = model.to("cuda")
        processor = modeling.load_processor(path)
    except Exception as exc:  # noqa: BLE001 - every load failure is a finding
        report.problems.append(f"loading failed: {type(exc).__name__}: {exc}")
        return report
    from open_r1.tasks.counting.evaluate import generate_batch

    try:
        texts, _, _ = generate_batch(model, processor, [image or _probe_image()], [question])
    except Exception as exc:  # noqa: BLE001
        report.problems.append(f"generation failed: {type(exc).__name__}: {exc}")
        return report
    report.sample_completion = texts[0]
    if protocol.extract_answer(texts[0]) is None:
        message = f"the sample completion has no parseable <answer>N</answer>: {texts[0][:120]!r}"
        (report.problems if strict_answer else report.warnings).append(message)
    return report


def _check_weights(path: str) -> list[str]:
    """Every safetensors file present, with a readable header and the size its header promises."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        files = sorted(set((read_json(index_path) or {}).get("weight_map", {}).values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        return ["weights are missing: no model.safetensors or model.safetensors.index.json"]
    problems = []
    for name in files:
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            problems.append(f"weights file {name} named in the index is missing")
            continue
        problem = _safetensors_problem(file_path)
        if problem:
            problems.append(f"weights file {name} is {problem}")
    return problems


def _safetensors_problem(file_path: str) -> str | None:
    size = os.path.getsize(file_path)
    try:
        with open(file_path, "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                return f"truncated or corrupt (header of {header_len} bytes, file of {size})"
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + data_end > size:
        return f"truncated: {size} bytes on disk, header promises {8 + header_len + data_end}"
    return None


def export_submission(checkpoint: str, out: str, base_model: str | None = None, min_pixels: int | None = None,
                      max_pixels: int | None = None, verify: bool = True, log=print) -> VerifyReport:
    """Merge (if LoRA), save everything into a temp dir beside `out`, verify, then move into place."""
    if not os.path.isdir(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} does not exist; train first (bash train.sh) or pass --checkpoint")
    meta = _read_meta(checkpoint)
    model, base = load_for_export(checkpoint, base_model)
    processor_source = checkpoint if os.path.isfile(os.path.join(checkpoint, "preprocessor_config.json")) else base
    processor = modeling.load_processor(
        processor_source,
        min_pixels if min_pixels is not None else meta.get("min_pixels"),
        max_pixels if max_pixels is not None else meta.get("max_pixels"),
    )
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        log(f"[export] writing merged model from {checkpoint} into {staging}")
        model.save_pretrained(staging, safe_serialization=True)
        processor.save_pretrained(staging)
        modeling.write_compat_processor_files(staging)
        model.generation_config.save_pretrained(staging)
        report = verify_submission(staging, generate=verify)
        if not report.ok:
            raise ExportError("the exported model failed verification: " + "; ".join(report.problems))
        for warning in report.warnings:
            log(f"[export] warning: {warning}")
        if os.path.exists(out):
            aside = f"{out}.prev-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(out, aside)
            log(f"[export] previous submission kept at {aside}")
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report.path = out
    log(f"[export] submission ready: {out}")
    return report


# ---- command line --------------------------------------------------------------------------------------------------

_START = time.time()  # import time of this module: the budget reserve covers the whole export process

CLI_DOC = """Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python scripts/export_submission.py --checkpoint runs/demo --out submission
    python scripts/export_submission.py --checkpoint runs/lora/checkpoint-300 --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json). The processor
keeps the training vision-token budget. The result is verified (loads with Qwen2VLForConditionalGeneration and
generates) in a temp dir beside --out before it replaces anything; a replaced submission is kept as
<out>.prev-<timestamp>.

Given a run dir, the exported checkpoint is the keep-best one (open_r1/run/keep_best.py: the best in-training OOD score
recorded in eval_history.json / best_checkpoint.json), else the final model. The export time is recorded in the run
dir (budget_timings.json) so the next round's time budget reserves the measured value.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=CLI_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="training output dir or a checkpoint-N dir")
    parser.add_argument("--out", required=True, help="submission dir to write (replaced atomically)")
    parser.add_argument("--base-model", default=None, help="base model for a LoRA adapter (default: recorded one)")
    parser.add_argument("--min-pixels", type=int, default=None)
    parser.add_argument("--max-pixels", type=int, default=None)
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    args = parser.parse_args(argv)
    from open_r1.run.keep_best import resolve_export_checkpoint

    started = _START if argv is None else time.time()
    checkpoint = resolve_export_checkpoint(args.checkpoint)
    try:
        export_submission(checkpoint, args.out, args.base_model, args.min_pixels, args.max_pixels,
                          verify=not args.no_verify_generate)
    except (ExportError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if os.path.isfile(os.path.join(args.checkpoint, "training_meta.json")):  # a run dir: feed the next budget
        from open_r1.run import record_export_seconds

        try:
            record_export_seconds(args.checkpoint, time.time() - started)
        except OSError as exc:
            print(f"warning: could not record the export time in {args.checkpoint}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
