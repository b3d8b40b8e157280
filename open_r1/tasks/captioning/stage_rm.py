"""Stage 3: the Bradley-Terry VLM reward model, its held-out pairwise accuracy, and an image-blind control.

Algorithm (the seed's RM, with its faults fixed): preference pairs of the training contests by the k-sigma rule
(``data.preference_pairs``: two captions of one contest whose mean-rating gap exceeds ``k * sqrt(se1^2 + se2^2)``
with an explicit standard error, at most ``cap_per_contest`` per contest drawn at random, then all pairs shuffled
with the seed, so any prefix spans the contests). Each side is ``protocol.rm_messages(description, caption)``: the
task's own prompt (with the description) + the assistant turn ``<caption>…</caption>``, with the cartoon.
``open_r1.reward_model``: VLM backbone (``AutoModel``) + zero-initialised ``Linear(hidden, 1)`` head read at the
last real token (padding-side proof), loss -log sigmoid(s_chosen - s_rejected) (optional margin and centring),
trained with a ``transformers.Trainer`` subclass, the same pixel budget in training and scoring (saved with the
model), saved as one dir. Held-out: pairwise accuracy on the pairs of the held-out contests (``eval_splits``; test
and the OOD renderer by default) with a bootstrap CI that resamples contests, and beside it the image swap
(``image_swap_accuracy``: how often a top caption scores higher under its own cartoon than under another; 0.5 for
a model that ignores the image). The image-blind control is the same
recipe with every image replaced by one blank grey image (training and scoring): what the RM gets from the text alone.

Seeds (``rm.seeds: [0, 1, 2]``): the stage can train one RM per seed (the data order; the pairs are the same), score
each on the val contests as well, and keep the one with the best val accuracy as THE RM (``models/rm``, a copy; each
seed's dir stays as ``models/rm-s<seed>``). Every seed's accuracies are reported, so the selection is visible; test
and OOD play no part in it. The blind control trains once, with the first seed. Candidly: on the stand-in (run 4,
docs/CAPTIONING.md) three seeds agreed within 0.003 on test while their val accuracies spread over 0.08, so there
the choice picked noise; in run 6 two seeds read 0.700 / 0.644 on val and 0.670 / 0.640 on test (one had had its
sudden drop in loss earlier), so there it helped, and in run 7 val picked the one seed of three that reached 0.752 on
test (the others 0.612 and 0.625). The H200 recipe trains three seeds.

``rm.train_split`` (default ``train``) names the split the pairs come from: ``train_rated`` is the training contests
plus a round of (on the stand-in, simulated) ratings on the SFT policy's own samples (the stage before this one,
``stage_ratings``), for an RM that has seen the kind of captions GRPO will ask it to rank.

Image negatives (``rm.image_negatives``, a fraction of the training pairs; off unless set): extra pairs whose two
sides are one conversation (a contest's top-k caption, ``rm.image_negative_top_k``) under its own cartoon and under
another contest's (``data.image_negative_indices``). Their label is an assumption, not a rating (a contest's best
caption is funnier with its own cartoon), and a text-only model cannot separate the sides, so they push the RM to
read the image, which on the stand-in it learns in a sudden loss drop that came late or never in about half the
H200 runs (docs/CAPTIONING.md). The blind control gets the same rows, each one input twice (no gradient). Not in
the seed; one H200 run (15, at 0.25): one of three seeds learned the image, as often as without them.

Deviations from the seed: the caption is not cut to 80 tokens and the description is part of the prompt (the seed's
RM ignores it); pairs are drawn at random per contest (the seed takes the first 20k in contest order); pooling reads
the attention mask (the seed's ``attention_mask.sum(1) - 1`` is wrong under left padding); the seed scores full
resolution after training at <= 448 px, here one budget. The stand-in trains the whole small backbone (no LoRA)
with a higher learning rate; the real recipe uses LoRA r16/alpha32, lr 1e-5 cosine (configs/captioning/real_rm.yaml).

    python -m open_r1.tasks.captioning.stage_rm --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os
import time

from open_r1.tasks.captioning import stage_common as common
from open_r1.tasks.captioning.data import SE_FROM
from open_r1.validate import is_int, is_number


def blank_like(image):
    from PIL import Image

    return Image.new("RGB", image.size, (128, 128, 128))


def contest_images(dataset, first_row: dict, blind: bool) -> dict:
    """{contest: its image} from the row `first_row[contest]` of `dataset`, decoded once and shared by the contest's
    pairs (not one decode and copy per pair); blind: the blank image of the same size."""
    decoded = dataset.select(list(first_row.values()))["image"]
    images = {}
    for contest, image in zip(first_row, decoded):
        image = image.convert("RGB")
        images[contest] = blank_like(image) if blind else image
    return images


def pair_rows(pairs, blind: bool = False, keep_oracle: bool = False) -> list[dict]:
    """RM pair rows ({image, chosen, rejected, group}) from ``data.preference_pairs`` output."""
    from open_r1.tasks.captioning import protocol

    rows = []
    # one Arrow -> Python conversion; row-by-row access cost ~40 % of this function
    records = pairs.remove_columns(["image"]).to_list()
    first: dict = {}
    for i, record in enumerate(records):
        first.setdefault(record["contest"], i)
    images = contest_images(pairs, first, blind)
    for record in records:
        desc = protocol.description_from_row(record)
        image = images[record["contest"]]
        row = {"image": image, "chosen": protocol.rm_messages(desc, record["chosen"]),
               "rejected": protocol.rm_messages(desc, record["rejected"]), "group": record["contest"]}
        if keep_oracle:
            row["oracle_order"] = record["chosen_oracle"] > record["rejected_oracle"]
        rows.append(row)
    return rows


def index_pair_rows(dataset, index, blind: bool = False, keep_oracle: bool = False,
                    images: dict | None = None) -> list[dict]:
    """``pair_rows(data.preference_pairs(dataset, ...))`` from the pairs' row indices (``data.pair_indices``, the
    same rule, cap and seed), without building the pair dataset: that copies a contest's image into every one of its
    pairs (206k pairs in run 13) and cost most of each RM process's start. The same rows, in the same order, with
    the image of each contest's first pair (tested against ``pair_rows``)."""
    from open_r1.tasks.captioning import protocol

    columns = dataset.select_columns([c for c in dataset.column_names if c != "image"]).to_dict()
    contests, captions = columns["contest"], columns["caption"]
    if images is None:  # {contest: image}, as `split_images` makes it (given: shared with other rows of the split)
        first: dict = {}
        for chosen, _ in index:
            first.setdefault(contests[chosen], int(chosen))
        images = contest_images(dataset, first, blind)
    prompts: dict = {}  # chosen row -> its prompt, built once (building one per side was most of the time left)
    rows = []
    for chosen, rejected in index.tolist():
        contest = contests[chosen]
        if chosen not in prompts:
            prompts[chosen] = protocol.build_messages(
                protocol.description_from_row({k: v[chosen] for k, v in columns.items()}))
        prompt = prompts[chosen]
        row = {"image": images[contest], "chosen": [*prompt, protocol.rm_turn(captions[chosen])],
               "rejected": [*prompt, protocol.rm_turn(captions[rejected])], "group": contest}
        if keep_oracle:
            row["oracle_order"] = columns["oracle"][chosen] > columns["oracle"][rejected]
        rows.append(row)
    return rows


