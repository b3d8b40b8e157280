"""Stage 2: SFT of the base policy on the thinking traces, with LoRA, then merged into a full model dir.

``data.sft_rows``: the top-k captions of every training contest with their traces as TRL prompt-completion rows
(prompt: every stage's; completion: ``format_target(thinking, caption)``), trained by ``open_r1.sft.train_sft``
(loss on the completion; the section's defaults: LoRA r = alpha = 32 on the language model, lr 2e-4, 2 epochs).
"""

import dataclasses
import logging

from open_r1 import modeling, sft
from open_r1.sft import SFTSettings
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning import data as cdata

logger = logging.getLogger(__name__)

NAME = "sft"


@dataclasses.dataclass
class Config(SFTSettings):
    """open_r1.sft.SFTSettings (its defaults: the seed's recipe; ``seed`` is the recipe's) plus the rows' top k."""

    top_k: int = config.help_field(3, "captions per training contest (also the traces the synthesize stage writes)")
    seed: int = dataclasses.field(default=0, init=False)  # the recipe's seed, not a key of the section

    def __post_init__(self):
        self.check()
        config.require(self.top_k >= 1, f"sft.top_k must be >= 1, got {self.top_k}")


def inputs(cfg, paths, *_) -> dict[str, config.Input]:
    return {
        "model": config.Input(paths.policy_base, "the base policy", "set models.policy to a model dir"),
        "traces": config.Input(paths.traces, "the SFT traces", "run the synthesize stage", config.DATASET_MARKER),
    }


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.policy_sft]


def run(cfg: Config, paths, seed) -> dict:
    import datasets  # deferred: heavy

    found = config.check_inputs(inputs(cfg, paths))
    # text rows rendered by the base's own template: a Thinking template rewrites a conversational think block
    processor = modeling.load_processor(found["model"])
    rows = cdata.sft_rows(datasets.load_from_disk(found["traces"]), cfg.top_k, processor=processor)
    settings = SFTSettings(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(SFTSettings)})
    settings.seed = seed
    logger.info(f"[sft] {len(rows)} rows from {found['traces']}; base {found['model']}")
    report = sft.train_sft(rows, paths.policy_sft, settings, model_path=found["model"], processor=processor)
    return {**report, "out": paths.policy_sft}
