"""Stand-in stage ``traces``: the SFT traces from the scene metadata (``cartoons.templated_thinking``), replacing the
synthesize stage's output: the tiny base cannot write explanations, so the synthesis code path runs on a few rows
(``synthesize.limit``, counts reported) and SFT trains on templated traces of every top-k row (said in the results)."""

import dataclasses
import shutil

from open_r1.tasks.captioning import config
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning.config import help_field, require
from standin.captioning import cartoons
from standin.captioning.cartoons import TRACE_TEMPLATES, TRACE_WORDINGS

NAME = "traces"
TAKES = ("sft.top_k",)  # the top-k captions SFT trains on


@dataclasses.dataclass
class Config:
    wording: str = help_field("caption", "the noun of 'A good ... points at': caption | joke")
    template: str = help_field("full", "full (what is odd, then that a good joke plays on it) | first_sentence")

    def __post_init__(self):
        require(
            self.wording in TRACE_WORDINGS,
            f"traces.wording must be one of {list(TRACE_WORDINGS)}, got {self.wording!r}",
        )
        require(
            self.template in TRACE_TEMPLATES,
            f"traces.template must be one of {list(TRACE_TEMPLATES)}, got {self.template!r}",
        )


def inputs(cfg, paths, *_) -> dict[str, config.Input]:
    return {"train": config.split_input(paths, "train")}


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.traces]


def run(cfg: Config, paths, seed, top_k) -> dict:
    train = cdata.load_captions(paths.split("train"), check_images="none")
    top = cartoons.add_templated_thinking(cdata.top_k_rows(train, top_k), cfg.wording, cfg.template)
    shutil.rmtree(paths.traces, ignore_errors=True)
    top.save_to_disk(paths.traces)
    return {"rows": len(top), "out": paths.traces, **dataclasses.asdict(cfg)}


def markdown(result: dict) -> list[str]:
    return [
        "",
        f"SFT traces: templated from the scene metadata ({result['rows']} rows, wording {result['wording']!r}, "
        f"template {result['template']!r}; the tiny base cannot write explanations).",
    ]