def split_images(dataset, blind: bool = False) -> dict:
    """{contest: its image} for every contest of `dataset` (the image of its first row; blind: blank)."""
    first: dict = {}
    for row, contest in enumerate(dataset.select_columns(["contest"]).to_dict()["contest"]):
        first.setdefault(contest, row)
    return contest_images(dataset, first, blind)


def image_negative_rows(dataset, index, blind: bool = False, images: dict | None = None) -> list[dict]:
    """RM rows of ``data.image_negative_indices``' (caption row, other row) pairs: chosen = the caption's
    conversation under its own cartoon, rejected = the same conversation under the other contest's cartoon
    (``rejected_image``), group = the caption's contest. Blind, both images are the one blank image, so the two
    sides are the same input and the row adds no gradient."""
    from open_r1.tasks.captioning import protocol

    columns = dataset.select_columns([c for c in dataset.column_names if c != "image"]).to_dict()
    images = split_images(dataset, blind) if images is None else images
    rows = []
    for own, other in index.tolist():
        contest = columns["contest"][own]
        if columns["contest"][other] == contest:
            raise ValueError(f"an image-negative pair of rows {own}, {other} has one contest ({contest!r})")
        messages = protocol.rm_messages(protocol.description_from_row({k: v[own] for k, v in columns.items()}),
                                        columns["caption"][own])
        rows.append({"image": images[contest], "chosen": messages, "rejected": messages,
                     "rejected_image": images[columns["contest"][other]], "group": contest})
    return rows


