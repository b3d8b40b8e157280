"""Does the wording of the stand-in's templated thinking break the SFT policy's format?

Question: in run 7 the SFT policy wrote the format in 33 % of its test samples (the base: 96.5 %); the commonest
failure was no `</think>`, and failed samples open a caption inside the thinking (`... Aost caption>Relax, ...`).
The templated trace says "A good caption points at ...": the stand-in's tokenizer splits `caption` into the same
sub-words as the `<caption>` tag, which follows them twice in every target, so a weak policy sampling at T 0.7 may
continue the trace's word with the tag's `>`. This probe trains the SFT stage on the same rows with each trace
wording (`--variants`: `recipe`, `no_tag_word` ("caption" -> "joke"), `first_sentence` (what is odd, the odd
object's phrase once); the recipe's settings, one variant after the other) and samples every SFT policy on the held-out
splits as the eval stage does (no RM: format, failures, the oracle of emitted captions).

Needs a work dir with the data, the pre-trained policy and the top-k traces (`--stages data pretrain synthesize`).

    python -m experiments.captioning.sft_format_probe --config configs/captioning/standin_h200.yaml --out probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def thinking_without_the_tag_word(row: dict) -> str:
    """`standin.templated_thinking` with "caption" replaced by "joke" (the same facts, no shared sub-words)."""
    from standin.captioning import cartoons as standin

    return standin.templated_thinking(row, wording="joke")  # the recipe's synthesize.trace_wording: joke


def thinking_first_sentence(row: dict) -> str:
    """Only the template's first sentence (what is odd): half the tokens, and the odd object's phrase once."""
    from standin.captioning import cartoons as standin

    return standin.templated_thinking(row, template="first_sentence")  # synthesize.trace_template: first_sentence


VARIANTS = {"recipe": None, "no_tag_word": thinking_without_the_tag_word, "first_sentence": thinking_first_sentence}


def summarize(records: list[dict]) -> dict:
    from collections import Counter

    n = len(records)
    parsed = [r for r in records if r["caption"] is not None]
    oracle = [r["oracle"] for r in parsed if r.get("oracle") is not None]
    failures = Counter(r["parse_reason"] for r in records if r["caption"] is None)
    return {"samples": n, "format_rate": len(parsed) / n if n else None,
            "truncated_rate": sum(r["truncated"] for r in records) / n if n else None,
            "oracle_emitted": sum(oracle) / len(oracle) if oracle else None,
            "failures": dict(failures.most_common()),
            "examples_failed": [r["completion"][:300] for r in records if r["caption"] is None][:3]}


def main(argv=None) -> int:
    import datasets
    import torch

    from open_r1 import modeling
    from open_r1.errors import OpenR1Error
    from open_r1.jsonio import write_json
    from open_r1.tasks.captioning import config as common
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate as ev
    from open_r1.tasks.captioning import stage_eval
    from standin.captioning import demo

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.sft_format_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--variants", nargs="+", default=["recipe", "no_tag_word"], choices=list(VARIANTS))
    parser.add_argument("--reuse", action="store_true", help="skip the SFT of a variant whose model dir exists")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        paths = recipe.paths
        top_path = paths.traces
        top = datasets.load_from_disk(top_path)
        ecfg = recipe.section("eval")
        splits = list(ecfg.splits)
        data = {s: cdata.load_captions(paths.split(s), check_images="none") for s in splits}
    except (OpenR1Error, FileNotFoundError) as exc:
        print(f"error: {exc} (run --stages data pretrain synthesize first)", file=sys.stderr)
        return 2
    outs, started = {}, time.time()
    for name in args.variants:
        work = os.path.join(paths.root, f"probe-sft-{name}")  # the variant's own work_dir: its traces, its SFT model
        out = outs[name] = os.path.join(work, "models", "policy-sft")
        if args.reuse and os.path.isfile(os.path.join(out, "config.json")):
            common.log(f"[probe] SFT {name}: reusing {out}")
            continue
        traces = top_path  # the recipe's traces as synthesize wrote them; a variant rewrites only the thinking
        if VARIANTS[name] is not None:
            traces = os.path.join(work, "traces", "train_top_k")
            table = top.select_columns([c for c in top.column_names if c != "image"])
            top.remove_columns([cdata.THINKING_COLUMN]).add_column(
                cdata.THINKING_COLUMN, [VARIANTS[name](r) for r in table]).save_to_disk(traces)
        elif not os.path.isdir(os.path.join(work, "traces", "train_top_k")):
            shutil.copytree(top_path, os.path.join(work, "traces", "train_top_k"))
        command = [sys.executable, "-m", "standin.captioning.demo", "--config", args.config, "--stages", "sft", *sum(
            (["--set", s] for s in args.set), []), "--set", f"work_dir={work}", "--set", f"data_dir={paths.data}",
                   "--set", f"models.policy={paths.policy_base}"]
        common.log(f"[probe] SFT {name}: {' '.join(command[1:])}")
        # one after the other: two SFT processes on one H200 ran ~5x slower each (run 7), so sft.max_seconds cut them
        with open(os.path.join(paths.root, f"probe_sft_{name}.log"), "w") as log:
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                print(f"error: SFT of variant {name} failed; see {log.name}", file=sys.stderr)
                return 2
        common.log(f"[probe] SFT {name} done at {time.time() - started:.0f} s")
    results: dict = {"variants": {}, "eval": {k: getattr(ecfg, k) for k in ("n", "temperature", "max_new_tokens", "limit")}}
    device = common.device()
    for name, out in outs.items():
        model = modeling.load_model(out, dtype=None if device == "cuda" else "float32").to(device).eval()
        processor = modeling.load_processor(out)
        entry = {}
        for split in splits:
            with torch.no_grad():
                records = ev.evaluate_policy(model, processor, data[split], None,
                                             **stage_eval.sampling_kwargs(recipe))
            entry[split] = summarize(records)
            common.log(f"[probe] {name} {split}: format {entry[split]['format_rate']:.3f}, oracle emitted "
                       f"{entry[split]['oracle_emitted']}, failures {entry[split]['failures']}")
        results["variants"][name] = entry
        del model
        if args.out:  # after each variant: a cut run keeps what it measured
            write_json(args.out, results)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
