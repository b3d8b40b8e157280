"""Stage 5: best-of-N evaluation of the base, SFT and GRPO policies on held-out cartoons.

For every policy (``base``: ``models.policy``; ``sft``; ``grpo_s<seed>``) and split (``eval.splits``),
``evaluate.evaluate_policy`` samples N completions per cartoon under the protocol prompt, parses them strictly and
scores the captions with the reward model (and the stand-in's hidden oracle where the demo gives one: analysis
only); ``evaluate.evaluate_records`` gives the metrics and, against ``baseline``, paired bootstrap CIs over cartoons;
``grpo_checks`` the per-seed GRPO-vs-SFT verdicts. Deviations from the seed: one prompt for every stage; fail-as-zero
on the sigmoid scale; comparisons paired over cartoons.
"""
from __future__ import annotations

import dataclasses
import os
import time

from open_r1 import modeling
from open_r1.decoding import DECODER_CHOICES
from open_r1.jsonio import write_json
from open_r1.reward_model import load_reward_model
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import evaluate as ev
from open_r1.tasks.captioning.config import help_field, require

NAME = "eval"


@dataclasses.dataclass
class Config:
    policies: dict | None = help_field(None, "{name: model dir} to evaluate (null: the chain's base, sft and "
                                       "grpo_s<seed> models)")
    splits: list[str] = help_field(["test"], "held-out splits")
    n: int = help_field(8, "samples per cartoon")
    max_new_tokens: int = help_field(1024, "token budget of a sample")
    temperature: float = help_field(1.0, "sampling temperature")
    top_p: float | None = help_field(None, "nucleus cut (null: the policy's generation config)")
    top_k: int | None = help_field(None, "top-k cut (null: the policy's generation config)")
    batch_size: int = help_field(64, "samples per generate call")
    limit: int | None = help_field(None, "the first N cartoons of a split (null: all)")
    use_stop: bool = help_field(False, "stop at </caption>")
    decoder: str | None = help_field(None, "open_r1.generation decoder (null: its default; hf for small models)")
    baseline: str = help_field("sft", "the policy the others are compared to, paired by cartoon")
    n_boot: int = help_field(2000, "bootstrap resamples of the CIs")

    def __post_init__(self):

        require(self.decoder in (None, *DECODER_CHOICES), f"eval.decoder must be one of {', '.join(DECODER_CHOICES)} "
                f"or null, got {self.decoder!r}")
        require(self.top_p is None or 0 < self.top_p <= 1, f"eval.top_p must be in (0, 1], got {self.top_p!r}")
        config.at_least(NAME, self, 1, "n", "max_new_tokens", "batch_size", "n_boot", "limit")
        config.at_least(NAME, self, 0, "top_k", "temperature")
        require(self.policies is None or all(isinstance(v, str) and v for v in self.policies.values()),
                f"eval.policies must map names to model dirs, e.g. {{sft: runs/x/models/policy-sft}}, got "
                f"{self.policies!r}")


def policies(recipe) -> dict[str, str]:
    """{name: model dir}: ``eval.policies``, else the chain's base, SFT and GRPO policies."""
    cfg, paths = recipe.section(NAME), recipe.paths
    if cfg.policies:
        return dict(cfg.policies)
    seeds = recipe.section("grpo").settings.seeds
    return {"base": paths.policy_base, "sft": paths.policy_sft, **{f"grpo_s{s}": paths.grpo_model(s) for s in seeds}}


def sampling_kwargs(recipe) -> dict:
    """`evaluate.evaluate_policy`'s sampling settings from the ``eval`` section (the ratings round's too)."""
    cfg = recipe.section(NAME)
    return dict(n=cfg.n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, batch_size=cfg.batch_size,
                seed=recipe.seed, max_cartoons=cfg.limit, use_stop=cfg.use_stop, decoder=cfg.decoder,
                top_p=cfg.top_p, top_k=cfg.top_k)


def check(recipe) -> None:
    """The baseline is one of the evaluated policies (where an sft policy is)."""
    names, baseline = list(policies(recipe)), recipe.section(NAME).baseline
    require("sft" not in names or baseline in names, f"eval.baseline {baseline!r} is not one of the evaluated "
            f"policies {', '.join(names)}")