def image_negative_settings(recipe: dict) -> tuple[float, int]:
    """``rm.image_negatives`` (image-negative pairs added, as a fraction of the training pairs; 0: none) and
    ``rm.image_negative_top_k`` (their captions come from each contest's top k), checked."""
    from open_r1.errors import RecipeError

    cfg = common.section(recipe, "rm")
    fraction, top_k = cfg.get("image_negatives", 0.0) or 0.0, cfg.get("image_negative_top_k", 3)
    if not is_number(fraction) or not 0 <= fraction <= 1:
        raise RecipeError(f"rm.image_negatives must be a fraction of the training pairs in [0, 1] (e.g. 0.25; 0: "
                          f"none), got {fraction!r}")
    if not is_int(top_k) or top_k < 1:
        raise RecipeError(f"rm.image_negative_top_k must be a positive integer, got {top_k!r}")
    return float(fraction), top_k


def eval_image_swaps(recipe: dict) -> int:
    """``rm.eval_image_swaps``: how many captions `image_swap_accuracy` draws per held-out split (0: none), checked."""
    from open_r1.errors import RecipeError

    n = common.section(recipe, "rm").get("eval_image_swaps", 480)
    if not is_int(n) or n < 0:
        raise RecipeError(f"rm.eval_image_swaps must be an integer >= 0 (captions per held-out split; 0: no image-swap "
                          f"diagnostic), got {n!r}")
    return n


# the rm section's keys: the training pairs' (`pair_rule`, `training_pairs`, `inputs`: train_split), the image
# negatives', `train_one`'s, held-out scoring's (`scored_splits`, `held_out_pairs`, `image_swap_accuracy`), the job
# split's (`run`, the pipeline's `parallel_jobs`: parallel, only, seed, seeds, blind) and the output dirs'
# (stage_common.Paths: out, blind_out)
# (each with the kind of value read; ANY: checked by its own function below, or lora by `check_recipe`)
SECTION_KEYS = {
    "train_split": common.TEXT, "k": common.number(0), "se_from": common.choice(*SE_FROM),
    "cap_per_contest": common.optional(common.whole(1)), "max_pairs": common.optional(common.whole(0)),
    "image_negatives": common.ANY, "image_negative_top_k": common.ANY, "backbone": common.optional(common.TEXT),
    "min_pixels": common.PIXELS, "max_pixels": common.PIXELS, "dtype": common.DTYPE, "lora": common.ANY,
    "learning_rate": common.number(0, above=True), "lr_scheduler": common.TEXT, "warmup_ratio": common.number(0, 1),
    "epochs": common.number(0, above=True), "max_steps": common.optional(common.whole(0)),
    "max_seconds": common.optional(common.number(0, above=True)), "weight_decay": common.number(0),
    "per_device_batch_size": common.whole(1), "gradient_accumulation_steps": common.whole(1),
    "gradient_checkpointing": common.BOOL, "dataloader_workers": common.whole(0), "logging_steps": common.whole(1),
    "center_rewards_coefficient": common.optional(common.number(0)), "eval_splits": common.TEXTS,
    "eval_cap_per_contest": common.whole(1), "eval_batch_size": common.whole(1), "eval_image_swaps": common.ANY,
    "parallel": common.BOOL, "only": common.optional(common.choice("rm", "rm_blind")), "seed": common.whole(),
    "seeds": common.ANY, "blind": common.BOOL, "out": common.optional(common.TEXT),
    "blind_out": common.optional(common.TEXT)}


def check_recipe(recipe: dict) -> None:
    """The section's keys and choices (seeds, image negatives, the image-swap diagnostic), checked; the pipeline
    calls this before any stage runs."""
    cfg = common.section(recipe, "rm")
    common.check_section("rm", cfg, SECTION_KEYS)
    _check_lr_scheduler(cfg.get("lr_scheduler", "cosine"))
    lora = cfg.get("lora")
    if lora is not None:  # checked here too: the RM builds its LoRA minutes into the chain
        from open_r1.errors import RecipeError
        from open_r1.reward_model import LORA_KEYS

        if not isinstance(lora, dict):
            raise RecipeError(f"rm.lora must be null or a mapping of {', '.join(LORA_KEYS)}, got {lora!r}")
        common.check_keys("rm.lora", lora, LORA_KEYS)
    rm_seeds(recipe)
    image_negative_settings(recipe)
    eval_image_swaps(recipe)


