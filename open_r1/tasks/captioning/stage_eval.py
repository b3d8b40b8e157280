"""Stage 5: best-of-N evaluation of the base, SFT and GRPO policies on held-out cartoons.

For every policy and split, ``evaluate.evaluate_policy`` samples N completions per cartoon, parses them strictly and
scores the captions with the reward model; ``evaluate.evaluate_records`` gives the metrics and paired bootstrap CIs
over cartoons against ``baseline`` (`run`'s ``measure``: the stand-in adds its own analysis).
"""

import dataclasses
import logging
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

logger = logging.getLogger(__name__)

NAME = "eval"
TAKES = ("grpo.settings.seeds",)  # the default policies: one GRPO model per seed


@dataclasses.dataclass
class Config:
    policies: dict | None = help_field(
        None, "{name: model dir} to evaluate (null: the chain's base, sft and grpo_s<seed> models)"
    )
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
        require(
            self.decoder in (None, *DECODER_CHOICES),
            f"eval.decoder must be one of {', '.join(DECODER_CHOICES)} or null, got {self.decoder!r}",
        )
        require(self.top_p is None or 0 < self.top_p <= 1, f"eval.top_p must be in (0, 1], got {self.top_p!r}")
        config.at_least(NAME, self, 1, "n", "max_new_tokens", "batch_size", "n_boot", "limit")
        config.at_least(NAME, self, 0, "top_k", "temperature")
        require(
            self.policies is None or all(isinstance(v, str) and v for v in self.policies.values()),
            f"eval.policies must map names to model dirs, e.g. {{sft: runs/x/models/policy-sft}}, got "
            f"{self.policies!r}",
        )


def policies(cfg, paths, grpo_seeds) -> dict[str, str]:
    """{name: model dir}: ``eval.policies``, else the chain's base, SFT and GRPO policies."""
    if cfg.policies:
        return dict(cfg.policies)
    return {
        "base": paths.policy_base,
        "sft": paths.policy_sft,
        **{f"grpo_s{s}": paths.grpo_model(s) for s in grpo_seeds},
    }


def sampling_kwargs(cfg, seed) -> dict:
    """`evaluate.evaluate_policy`'s sampling settings from the ``eval`` section (the ratings round's too)."""
    names = ("n", "max_new_tokens", "temperature", "batch_size", "use_stop", "decoder", "top_p", "top_k")
    return {**{name: getattr(cfg, name) for name in names}, "seed": seed, "max_cartoons": cfg.limit}


def check(cfg, paths, seed, grpo_seeds) -> None:
    """The baseline is one of the evaluated policies (where an sft policy is)."""
    names = policies(cfg, paths, grpo_seeds)
    require(
        "sft" not in names or cfg.baseline in names,
        f"eval.baseline {cfg.baseline!r} is not one of the evaluated policies {', '.join(names)}",
    )


def inputs(cfg, paths, seed, grpo_seeds) -> dict[str, config.Input]:
    out = {"rm": config.Input(paths.rm, "the reward model", "run the rm stage", config.RM_MARKER)}
    for name, path in policies(cfg, paths, grpo_seeds).items():
        out[f"policy {name}"] = config.Input(path, f"the policy {name!r}", "set eval.policies to existing model dirs")
    for split in cfg.splits:
        out[split] = config.split_input(paths, split)
    return out


def run(cfg: Config, paths, seed, grpo_seeds, measure=ev) -> dict:
    """Best-of-N on every split; `measure`: ``evaluate_records`` and ``markdown_table`` (default `evaluate`'s), and
    where it has them ``score(records, dataset)`` of each policy's records and ``extend_summary(summary)`` (the
    stand-in's hidden-rule analysis: standin/captioning/stage_eval.py)."""
    import torch  # deferred: heavy

    device = config.device()
    check(cfg, paths, seed, grpo_seeds)
    found = config.check_inputs(inputs(cfg, paths, seed, grpo_seeds))
    rm = load_reward_model(found["rm"], device=device)
    named, score = policies(cfg, paths, grpo_seeds), getattr(measure, "score", None)
    data = {s: cdata.load_captions(paths.split(s), check_images="none") for s in cfg.splits}
    records = {s: {} for s in cfg.splits}
    timings = {}
    for name, path in named.items():
        started = time.time()
        model = modeling.load_model(path).to(device).eval()
        processor = modeling.load_processor(path)
        for split in cfg.splits:
            with torch.no_grad():
                records[split][name] = ev.evaluate_policy(
                    model, processor, data[split], rm, **sampling_kwargs(cfg, seed)
                )
            if score is not None:
                score(records[split][name], data[split])
        timings[name] = time.time() - started
        logger.info(f"[eval] {name}: {sum(len(records[s][name]) for s in cfg.splits)} samples in {timings[name]:.1f} s")
        del model
    baseline = cfg.baseline if "sft" in named else None
    summary = {"policies": named, "splits": {}, "timings": timings}
    for split in cfg.splits:
        report = measure.evaluate_records(records[split], baseline=baseline, n_boot=cfg.n_boot, seed=seed)
        table = measure.markdown_table(report)
        out = ev.write_report(report, os.path.join(paths.results, f"eval_{split}"), records[split], table)
        logger.info(f"[eval] {split}:\n{table}")
        summary["splits"][split] = {
            "report_files": out,
            "table": table,
            "metrics": {n: {k: v for k, v in m.items() if k != "per_cartoon"} for n, m in report["policies"].items()},
            "vs_baseline": report["comparisons"],
        }
    if hasattr(measure, "extend_summary"):
        measure.extend_summary(summary)
    write_json(os.path.join(paths.results, "eval_summary.json"), summary)
    return summary


def markdown(ev: dict) -> list[str]:
    """The stand-in's GRPO-vs-SFT table where it added one, then the best-of-N table of each split."""
    lines = list(ev.get("extra_markdown") or [])
    for split, block in (ev.get("splits") or {}).items():
        lines += ["", f"## Best-of-N, split {split}", "", block["table"]]
    return lines
