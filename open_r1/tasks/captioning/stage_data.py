"""Stage 0 (stand-in only): generate the offline caption-contest data, and the pre-training exposure images.

Algorithm: ``standin.write_standin`` renders ``contests`` CLEVR-like cartoons (split train/val/test by contest) and
``ood_contests`` OOD-renderer cartoons (split ``ood``), each with ``captions`` candidate captions scored by the
hidden image-dependent rule and rated by simulated voters (module docstring of ``standin``). With
``pretrain_ood_contests`` > 0 it also renders that many *further* OOD-renderer scenes (indices after the evaluation
ones, so disjoint from ``ood``) into ``ood_pretrain``: the base models' pre-training sees that renderer's images in
describe/question rows only (never captions), as real base models have seen all kinds of images. The counting proxy
does the same (its OOD exposure rows). ``pretrain_main_contests`` does the same for the CLEVR-like renderer
(``main_pretrain``, indices disjoint from every contest): a real base has seen far more than the few hundred training
cartoons, and seeing which object is odd has to be learned from images before an RM can use it.

Deviation from the seed: the seed downloads the real New Yorker caption-contest ratings; none are reachable here. On
the real data skip this stage and point ``data.dir`` to a directory with ``train/ val/ test/`` in the layout of
``open_r1/tasks/captioning/data.py``.

    python -m open_r1.tasks.captioning.stage_data --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os

from open_r1.tasks.captioning import stage_common as common

PRETRAIN_OFFSET = 50_000  # scene indices of the exposure splits start here (the contests use 0..n-1)

# the data section's keys: `standin_config`'s, `run`'s and ``dir`` (stage_common.Paths, every stage)
SECTION_KEYS = {  # the data section's keys, each with the kind of value `standin_config` / `run` read
    "captions": common.whole(2), "image_size": common.ANY, "min_objects": common.whole(1),
    "max_objects": common.whole(1), "mean_votes": common.number(0, above=True), "min_votes": common.whole(1),
    "vote_noise": common.number(0), "seed": common.whole(), "contests": common.whole(1),
    "ood_contests": common.optional(common.whole(0)), "val_frac": common.number(0, 1, below=True),
    "test_frac": common.number(0, 1, below=True), "pretrain_ood_contests": common.whole(0),
    "pretrain_main_contests": common.whole(0), "workers": common.optional(common.whole(0)), "overwrite": common.BOOL,
    "dir": common.optional(common.TEXT)}


def check_recipe(recipe: dict) -> None:
    """Before any stage runs (the pipeline's preflight): the data section's keys and values."""
    from open_r1.errors import RecipeError, SceneArgumentError
    from open_r1.tasks.counting.scenes.render import parse_image_size

    cfg = common.section(recipe, "data")
    common.check_section("data", cfg, SECTION_KEYS)
    try:
        parse_image_size(cfg.get("image_size", "128x96"))
    except SceneArgumentError as exc:
        raise RecipeError(f"data.image_size: {exc}") from None
    if int(cfg.get("min_objects", 3)) > int(cfg.get("max_objects", 7)):
        raise RecipeError(f"data.min_objects ({cfg.get('min_objects', 3)}) is above data.max_objects "
                          f"({cfg.get('max_objects', 7)})")


def split_names(recipe: dict) -> list[str]:
    """The splits this stage writes under the data dir (`run`; `standin.write_standin`: ood unless
    ``ood_contests`` is 0)."""
    cfg = common.section(recipe, "data")
    names = ["train", "val", "test"] + (["ood"] if cfg.get("ood_contests") != 0 else [])
    return names + [split for key, split in (("pretrain_ood_contests", "ood_pretrain"),
                                             ("pretrain_main_contests", "main_pretrain")) if cfg.get(key)]


def standin_config(recipe: dict):
    """The ``standin.StandinConfig`` of the recipe's ``data`` section (what ``standin.make_contest`` needs to render
    any of its contests again)."""
    from open_r1.tasks.captioning import standin
    from open_r1.tasks.counting.scenes.render import parse_image_size

    cfg = common.section(recipe, "data")
    return standin.StandinConfig(
        captions=int(cfg.get("captions", 24)), image_size=parse_image_size(cfg.get("image_size", "128x96")),
        min_objects=int(cfg.get("min_objects", 3)), max_objects=int(cfg.get("max_objects", 7)),
        mean_votes=float(cfg.get("mean_votes", 30.0)), min_votes=int(cfg.get("min_votes", 10)),
        vote_noise=float(cfg.get("vote_noise", 1.5)), seed=int(cfg.get("seed", recipe["seed"])),
    )


def run(recipe: dict) -> dict:
    from open_r1.tasks.captioning import standin

    cfg = common.section(recipe, "data")
    paths = common.Paths(recipe)
    marker = os.path.join(paths.data, "standin.json")
    if os.path.isfile(marker) and not cfg.get("overwrite", False):
        common.log(f"[data] {paths.data} already holds the stand-in; reusing it")
        return common.read_json(marker)
    config = standin_config(recipe)
    workers = int(cfg.get("workers") or max(1, min(16, (os.cpu_count() or 2) - 1)))
    standin.write_standin(paths.data, int(cfg["contests"]), cfg.get("ood_contests"), float(cfg.get("val_frac", 0.15)),
                          float(cfg.get("test_frac", 0.15)), config, workers=workers, overwrite=True)
    info = common.read_json(marker)
    for key, stream, split in (("pretrain_ood_contests", "ood", "ood_pretrain"),
                               ("pretrain_main_contests", "main", "main_pretrain")):
        exposure = int(cfg.get(key, 0))
        if exposure:  # images only: one caption row per scene
            scenes = standin.build_contests(exposure, config, stream, workers=workers, start=PRETRAIN_OFFSET,
                                            rows_per_contest=1)
            scenes.save_to_disk(paths.split(split))
            info["splits"][split] = {"rows": len(scenes), "contests": exposure}
    common.write_json(marker, info)
    common.log(f"[data] wrote {paths.data}: {info['splits']}")
    return info


def main(argv=None) -> int:
    return common.stage_cli("data", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