def _check_lr_scheduler(name) -> None:
    """``rm.lr_scheduler``: a transformers scheduler name (TrainingArguments refuses others when the RM stage builds
    them, minutes into the chain)."""
    from transformers import SchedulerType

    from open_r1.errors import RecipeError

    names = [kind.value for kind in SchedulerType]
    if name not in names:
        raise RecipeError(f"rm.lr_scheduler must be a transformers scheduler name ({', '.join(names)}), got {name!r}")


def held_out_pairs(recipe: dict, split: str, blind: bool):
    from open_r1.tasks.captioning import data as cdata

    cfg = common.section(recipe, "rm")
    paths = common.Paths(recipe)
    dataset = cdata.load_captions(paths.split(split), check_images="none", keep_oracle=True)
    index = cdata.pair_indices(dataset, k=float(cfg.get("k", 3.0)), se_from=cfg.get("se_from", "precision"),
                               cap_per_contest=int(cfg.get("eval_cap_per_contest", 200)), seed=int(recipe["seed"]) + 7)
    # real data has no oracle (the stand-in's analysis column): its rows carry no oracle order
    return index_pair_rows(dataset, index, blind=blind, keep_oracle="oracle" in dataset.column_names)


def _progress(label: str, every_s: float = 15.0):
    """A `progress(done, total)` that logs at most every `every_s` seconds (and at the end)."""
    last = [time.time()]

    def progress(done: int, total: int) -> None:
        if done == total or time.time() - last[0] >= every_s:
            last[0] = time.time()
            common.log(f"{label}: scored {done}/{total} conversations")

    return progress


def rm_seeds(recipe: dict) -> list[int]:
    """The RM seeds of the recipe (``rm.seeds``; default: the recipe's seed), validated."""
    seeds = common.section(recipe, "rm").get("seeds")
    return [int(recipe["seed"])] if seeds is None else common.seed_list("rm.seeds", seeds)


def scored_splits(recipe: dict) -> list[str]:
    """The held-out splits each RM is scored on: ``eval_splits``, with val first when several seeds compete (the
    selection reads val only)."""
    splits = list(common.section(recipe, "rm").get("eval_splits", ["test", "ood"]))
    if len(rm_seeds(recipe)) > 1 and "val" not in splits:
        splits.insert(0, "val")
    return splits


def pair_rule(recipe: dict) -> dict:
    """The k-sigma rule, cap per contest and seed of the RM's training pairs, as ``data.preference_pairs`` /
    ``data.pair_indices`` keyword arguments (``rm.max_pairs``, if set, then keeps a prefix)."""
    cfg = common.section(recipe, "rm")
    return {"k": float(cfg.get("k", 3.0)), "se_from": cfg.get("se_from", "precision"),
            "cap_per_contest": cfg.get("cap_per_contest", 1000), "seed": int(recipe["seed"])}


def training_pairs(recipe: dict):
    """The k-sigma preference pairs the RM trains on, from the split ``rm.train_split`` (default ``train``; e.g.
    ``train_rated``: the training contests with a round of ratings on a policy's samples added,
    ``stage_ratings``), capped per contest and shuffled with the recipe's seed (a pair dataset; the RM itself
    trains on `training_pair_rows`, the same pairs)."""
    from open_r1.tasks.captioning import data as cdata

    cfg = common.section(recipe, "rm")
    path = common.check_inputs({"train": inputs(recipe)["train"]})["train"]
    train = cdata.load_captions(path, check_images="none")
    pairs = cdata.preference_pairs(train, **pair_rule(recipe))
    if cfg.get("max_pairs"):
        pairs = pairs.select(range(min(int(cfg["max_pairs"]), len(pairs))))
    return pairs


