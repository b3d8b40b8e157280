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

from open_r1.errors import SceneArgumentError
from open_r1.jsonio import read_json, write_json
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning.config import help_field, require
from open_r1.tasks.counting.scenes.render import parse_image_size
from standin.captioning import cartoons

logger = logging.getLogger(__name__)

NAME = "data"
PRETRAIN_OFFSET = 50_000  # scene indices of the exposure splits start here (the contests use 0..n-1)


@dataclasses.dataclass
class Config:
    contests: int = help_field(40, "CLEVR-like contests, split train/val/test by contest")
    ood_contests: int | None = help_field(None, "OOD-renderer contests (split ood; null: contests // 4, 0: none)")
    val_frac: float = help_field(0.15, "share of the contests in val")
    test_frac: float = help_field(0.15, "share of the contests in test")
    pretrain_ood_contests: int = help_field(0, "OOD-renderer exposure scenes for pre-training only")
    pretrain_main_contests: int = help_field(0, "CLEVR-like exposure scenes for pre-training only")
    captions: int = help_field(24, "candidate captions per contest")
    image_size: str = help_field("128x96", "WIDTHxHEIGHT")
    min_objects: int = help_field(3, "objects per scene, at least")
    max_objects: int = help_field(7, "objects per scene, at most")
    mean_votes: float = help_field(30.0, "simulated raters per caption, on average")
    min_votes: int = help_field(10, "simulated raters per caption, at least")
    vote_noise: float = help_field(1.5, "the raters' noise around the hidden rule")
    seed: int | None = help_field(None, "the generator's seed (null: the recipe's)")
    workers: int | None = help_field(None, "render processes (null: the cores - 1, at most 16)")
    overwrite: bool = help_field(False, "render again over an existing stand-in")

    def __post_init__(self):
        try:
            parse_image_size(self.image_size)
        except SceneArgumentError as exc:
            raise config.RecipeError(f"data.image_size: {exc}") from None
        require(
            self.min_objects <= self.max_objects,
            f"data.min_objects ({self.min_objects}) is above data.max_objects ({self.max_objects})",
        )
        require(
            0 <= self.val_frac < 1 and 0 <= self.test_frac < 1, "data.val_frac and data.test_frac must be in [0, 1)"
        )
        require(
            self.contests >= 1
            and self.captions >= 2
            and self.min_objects >= 1
            and self.min_votes >= 1
            and min(self.ood_contests or 0, self.pretrain_ood_contests, self.pretrain_main_contests) >= 0,
            "data.contests, captions, min_objects, min_votes must be >= 1 (captions >= 2), the other counts >= 0",
        )


def split_names(cfg: Config) -> list[str]:
    names = ["train", "val", "test"] + (["ood"] if cfg.ood_contests != 0 else [])
    return names + [
        split
        for count, split in ((cfg.pretrain_ood_contests, "ood_pretrain"), (cfg.pretrain_main_contests, "main_pretrain"))
        if count
    ]


def standin_config(cfg, seed):
    """The ``cartoons.StandinConfig`` of the ``data`` section (what ``make_contest`` needs to render a contest
    again)."""
    return cartoons.StandinConfig(
        captions=cfg.captions,
        image_size=parse_image_size(cfg.image_size),
        min_objects=cfg.min_objects,
        max_objects=cfg.max_objects,
        mean_votes=cfg.mean_votes,
        min_votes=cfg.min_votes,
        vote_noise=cfg.vote_noise,
        seed=seed if cfg.seed is None else cfg.seed,
    )


def inputs(*_) -> dict:
    return {}


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.split(name) for name in split_names(cfg)]


def run(cfg: Config, paths, seed) -> dict:
    marker = os.path.join(paths.data, "standin.json")
    if os.path.isfile(marker) and not cfg.overwrite:
        logger.info(f"[data] {paths.data} already holds the stand-in; reusing it")
        return read_json(marker)
    settings = standin_config(cfg, seed)
    workers = cfg.workers or max(1, min(16, (os.cpu_count() or 2) - 1))
    cartoons.write_standin(
        paths.data,
        cfg.contests,
        cfg.ood_contests,
        cfg.val_frac,
        cfg.test_frac,
        settings,
        workers=workers,
        overwrite=True,
    )
    info = read_json(marker)
    for exposure, stream, split in (
        (cfg.pretrain_ood_contests, "ood", "ood_pretrain"),
        (cfg.pretrain_main_contests, "main", "main_pretrain"),
    ):
        if exposure:  # images only: one caption row per scene
            scenes = cartoons.build_contests(
                exposure, settings, stream, workers=workers, start=PRETRAIN_OFFSET, rows_per_contest=1
            )
            scenes.save_to_disk(paths.split(split))
            info["splits"][split] = {"rows": len(scenes), "contests": exposure}
    write_json(marker, info)
    logger.info(f"[data] wrote {paths.data}: {info['splits']}")
    return info
