"""Verify a model dir the way the grader loads it: files, architecture, weights, and one greedy completion under the
task's protocol (`verify_submission`). Never raises for a bad dir: it reports."""

import os
from dataclasses import dataclass, field

import torch

from open_r1 import modeling
from open_r1.checks import weights_problems
from open_r1.families import FAMILIES
from open_r1.jsonio import read_json
from open_r1.tasks import get_task

# The class the counting grader loads; other families verify as their own class (`expected_class=None`).
COUNTING_GRADER_CLASS = "Qwen2VLForConditionalGeneration"


@dataclass
class VerifyReport:
    path: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sample_completion: str | None = None
    loaded_class: str | None = None  # the transformers class the dir loaded as

    @property
    def ok(self) -> bool:
        return not self.problems


def architecture_problems(config: dict, expected_class: str | None) -> list[str]:
    """What is wrong with config.json's model_type / architectures for a grader that loads `expected_class`
    (None: any supported family, loaded as its own class)."""
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    family = FAMILIES.get(model_type or "")
    if family is None:
        needs = (
            f"the grader loads {expected_class}"
            if expected_class
            else "supported families: " + ", ".join(f"{f.model_type} ({f.class_name})" for f in FAMILIES.values())
        )
        return [
            f"wrong architecture: config.json says model_type={model_type!r}, architectures={architectures}; {needs}"
        ]
    if family.class_name not in architectures:
        return [
            f"wrong architecture: config.json says model_type={model_type!r} ({family.name}) but architectures="
            f"{architectures}, not {family.class_name}; re-save the model with save_pretrained"
        ]
    if expected_class and family.class_name != expected_class:
        return [
            f"wrong architecture for the counting submission: this is a {family.name} checkpoint "
            f"({family.class_name}); the counting grader loads {expected_class} (a Qwen2-VL model), which cannot "
            f"load it. Submit a Qwen2-VL model for counting, or check it as a {family.name} model of its own "
            "(selfcheck.py --verify --any-family / export --any-family)"
        ]
    return []


def verify_submission(
    path: str,
    generate: bool = True,
    strict_answer: bool = False,
    expected_class: str | None = COUNTING_GRADER_CLASS,
    task: str = "counting",
) -> VerifyReport:
    """Check a model dir the way the grader loads it (as `expected_class`; None: as its own family's class); with
    `generate`, load it and write one greedy completion under `task`'s protocol (its `probe`): output off the format
    is a warning, or a problem with `strict_answer`. Never raises for a bad dir: it reports."""
    if not os.path.isdir(path):
        return VerifyReport(path, [f"{path} does not exist"])
    adapter = os.path.isfile(os.path.join(path, "adapter_config.json"))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return VerifyReport(
            path,
            [
                f"{path} is a LoRA adapter (adapter_config.json, no config.json), not a full model; "
                f"merge it with python -m open_r1.submission.export --checkpoint {path} --out <dir>"
                if adapter
                else "config.json is missing: not a saved transformers model"
            ],
        )
    report = VerifyReport(path, architecture_problems(read_json(os.path.join(path, "config.json")), expected_class))
    if adapter:
        report.problems.append("adapter_config.json present: a LoRA adapter must be merged into full weights")
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        report.problems.append("processor file preprocessor_config.json is missing: save the processor too")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(path, name)):
            report.problems.append(f"tokenizer file {name} is missing: save the tokenizer (processor.save_pretrained)")
    templates = [n for n in ("chat_template.jinja", "chat_template.json") if os.path.isfile(os.path.join(path, n))]
    if not templates and "chat_template" not in (read_json(os.path.join(path, "tokenizer_config.json"), None) or {}):
        report.problems.append("chat template is missing (chat_template.jinja): the prompt cannot be built")
    if not os.path.isfile(os.path.join(path, "generation_config.json")):
        report.warnings.append("generation_config.json is missing: eos ids fall back to config.json")
    report.problems.extend(weights_problems(path))
    if report.problems or not generate:
        return report
    probe = get_task(task).probe  # an unknown task fails here, before the model loads
    step = "loading"
    try:
        model = modeling.load_model(path, dtype="auto", attn_implementation="sdpa")
        report.loaded_class = type(model).__name__
        if torch.cuda.is_available():  # a 2B model generates 256 tokens in seconds on a GPU, minutes on a CPU
            model = model.to("cuda")
        processor = modeling.load_processor(path)
        step = "generation"
        text, message = probe(model, processor)
    except Exception as exc:  # noqa: BLE001 - every load or generation failure is a finding
        report.problems.append(f"{step} failed: {type(exc).__name__}: {exc}")
        return report
    report.sample_completion = text
    if message:
        (report.problems if strict_answer else report.warnings).append(message)
    return report