def training_index(recipe: dict, dataset):
    """The row indices (``data.pair_indices``) of the pairs the RM trains on in `dataset`: `pair_rule`, then the
    ``rm.max_pairs`` prefix if set (`training_pairs`' pairs; the ratings stage counts them too)."""
    from open_r1.tasks.captioning import data as cdata

    index = cdata.pair_indices(dataset, **pair_rule(recipe))
    max_pairs = common.section(recipe, "rm").get("max_pairs")
    return index[:int(max_pairs)] if max_pairs else index


def training_pair_rows(recipe: dict, blind: bool = False) -> list[dict]:
    """`pair_rows(training_pairs(recipe))`, built from the pairs' row indices (`index_pair_rows`), then the
    image-negative rows if ``rm.image_negatives`` asks for them (`image_negative_rows`; the trainer shuffles)."""
    from open_r1.tasks.captioning import data as cdata

    fraction, top_k = image_negative_settings(recipe)
    path = common.check_inputs({"train": inputs(recipe)["train"]})["train"]
    train = cdata.load_captions(path, check_images="none")
    index = training_index(recipe, train)
    n = int(round(fraction * len(index)))
    if not n:
        return index_pair_rows(train, index, blind=blind)
    images = split_images(train, blind)
    negatives = cdata.image_negative_indices(train, n, top_k=top_k, seed=int(recipe["seed"]) + 11)
    return index_pair_rows(train, index, blind=blind, images=images) + image_negative_rows(
        train, negatives, blind=blind, images=images)


