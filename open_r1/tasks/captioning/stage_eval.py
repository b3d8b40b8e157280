"""Stage 5: best-of-N evaluation of the base, SFT and GRPO policies on the held-out and OOD cartoons.

Algorithm: for every policy (``base``: the stand-in's pre-trained policy or the real base; ``sft``; ``grpo_s<S>`` for
each GRPO seed) and every split in ``eval.splits`` (test = held-out contests of the training renderer, ood = the OOD
renderer), ``evaluate.evaluate_policy`` samples N completions per cartoon under the one protocol prompt (T=1,
``max_new_tokens``), parses them strictly and scores the captions with the reward model (and, on the stand-in, the
hidden oracle: analysis only). ``evaluate.evaluate_records`` gives per policy the format rate, truncation rate, mean
sigma(RM) over emitted captions, the fail-as-zero sigma(RM) mean, BoN@{1,2,4,8}, the oracle of emitted captions, of
all samples with a failure as the cartoon's worst candidate, and of the RM's pick, and, against the SFT start
(``baseline``), paired bootstrap CIs over cartoons and the reward-hacking flag (RM up while the oracle of the picks
goes down). ``write_report`` writes ``bon_eval.md`` / JSON / PNG per split; ``summary.json`` collects the per-seed
GRPO-vs-SFT differences the issue's Must-show asks for.

Deviations from the seed: one prompt for every stage (the seed's eval used another system prompt); the fail-as-zero
mean is on the sigmoid scale (the seed's on raw BT scores rewarded failing); the comparison is paired over cartoons
(the seed's "+1.69 sigma" was an unpaired z over samples).

    python -m open_r1.tasks.captioning.stage_eval --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os
import time

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import stage_common as common
from open_r1.validate import is_int, is_number


def policies(recipe: dict) -> dict[str, str]:
    cfg = common.section(recipe, "eval")
    paths = common.Paths(recipe)
    if cfg.get("policies"):
        named = cfg["policies"]
        if not isinstance(named, dict) or not all(isinstance(v, str) and v for v in named.values()):
            raise RecipeError(f"eval.policies must map names to model dirs, e.g. {{sft: runs/x/models/policy-sft}} "
                              f"(YAML needs the space after the colon), got {named!r}")
        return dict(named)
    out = {"base": paths.policy_base, "sft": paths.policy_sft}
    from open_r1.tasks.captioning.stage_grpo import grpo_seeds

    for seed in grpo_seeds(recipe):
        if os.path.isdir(paths.grpo_model(seed)):
            out[f"grpo_s{seed}"] = paths.grpo_model(seed)
    return out


def sampling_kwargs(recipe: dict) -> dict:
    """`evaluate.evaluate_policy`'s sampling settings from the recipe's ``eval`` section (the stage's and any probe's
    that samples "as the eval stage does")."""
    cfg = common.section(recipe, "eval")
    top_p, top_k = cfg.get("top_p"), cfg.get("top_k")  # None: the policy's generation config decides
    if top_p is not None and (not is_number(top_p) or not 0 < top_p <= 1):
        raise RecipeError(f"eval.top_p must be a number in (0, 1] (1.0: no nucleus cut), got {top_p!r}")
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        raise RecipeError(f"eval.top_k must be a whole number >= 0 (0: no top-k cut), got {top_k!r}")
    return dict(n=int(cfg.get("n", 8)), max_new_tokens=int(cfg.get("max_new_tokens", 1024)),
                temperature=float(cfg.get("temperature", 1.0)), batch_size=int(cfg.get("batch_size", 64)),
                seed=int(recipe["seed"]), max_cartoons=cfg.get("limit"), use_stop=bool(cfg.get("use_stop", False)),
                decoder=cfg.get("decoder"), top_p=None if top_p is None else float(top_p), top_k=top_k)


# the eval section's keys: `policies`', `sampling_kwargs`', `inputs`' and `run`'s
SECTION_KEYS = {  # (policies, top_p and top_k: checked by `policies` and `sampling_kwargs`)
    "policies": common.ANY, "reward_model": common.optional(common.TEXT), "data": common.optional(common.MAPPING),
    "splits": common.TEXTS, "n": common.whole(1), "max_new_tokens": common.whole(1), "temperature": common.number(0),
    "batch_size": common.whole(1), "limit": common.optional(common.whole(1)), "use_stop": common.BOOL,
    "decoder": common.ANY, "top_p": common.ANY, "top_k": common.ANY, "baseline": common.TEXT,
    "n_boot": common.whole(1)}


def check_recipe(recipe: dict) -> None:
    """The ``eval`` section's keys and sampling settings, before any stage runs (the pipeline's preflight)."""
    cfg = common.section(recipe, "eval")
    common.check_section("eval", cfg, SECTION_KEYS)
    common.check_decoder("eval", cfg)
    sampling_kwargs(recipe)
    if cfg.get("policies"):
        names = list(policies(recipe))
    else:  # the chain's policies (a GRPO seed's only once its model exists)
        from open_r1.tasks.captioning.stage_grpo import grpo_seeds

        names = ["base", "sft", *(f"grpo_s{seed}" for seed in grpo_seeds(recipe))]
    baseline = cfg.get("baseline", "sft")
    if "sft" in names and baseline not in names:  # (`run` compares to a baseline only where an sft policy is)
        raise RecipeError(f"eval.baseline {baseline!r} is not one of the evaluated policies {', '.join(names)}")


def inputs(recipe: dict) -> dict[str, common.Input]:
    cfg = common.section(recipe, "eval")
    paths = common.Paths(recipe)
    named = bool(cfg.get("policies"))
    makers = {"base": "pretrain", "sft": "sft"}
    out = {"rm": common.Input(cfg.get("reward_model") or paths.rm, "the reward model", "rm", "eval.reward_model",
                              common.RM_MARKER)}
    for name, path in policies(recipe).items():
        out[f"policy {name}"] = common.Input(path, f"the policy {name!r}", "" if named else makers.get(name, "grpo"),
                                             "eval.policies")
    if not isinstance(cfg.get("data"), dict):
        for split in cfg.get("splits", ["test", "ood"]):
            out[split] = common.split_input(paths, split)
    return out


def run(recipe: dict) -> dict:
    import torch

    from open_r1 import modeling
    from open_r1.reward_model import load_reward_model
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate as ev

    cfg = common.section(recipe, "eval")
    paths = common.Paths(recipe)
    device = common.device()
    found = common.check_inputs(inputs(recipe))
    rm = load_reward_model(found["rm"], device=device)
    named = policies(recipe)
    splits = list(cfg.get("splits", ["test", "ood"]))
    data = {s: cdata.load_captions(cfg.get("data", {}).get(s) if isinstance(cfg.get("data"), dict) else paths.split(s),
                                   check_images="none") for s in splits}
    records: dict[str, dict[str, list]] = {s: {} for s in splits}
    timings = {}
    for name, path in named.items():
        started = time.time()
        model = modeling.load_model(path, dtype=None if device == "cuda" else "float32").to(device).eval()
        processor = modeling.load_processor(path)
        for split in splits:
            with torch.no_grad():
                records[split][name] = ev.evaluate_policy(model, processor, data[split], rm,
                                                          **sampling_kwargs(recipe))
        timings[name] = time.time() - started
        common.log(f"[eval] {name}: {sum(len(records[s][name]) for s in splits)} samples in {timings[name]:.1f} s")
        del model
    baseline = cfg.get("baseline", "sft") if "sft" in named else None
    summary = {"policies": named, "splits": {}, "timings": timings}
    for split in splits:
        report = ev.evaluate_records(records[split], baseline=baseline, n_boot=int(cfg.get("n_boot", 2000)),
                                     seed=int(recipe["seed"]))
        out = ev.write_report(report, os.path.join(paths.results, f"eval_{split}"), records[split])
        common.log(f"[eval] {split}:\n{ev.markdown_table(report)}")
        summary["splits"][split] = {"report_files": out, "table": ev.markdown_table(report),
                                    "metrics": {n: {k: v for k, v in m.items() if k != "per_cartoon"}
                                                for n, m in report["policies"].items()},
                                    "vs_baseline": report["comparisons"]}
    summary["must_show_grpo"] = grpo_checks(summary)
    common.write_json(os.path.join(paths.results, "eval_summary.json"), summary)
    return summary


def grpo_checks(summary: dict) -> dict:
    """Per GRPO seed and split: did fail-as-zero sigma(RM) AND the oracle rise over the SFT start? Two oracle
    measures (``evaluate``'s docstring): of the emitted captions (``both_up`` / ``both_up_ci``) and over all samples
    with a failure as the cartoon's worst candidate (``both_up_worst`` / ``both_up_worst_ci``); ``_ci``: both paired
    CIs above 0, else the point estimates. The oracle of the RM's picks is reported beside them."""
    def diff(comp, key):
        return (comp.get(key) or {}).get("diff")

    def lo(comp, key):
        return (comp.get(key) or {}).get("lo")

    out = {}
    for split, block in summary["splits"].items():
        for name, comp in (block.get("vs_baseline") or {}).items():
            if not name.startswith("grpo"):
                continue
            entry = {"d_fail_as_zero": diff(comp, "fail_as_zero"), "d_oracle_emitted": diff(comp, "oracle_emitted"),
                     "d_oracle_fail_as_worst": diff(comp, "oracle_fail_as_worst"),
                     "d_oracle_pick": diff(comp, "oracle_pick"), "fail_as_zero_ci": comp.get("fail_as_zero"),
                     "oracle_emitted_ci": comp.get("oracle_emitted"),
                     "oracle_fail_as_worst_ci": comp.get("oracle_fail_as_worst"),
                     "reward_hacking": comp.get("reward_hacking")}
            for suffix, oracle in (("", "oracle_emitted"), ("_worst", "oracle_fail_as_worst")):
                entry[f"both_up{suffix}"] = bool((diff(comp, "fail_as_zero") or 0) > 0 and (diff(comp, oracle) or 0) > 0)
                entry[f"both_up{suffix}_ci"] = bool((lo(comp, "fail_as_zero") or 0) > 0 and (lo(comp, oracle) or 0) > 0)
            out.setdefault(name, {})[split] = entry
    return out


def main(argv=None) -> int:
    return common.stage_cli("eval", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
