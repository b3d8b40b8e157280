"""Build the captioning demo's start policy (``standin/captioning/start_policy``), as the counting demo ships its own.

The demo's own pre-training (2 steps from random init) never writes the format; this start does. It is trained with
the chain's own stages on the demo's data (same recipe and seed; test and OOD cartoons stay unseen): ``stage_data``
plus exposure scenes, a Qwen3-VL-Thinking stand-in with the small tiny-BPE vocabulary (``build_model``: the shipped
dir stays a few MB), ``stage_pretrain.pretrain_one`` from it, then the eval stage's sampler on every test and OOD
cartoon: format and truncation rates, with the command and CPU time, in ``start_report.json``. No SFT on top: 50 LoRA
steps on the templated ``first_sentence`` traces dropped its format rate at the demo's sampling from 0.62 / 0.69
(test / OOD) to 0.06 / 0.12 (the samples derail inside the trace); the demo's own SFT stage trains from this start.

    python -m standin.captioning.build_start --out standin/captioning/start_policy      # make humor-demo-start
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from open_r1 import modeling
from open_r1 import tiny_models as tm
from open_r1.errors import cli_parser, setup_logging
from open_r1.jsonio import write_json
from open_r1.submission.install import installing
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import evaluate, pipeline, stage_eval
from standin.captioning import demo, stage_data, stage_pretrain

RECIPE = "configs/captioning/standin_demo.yaml"
# The demo recipe with longer training and more scenes to see; every stage reads these as the demo would.
BUILD_OVERRIDES = [
    "pretrain.policy.start=null",
    "data.pretrain_main_contests=48",
    "data.pretrain_ood_contests=48",
    "pretrain.policy.per_contest=4",
    "pretrain.policy.exposure_kinds=[describe, question, fluency]",
    "pretrain.policy.exposure_per_contest=2",
    "pretrain.policy.max_steps=120",
    "pretrain.policy.batch_size=8",
    "pretrain.policy.learning_rate=3.0e-3",
    "pretrain.policy.logging_steps=20",
    "pretrain.policy.probe_limit=8",
]
# Qwen3-VL classes at a size that trains in minutes on 2 CPU cores (the text decoder twice the tiny model's width).
MODEL = {
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
}


def build_model(out_dir: str, seed: int, min_pixels: int, max_pixels: int) -> str:
    """A random-init Qwen3-VL-Thinking stand-in with the small vocabulary, saved at ``out_dir``."""
    model, processor = tm.small_vocab_model("qwen3_vl", seed, (min_pixels, max_pixels), 262144, **MODEL)
    return modeling.save_model_dir(model, processor, out_dir)


def format_check(recipe, model_dir: str, n: int) -> dict:
    """The eval stage's sampling (the recipe's eval section, n samples) on every test and OOD cartoon, no RM."""
    kwargs = {
        **stage_eval.sampling_kwargs(recipe.section("eval"), recipe.seed),
        "n": n,
        "max_cartoons": None,
        "decoder": "hf",
    }
    model = modeling.load_model(model_dir, dtype="float32").eval()
    processor = modeling.load_processor(model_dir)
    out = {}
    for split in recipe.section("eval").splits:
        rows = cdata.load_captions(recipe.paths.split(split), check_images="none")
        with torch.no_grad():
            records = evaluate.evaluate_policy(model, processor, rows, None, **kwargs)
        metrics = evaluate.policy_metrics(records)
        out[split] = {
            k: metrics[k]
            for k in ("samples", "format_rate", "truncated_rate", "format_failures", "example_completions")
        }
    return {"sampling": {k: v for k, v in kwargs.items() if k != "decoder"}, "splits": out}


def build(out: str, work: str, seed: int, eval_n: int, argv: list[str], sets: list[str] = ()) -> dict:
    started, cpu_started = time.time(), time.process_time()
    overrides = [f"work_dir={work}", f"seed={seed}", "data.overwrite=true", *BUILD_OVERRIDES, *sets]
    recipe = demo.load_recipe(RECIPE, overrides)  # every section parsed and checked, as the demo does
    pipeline.preflight(recipe, demo.stages_of(RECIPE), [stage_data.NAME, stage_pretrain.NAME])
    paths, policy = recipe.paths, recipe.section(stage_pretrain.NAME).policy
    stage_data.run(*recipe.args(stage_data))
    init = build_model(os.path.join(paths.models, "policy-init"), seed, policy.min_pixels, policy.max_pixels)
    pretrain = stage_pretrain.pretrain_one(*recipe.args(stage_pretrain), "policy", init=init)
    formats = format_check(recipe, paths.policy_base, eval_n)  # before the clock stops
    info = {
        "command": "python -m standin.captioning.build_start " + " ".join(argv),
        "recipe": RECIPE,
        "overrides": BUILD_OVERRIDES,
        "seed": seed,
        "model": MODEL,
        "torch_threads": torch.get_num_threads(),
        "wall_seconds": round(time.time() - started),
        "cpu_seconds": round(time.process_time() - cpu_started),
        "pretrain": {k: pretrain.get(k) for k in ("rows", "steps", "loss_first", "loss_last")},
        "format": formats,
    }
    with installing(out) as staging:
        shutil.copytree(paths.policy_base, staging, dirs_exist_ok=True)
        for name in ("sft_report.json", "training_meta.json"):  # run records with this machine's paths
            Path(staging, name).unlink(missing_ok=True)
        write_json(os.path.join(staging, "start_report.json"), info)
    return info


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    parser = cli_parser("python -m standin.captioning.build_start", __doc__.split("\n")[0])
    parser.add_argument("--out", default="standin/captioning/start_policy", help="the start policy dir (replaced)")
    parser.add_argument("--work", default="runs/humor-demo-start", help="the build's work_dir (data, models)")
    parser.add_argument("--seed", type=int, default=0, help="the recipe's seed: data, init and training")
    parser.add_argument("--eval-n", type=int, default=8, help="samples per test / OOD cartoon in the format check")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override after the builder's own (e.g. pretrain.policy.max_steps=2 for a try)",
    )
    args = parser.parse_args(argv)
    info = build(args.out, args.work, args.seed, args.eval_n, argv, args.set)
    print(json.dumps({k: info[k] for k in ("wall_seconds", "cpu_seconds", "pretrain")}))
    for split, entry in info["format"]["splits"].items():
        print(
            f"{split}: format {entry['format_rate']:.2f}, truncated {entry['truncated_rate']:.2f} "
            f"({entry['samples']} samples) {entry['format_failures']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
