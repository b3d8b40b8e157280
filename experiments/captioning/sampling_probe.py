"""Are the SFT policy's format failures the policy's or the sampler's?

Question: the stand-in's SFT policy writes the format in 5-30 % of its test samples (runs 7-16) while its training
targets are templated and its token accuracy on them ends near 0.95; the failed samples derail inside the thinking
right after the odd object's phrase, the one image-dependent span of the trace. If greedy decoding (or a lower
temperature) writes the format far more often than T 0.7 does, the SFT has learned the format and the failures come
from sampling through uncertain tokens; if greedy fails as often, the SFT itself has not learned it. The probe also
compares the eval stage's sampler (the policy's generation config: top_k 20, top_p 0.95) with GRPO's rollouts'
(TRL's top_k 0, top_p 1.0) at the same temperature (run 16 in experiments/captioning/LOG.md).

Each setting samples the policy on the held-out splits as the eval stage does (``stage_eval.sampling_kwargs`` of the
recipe, then the setting's temperature / top_k / top_p; ``greedy``: one greedy completion per cartoon), no RM:
format rate, truncation, failures by parse reason and the oracle of the emitted captions. Needs a work dir with the
data and the policy (``--stages data pretrain synthesize sft``).

    python -m experiments.captioning.sampling_probe --config configs/captioning/standin_h200.yaml \\
        --settings eval greedy t0.3 rollout --out sampling.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from experiments.captioning.sft_format_probe import summarize  # the same per-setting summary

# name -> overrides of the eval stage's sampling kwargs (stage_eval.sampling_kwargs)
SETTINGS = {
    "eval": {},                                            # the recipe's eval sampling, unchanged
    "greedy": {"do_sample": False, "n": 1},
    "t0.3": {"temperature": 0.3},
    "t1.0": {"temperature": 1.0},
    "rollout": {"top_k": 0, "top_p": 1.0},                # GRPO's rollouts: TRL's sampler at the eval temperature
}


def table(results: dict) -> str:
    lines = ["| policy | setting | split | samples | format % | truncated % | oracle emitted | commonest failure |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for policy, by_setting in results["policies"].items():
        for setting, by_split in by_setting.items():
            for split, s in by_split.items():
                top = next(iter(s["failures"].items()), None)
                oracle = "" if s["oracle_emitted"] is None else f"{s['oracle_emitted']:+.3f}"
                lines.append(f"| {policy} | {setting} | {split} | {s['samples']} | {100 * s['format_rate']:.1f} | "
                             f"{100 * s['truncated_rate']:.1f} | {oracle} | "
                             f"{'' if top is None else f'{top[0]} ({top[1]})'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import torch

    from open_r1 import modeling
    from open_r1.errors import OpenR1Error
    from open_r1.jsonio import write_json
    from open_r1.tasks.captioning import config as common
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate as ev
    from open_r1.tasks.captioning import stage_eval
    from standin.captioning import demo

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.sampling_probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--policies", nargs="+", default=["sft"], choices=["base", "sft"],
                        help="the work dir's pre-trained base and / or SFT policy")
    parser.add_argument("--settings", nargs="+", default=["eval", "greedy", "rollout"], choices=list(SETTINGS))
    parser.add_argument("--out", default=None, help="JSON file, written after each setting")
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        paths = recipe.paths
        base = stage_eval.sampling_kwargs(recipe)
        splits = list(recipe.section("eval").splits)
        dirs = {"base": paths.policy_base, "sft": paths.policy_sft}
        for name in args.policies:
            if not os.path.isfile(os.path.join(dirs[name], "config.json")):
                raise OpenR1Error(f"no {name} policy at {dirs[name]}: run the pipeline's --stages data pretrain "
                                  f"synthesize sft on this recipe first")
        data = {s: cdata.load_captions(paths.split(s), check_images="none") for s in splits}
    except (OpenR1Error, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results: dict = {"eval": {k: base[k] for k in ("n", "temperature", "top_k", "top_p", "max_new_tokens",
                                                   "max_cartoons")},
                     "settings": {s: SETTINGS[s] for s in args.settings}, "policies": {}}
    device, started = common.device(), time.time()
    for name in args.policies:
        model = modeling.load_model(dirs[name], dtype=None if device == "cuda" else "float32").to(device).eval()
        processor = modeling.load_processor(dirs[name])
        by_setting = results["policies"].setdefault(name, {})
        for setting in args.settings:
            kwargs = {**base, **SETTINGS[setting]}
            entry = by_setting[setting] = {}
            for split in splits:
                with torch.no_grad():
                    records = ev.evaluate_policy(model, processor, data[split], None, **kwargs)
                entry[split] = summarize(records)
                common.log(f"[probe] {name} {setting} {split}: format {entry[split]['format_rate']:.3f}, "
                           f"failures {entry[split]['failures']} ({time.time() - started:.0f} s)")
            if args.out:  # after each setting: a cut run keeps what it measured
                write_json(args.out, results)
        del model
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