def inputs(recipe) -> dict[str, config.Input]:
    out = {"rm": config.Input(recipe.paths.rm, "the reward model", "run the rm stage", config.RM_MARKER)}
    for name, path in policies(recipe).items():
        out[f"policy {name}"] = config.Input(path, f"the policy {name!r}", "set eval.policies to existing model dirs")
    for split in recipe.section(NAME).splits:
        out[split] = config.split_input(recipe.paths, split)
    return out


def run(recipe) -> dict:
    import torch  # deferred: heavy


    cfg, paths = recipe.section(NAME), recipe.paths
    device = config.device()
    check(recipe)
    found = config.check_inputs(inputs(recipe))
    rm = load_reward_model(found["rm"], device=device)
    named = policies(recipe)
    data = {s: cdata.load_captions(paths.split(s), check_images="none") for s in cfg.splits}
    records: dict[str, dict[str, list]] = {s: {} for s in cfg.splits}
    timings = {}
    for name, path in named.items():
        started = time.time()
        model = modeling.load_model(path, dtype=None if device == "cuda" else "float32").to(device).eval()
        processor = modeling.load_processor(path)
        for split in cfg.splits:
            with torch.no_grad():
                records[split][name] = ev.evaluate_policy(model, processor, data[split], rm,
                                                          oracle=getattr(recipe, "oracle", None),
                                                          **sampling_kwargs(recipe))
        timings[name] = time.time() - started
        config.log(f"[eval] {name}: {sum(len(records[s][name]) for s in cfg.splits)} samples in {timings[name]:.1f} s")
        del model
    baseline = cfg.baseline if "sft" in named else None
    summary = {"policies": named, "splits": {}, "timings": timings}
    for split in cfg.splits:
        report = ev.evaluate_records(records[split], baseline=baseline, n_boot=cfg.n_boot,
                                     seed=recipe.seed)
        out = ev.write_report(report, os.path.join(paths.results, f"eval_{split}"), records[split])
        config.log(f"[eval] {split}:\n{ev.markdown_table(report)}")
        summary["splits"][split] = {"report_files": out, "table": ev.markdown_table(report),
                                    "metrics": {n: {k: v for k, v in m.items() if k != "per_cartoon"}
                                                for n, m in report["policies"].items()},
                                    "vs_baseline": report["comparisons"]}
    summary["must_show_grpo"] = grpo_checks(summary)
    write_json(os.path.join(paths.results, "eval_summary.json"), summary)
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


def markdown(ev: dict) -> list[str]:
    """GRPO vs the SFT start per seed and split (paired over cartoons), then the best-of-N table of each split."""
    def fmt(x):
        return "–" if x is None else f"{x:.3f}"

    def with_ci(value, ci):
        return f"{fmt(value)} [{fmt((ci or {}).get('lo'))}, {fmt((ci or {}).get('hi'))}]"

    def yes(flag):
        return "yes" if flag else "no"

    lines = []
    if ev.get("must_show_grpo"):
        lines += ["", "## GRPO vs the SFT start (paired over cartoons; point estimate [95 % CI])", "",
                  "| run | split | Δ fail-as-zero σ(RM) | Δ oracle (emitted) | Δ oracle (fail = worst) | Δ oracle (RM pick) "
                  "| both up, oracle emitted (points / CIs) | both up, fail = worst (points / CIs) |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, per_split in ev["must_show_grpo"].items():
            for split, c in per_split.items():
                lines.append(f"| {name} | {split} | {with_ci(c['d_fail_as_zero'], c.get('fail_as_zero_ci'))} | "
                             f"{with_ci(c['d_oracle_emitted'], c.get('oracle_emitted_ci'))} | "
                             f"{with_ci(c.get('d_oracle_fail_as_worst'), c.get('oracle_fail_as_worst_ci'))} | "
                             f"{fmt(c['d_oracle_pick'])} | {yes(c['both_up'])} / {yes(c.get('both_up_ci'))} | "
                             f"{yes(c.get('both_up_worst'))} / {yes(c.get('both_up_worst_ci'))} |")
    for split, block in (ev.get("splits") or {}).items():
        lines += ["", f"## Best-of-N, split {split}", "", block["table"]]
    return lines