def train_one(recipe: dict, blind: bool, seed: int | None = None) -> dict:
    import torch
    from transformers import TrainingArguments

    from open_r1 import reward_model as rm_lib

    cfg = common.section(recipe, "rm")
    paths = common.Paths(recipe)
    backbone = cfg.get("backbone") or paths.rm_base
    seeds = rm_seeds(recipe)
    seed = seeds[0] if seed is None else int(seed)
    out = paths.rm_blind if blind else (paths.rm if len(seeds) == 1 else paths.rm_seed(seed))
    tag = f"[rm{' blind' if blind else ''}{'' if len(seeds) == 1 else f' s{seed}'}]"
    rows = training_pair_rows(recipe, blind=blind)
    negatives = sum("rejected_image" in row for row in rows)
    cuda = torch.cuda.is_available()
    model = rm_lib.build_reward_model(
        backbone, min_pixels=cfg.get("min_pixels"), max_pixels=cfg.get("max_pixels"),
        dtype=cfg.get("dtype") or ("float32" if not cfg.get("lora") or not cuda else None),
        lora=cfg.get("lora"), meta={"blind": blind, "train_pairs": len(rows), "image_negatives": negatives,
                                    "k": cfg.get("k", 3.0), "seed": seed})
    if not cuda:
        model = model.float()
    max_seconds = cfg.get("max_seconds")

    work = os.path.join(paths.root, "rm-trainer-blind" if blind else f"rm-trainer-s{seed}")
    args = TrainingArguments(
        output_dir=work, per_device_train_batch_size=int(cfg.get("per_device_batch_size", 8)),
        gradient_accumulation_steps=int(cfg.get("gradient_accumulation_steps", 1)),
        learning_rate=float(cfg.get("learning_rate", 1e-5)), lr_scheduler_type=cfg.get("lr_scheduler", "cosine"),
        warmup_steps=float(cfg.get("warmup_ratio", 0.03)), num_train_epochs=float(cfg.get("epochs", 1)),
        max_steps=int(cfg.get("max_steps") or -1), weight_decay=float(cfg.get("weight_decay", 0.0)),
        logging_steps=int(cfg.get("logging_steps", 10)), save_strategy="no", report_to="none",
        bf16=cuda, use_cpu=not cuda, seed=seed, data_seed=seed,
        dataloader_num_workers=int(cfg.get("dataloader_workers", 0)), disable_tqdm=True,
        gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)), remove_unused_columns=False,
    )
    common.log(f"{tag} {len(rows)} train pairs from {len({row['group'] for row in rows})} contests"
               f"{f' ({negatives} of them image negatives)' if negatives else ''}; backbone {backbone}")
    started = time.time()
    trainer = rm_lib.train_reward_model(model, rows, args, callbacks=[common.time_cap(max_seconds)] if max_seconds else None,
                                        center_rewards_coefficient=cfg.get("center_rewards_coefficient"))
    seconds = time.time() - started
    losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    model.save(out, extra_meta={"train_seconds": seconds, "steps": trainer.state.global_step})
    del trainer
    common.log(f"{tag} {model.meta['steps']} steps; saved {out}")
    report = {"out": out, "blind": blind, "seed": seed, "train_pairs": len(rows), "image_negatives": negatives,
              "steps": int(model.meta["steps"]),
              "train_seconds": seconds, "loss_first": losses[0][1] if losses else None,
              "loss_last": losses[-1][1] if losses else None, "loss_curve": losses[:: max(1, len(losses) // 50)],
              "held_out": score_held_out(recipe, model, blind, tag)}
    common.write_json(os.path.join(out, "rm_report.json"), report)
    return report


def score_held_out(recipe: dict, model, blind: bool, tag: str = "[rm]", splits: list[str] | None = None) -> dict:
    """Pairwise accuracy (with the by-contest CI) of `model` on each held-out split's k-sigma pairs that exists
    (default: `scored_splits`); blind: every image the blank one, as the blind RM was trained."""
    from open_r1 import reward_model as rm_lib

    cfg = common.section(recipe, "rm")
    paths = common.Paths(recipe)
    results = {}
    for split in splits or scored_splits(recipe):
        if not os.path.isdir(paths.split(split)):
            continue
        t0 = time.time()
        held = held_out_pairs(recipe, split, blind)
        common.log(f"{tag} {split}: scoring {len(held)} held-out pairs (built in {time.time() - t0:.1f} s)")
        result = rm_lib.evaluate_pairs(model, held, batch_size=int(cfg.get("eval_batch_size", 32)),
                                       seed=int(recipe["seed"]), progress=_progress(f"{tag} {split}"))
        if held and "oracle_order" in held[0]:
            result["oracle_agreement_of_labels"] = sum(r["oracle_order"] for r in held) / len(held)
        swap = image_swap_accuracy(recipe, model, split, blind)
        if swap is not None:
            result["image_swap"] = swap
            common.log(f"{tag} {split}: image swap (own cartoon over another) {swap['accuracy']:.3f} "
                       f"[{swap['ci_low']:.3f}, {swap['ci_high']:.3f}] over {swap['n_pairs']} captions")
        results[split] = result
        common.log(f"{tag} {split}: pairwise accuracy {result['accuracy']:.3f} "
                   f"[{result['ci_low']:.3f}, {result['ci_high']:.3f}] over {result['n_pairs']} pairs of "
                   f"{result['n_groups']} contests")
    return results


def image_swap_accuracy(recipe: dict, model, split: str, blind: bool) -> dict | None:
    """Does the RM read the image? The share of a split's top-k captions (``rm.eval_image_swaps`` of them, drawn as
    ``data.image_negative_indices``) that it scores higher under their own cartoon than under another contest's,
    with the by-contest CI. 0.5 for a model blind to the image (ties count 1/2; the blind control scores both sides
    on the one blank image: 0.5 up to float noise). A diagnostic beside the pairwise accuracy, not a label: no reader
    rated these pairs. None when the recipe sets 0 or the split has fewer than two contests."""
    from open_r1 import reward_model as rm_lib
    from open_r1.tasks.captioning import data as cdata

    cfg = common.section(recipe, "rm")
    n = eval_image_swaps(recipe)
    dataset = cdata.load_captions(common.Paths(recipe).split(split), check_images="none")
    if not n or len(set(dataset["contest"])) < 2:
        return None
    index = cdata.image_negative_indices(dataset, n, top_k=image_negative_settings(recipe)[1],
                                         seed=int(recipe["seed"]) + 13)
    result = rm_lib.evaluate_pairs(model, image_negative_rows(dataset, index, blind=blind),
                                   batch_size=int(cfg.get("eval_batch_size", 32)), seed=int(recipe["seed"]))
    return {k: result[k] for k in ("accuracy", "ci_low", "ci_high", "n_pairs", "n_groups")}


def rescore(recipe: dict, model_dir: str, splits: list[str] | None = None) -> dict:
    """Score a saved RM dir on the recipe's held-out splits again (e.g. after a run was cut during its scoring);
    blind or not as its saved meta says."""
    from open_r1 import reward_model as rm_lib

    model = rm_lib.load_reward_model(model_dir)
    blind = bool(model.meta.get("blind"))
    held_out = score_held_out(recipe, model, blind, f"[rescore {os.path.basename(model_dir)}]", splits)
    return {"out": os.path.abspath(model_dir), "blind": blind, "seed": model.meta.get("seed"),
            "steps": model.meta.get("steps"), "held_out": held_out}


def inputs(recipe: dict) -> dict[str, common.Input]:
    from open_r1.tasks.captioning import stage_ratings

    cfg = common.section(recipe, "rm")
    paths = common.Paths(recipe)
    split = str(cfg.get("train_split", "train"))
    # a split other than the data stage's: the ratings stage's (train_rated), or one the user made
    made_by = "data" if split == "train" else "ratings" if split == stage_ratings.settings(recipe)["split"] else ""
    return {"backbone": common.Input(cfg.get("backbone") or paths.rm_base, "the RM backbone", "pretrain",
                                     "rm.backbone"),
            "train": common.split_input(paths, split, made_by, "data.dir" if split == "train" else "rm.train_split")}


def run(recipe: dict) -> dict:
    """Train the RM(s) and the blind control. ``rm.only`` (rm | rm_blind) and ``rm.seed`` (one of ``rm.seeds``)
    restrict this process to one job: the pipeline runs the jobs as parallel processes and then calls `finish`.
    Whenever this process trains every seed (``rm.only`` unset or ``rm``, no ``rm.seed``), it keeps the best on val
    as ``models/rm`` itself."""
    from open_r1.errors import RecipeError

    cfg = common.section(recipe, "rm")
    only = cfg.get("only")
    seeds = rm_seeds(recipe)
    if cfg.get("seed") is not None and cfg["seed"] not in seeds:
        raise RecipeError(f"rm.seed={cfg['seed']!r} is not one of rm.seeds {seeds}")
    common.check_inputs(inputs(recipe))
    mine = [cfg["seed"]] if cfg.get("seed") is not None else seeds
    report = {}
    if only in (None, "rm"):
        for seed in mine:
            report[seed_key(seeds, seed)] = train_one(recipe, blind=False, seed=seed)
    if cfg.get("blind", True) and only in (None, "rm_blind"):
        report["rm_blind"] = train_one(recipe, blind=True, seed=seeds[0])
    # a process that trained every seed makes the choice (with rm.only=rm too); one job of several leaves it to the
    # pipeline, which calls `finish` on the merged results
    return finish(recipe, report) if only in (None, "rm") and cfg.get("seed") is None else report


def seed_key(seeds: list[int], seed: int) -> str:
    return "rm" if len(seeds) == 1 else f"rm_s{int(seed)}"


def choose_seed(reports: dict[int, dict], split: str = "val") -> int:
    """The seed whose RM has the best pairwise accuracy on `split` (ties: the lowest seed)."""
    from open_r1.errors import OpenR1Error

    missing = [seed for seed, r in reports.items() if split not in (r.get("held_out") or {})]
    if missing:
        raise OpenR1Error(f"RM seed(s) {missing} have no {split} accuracy to choose by; is the {split} split built?")
    return max(sorted(reports), key=lambda seed: reports[seed]["held_out"][split]["accuracy"])


def finish(recipe: dict, report: dict) -> dict:
    """With several seeds: keep the RM with the best val accuracy as ``models/rm`` (a copy of its seed dir, staged so a
    failure leaves no half-written RM) and report it under ``rm`` with the choice (``selected``: the seed, the split,
    every seed's val accuracy). One seed: the report as it is."""
    import shutil

    from open_r1 import modeling

    seeds = rm_seeds(recipe)
    if len(seeds) == 1:
        return report
    reports = {seed: report[seed_key(seeds, seed)] for seed in seeds}
    chosen = choose_seed(reports)
    paths = common.Paths(recipe)
    with modeling.staged_dir(paths.rm) as staging:
        shutil.copytree(reports[chosen]["out"], staging, dirs_exist_ok=True)
    val = {seed: reports[seed]["held_out"]["val"]["accuracy"] for seed in seeds}
    common.log(f"[rm] kept seed {chosen} as {paths.rm} (val accuracy by seed: "
               + ", ".join(f"s{seed} {acc:.3f}" for seed, acc in val.items()) + ")")
    return {**report, "rm": {**reports[chosen], "out": paths.rm,
                             "selected": {"seed": chosen, "by": "val accuracy", "val_accuracy": val}}}


def main(argv=None) -> int:
    return common.stage_cli("rm", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
