"""Stand-in stage ``data``: generate the offline caption-contest data, and the pre-training exposure images.

``cartoons.write_standin`` renders ``contests`` CLEVR-like cartoons (split train/val/test by contest) and
``ood_contests`` OOD-renderer cartoons (split ``ood``), each with ``captions`` candidates scored by the hidden rule and
rated by simulated voters (``cartoons``' docstring). ``pretrain_ood_contests`` / ``pretrain_main_contests`` render
further scenes of each renderer (indices disjoint from every contest) into ``ood_pretrain`` / ``main_pretrain``: the
bases' pre-training sees those images in describe/question rows only, as real bases have seen all kinds of images.
On the real data this stage does not exist: ``open-r1-caption-prepare`` writes the data dir.
"""

import dataclasses
import logging
import os

from open_r1.jsonio import read_json
from open_r1.tasks.captioning.config import help_field
from standin.captioning import cartoons

logger = logging.getLogger(__name__)

NAME = "data"


@dataclasses.dataclass
class Config(cartoons.StandinConfig):
    """`cartoons.StandinConfig`, its seed the recipe's unless set."""

    seed: int | None = help_field(None, "the generator's seed (null: the recipe's)")


def inputs(*_) -> dict:
    return {}


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.split(name) for name in cfg.splits()]


def run(cfg: Config, paths, seed) -> dict:
    marker = os.path.join(paths.data, "standin.json")
    if os.path.isfile(marker) and not cfg.overwrite:
        logger.info(f"[data] {paths.data} already holds the stand-in; reusing it")
        return read_json(marker)
    cartoons.write_standin(
        paths.data, dataclasses.replace(cfg, seed=seed if cfg.seed is None else cfg.seed, overwrite=True)
    )
    info = read_json(marker)
    logger.info(f"[data] wrote {paths.data}: {info['splits']}")
    return info
