"""Validate a run up front, once, before the model loads: every problem found is reported in one message.

Used by `open_r1.grpo` (training), `selfcheck.py` and `open_r1.export`. What is checked:
  * recipe values: finite reward weights (one per reward), the time budget ('0'/'off' mean none), the in-training
    evaluation settings (eval_steps_protocol >= 1, eval_limit >= 1, keep_best needs eval_sets);
  * paths: the model, the training data, every eval set, the output dir and the submission dir. Every missing or
    unwritable one is listed in ONE error, each with the option (or environment variable) that sets it;
  * devices: a recipe that needs GPUs on a machine without them;
  * model dirs: config, weights (every shard present, headers readable, sizes as promised), tokenizer, chat
    template, and an unmerged LoRA adapter (named as such, with the merge command);
  * images: every image of every data set the run will read, decoded header-and-checksum (`PIL.Image.verify`) in a
    thread pool as the rows stream from Arrow; the first bad one fails with its set and row index.

Every failure is an `OpenR1Error` subclass (open_r1/errors.py), so each entry point prints `error: <message>` and
exits 2 without a traceback.
"""
from __future__ import annotations

import io
import json
import math
import numbers
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from open_r1.errors import DataError, OpenR1Error, RecipeError

MERGE_HINT = "python -m open_r1.export --checkpoint {path} --out <merged dir>"
ALLOW_CPU_ENV = "OPEN_R1_ALLOW_CPU"


# ---- small helpers -----------------------------------------------------------------------------------------------


def is_int(value) -> bool:
    """An integral number that is not a bool: int and numpy integers (numpy registers them as `numbers.Integral`).
    bool is an int subclass, so a YAML/JSON `true` must not pass as 1; numpy's `np.bool_` is no Integral either."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number that is not a bool: int, float, numpy integers and floats (`numbers.Real`; also Fraction).
    Says nothing about the value: nan and inf are numbers here, so a caller that needs a finite one checks that too."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cannot_create_in(directory: str) -> str | None:
    """Why no file can be created in `directory`, or None: a file is made and removed there (os.access reads only
    the mode bits, which root passes on a read-only file system)."""
    try:
        handle, name = tempfile.mkstemp(prefix=".write-check-", dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(handle)
    os.remove(name)
    return None


def writable_problem(path: str) -> str | None:
    """Why `path` (a dir to create or replace) cannot be written, or None. Looks at the nearest existing ancestor."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} exists and is not a directory"
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} (on the way to {path}) is not a directory"
    reason = _cannot_create_in(probe)
    if reason:
        return f"{probe} is not writable: {reason}" + ("" if probe == path else f" (needed to create {path})")
    if probe == path:
        parent = os.path.dirname(path)
        reason = _cannot_create_in(parent)
        if reason:  # replaced by rename: the parent must be writable too
            return f"{parent} is not writable: {reason} (needed to replace {path} atomically)"
    return None


def raise_all(problems: list[str], error=RecipeError, header: str = "cannot start") -> None:
    if not problems:
        return
    if len(problems) == 1:
        raise error(problems[0])
    raise error(f"{header}, {len(problems)} problems:\n  - " + "\n  - ".join(problems))


# ---- recipe values -----------------------------------------------------------------------------------------------

# TRL 1.16's GRPOConfig.loss_type values (its field help lists them; tests/test_validate.py checks the two agree).
# TRL itself refuses another name only inside the loss, after the model loaded and the first rollouts ran.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def check_loss_type(training_args) -> list[str]:
    loss_type = getattr(training_args, "loss_type", None)
    if loss_type is None or loss_type in LOSS_TYPES:
        return []
    return [f"loss_type {loss_type!r} is not one of TRL's {', '.join(LOSS_TYPES)} (--loss_type)"]


def check_reward_weights(weights, reward_funcs) -> list[str]:
    problems = []
    if weights is None:
        return problems
    for i, weight in enumerate(weights):
        try:
            value = float(weight)
        except (TypeError, ValueError):
            problems.append(f"reward_weights[{i}] = {weight!r} is not a number (--reward_weights)")
            continue
        if not math.isfinite(value):
            name = reward_funcs[i] if reward_funcs and i < len(reward_funcs) else f"#{i}"
            problems.append(f"reward_weights[{i}] (reward {name}) is {weight!r}: every weight must be a finite number "
                            "(a nan/inf weight silently drops that reward; --reward_weights)")
    if reward_funcs is not None and len(weights) != len(reward_funcs):
        problems.append(f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward_funcs "
                        f"{list(reward_funcs)}; give one weight per reward (--reward_weights)")
    return problems


def normalise_time_budget(script_args) -> list[str]:
    """Parse time_budget once; '0', 'off', 'none' become None (no budget) so no budget callback is built."""
    from open_r1.errors import BudgetError
    from open_r1.run.budget import parse_time_budget

    value = getattr(script_args, "time_budget", None)
    if value is None:
        return []
    try:
        deadline = parse_time_budget(value)
    except BudgetError as exc:
        return [f"{exc} (--time_budget; '0' or 'off' = no budget)"]
    if deadline is None:
        script_args.time_budget = None
    return []


def check_eval_settings(script_args) -> list[str]:
    problems = []
    eval_sets = list(getattr(script_args, "eval_sets", None) or [])
    every = getattr(script_args, "eval_steps_protocol", None)
    limit = getattr(script_args, "eval_limit", None)
    if eval_sets:
        if every is None or every < 1:
            problems.append(f"eval_steps_protocol must be >= 1 when eval_sets is set, got {every} "
                            "(--eval_steps_protocol N evaluates every N steps)")
        if limit is not None and limit < 1:
            problems.append(f"eval_limit must be >= 1 (rows per eval set) or null for every row, got {limit} "
                            "(--eval_limit)")
        batch = getattr(script_args, "eval_batch_size", 1)
        if batch is not None and batch < 1:
            problems.append(f"eval_batch_size must be >= 1, got {batch} (--eval_batch_size)")
        names = [os.path.basename(os.path.normpath(p)) for p in eval_sets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(f"eval sets {duplicates} appear twice by name (names are dir basenames; --eval_sets)")
    elif getattr(script_args, "keep_best", None):
        problems.append("keep_best needs eval_sets (held-out sets to score checkpoints on): set --eval_sets, or "
                        "--keep_best false")
    return problems


def check_sizes(script_args) -> list[str]:
    """Counts and pixel budgets that would silently mean something else (0 rows = all rows) or fail after the
    model loaded (min_pixels > max_pixels)."""
    problems = []
    rows = getattr(script_args, "max_train_samples", None)
    if rows is not None and rows < 1:
        problems.append(f"max_train_samples must be >= 1 or null (every row), got {rows} (--max_train_samples)")
    low, high = getattr(script_args, "min_pixels", None), getattr(script_args, "max_pixels", None)
    for name, value in (("min_pixels", low), ("max_pixels", high)):
        if value is not None and value < 1:
            problems.append(f"{name} must be >= 1, got {value} (--{name})")
    if low is not None and high is not None and low > high:
        problems.append(f"min_pixels {low} > max_pixels {high}: images are resized into [min_pixels, max_pixels] "
                        "(--min_pixels / --max_pixels)")
    return problems


def check_devices(training_args, model_args=None, num_processes: int | None = None) -> list[str]:
    """A recipe that needs GPUs (DeepSpeed, or a generation batch a CPU cannot carry) on a machine without one."""
    import torch

    if os.environ.get(ALLOW_CPU_ENV) == "1":
        return []
    if torch.cuda.is_available() and not getattr(training_args, "use_cpu", False):
        return []
    reasons = []
    if getattr(training_args, "deepspeed", None):
        reasons.append("DeepSpeed")
    completions = (getattr(training_args, "generation_batch_size", None)
                   or training_args.per_device_train_batch_size * (getattr(training_args, "steps_per_generation", None)
                                                                   or 1))
    if completions > 64:
        reasons.append(f"{completions} completions per generation round")
    if not reasons:
        return []
    return [f"this recipe needs GPUs ({', '.join(reasons)}) but none is visible "
            f"(torch.cuda.is_available() is {torch.cuda.is_available()}). Run it on a GPU machine, use the CPU demo "
            f"recipe (bash train.sh configs/demo.yaml), or set {ALLOW_CPU_ENV}=1 to run it on the CPU anyway"]


# ---- model dirs ---------------------------------------------------------------------------------------------------


def model_dir_problems(path: str, option: str, need_tokenizer: bool = True) -> list[str]:
    """Static checks of a model dir, no weights loaded: each problem names the dir and the fix."""
    from open_r1 import export as export_lib

    if not os.path.isdir(path):
        return [f"model {path} does not exist ({option}); for a tiny test model: "
                "python -m open_r1.tiny_models --out models/tiny-qwen2vl"]
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(
            os.path.join(path, "config.json")):
        return [f"{path} is a LoRA adapter, not a full model; merge it with "
                f"{MERGE_HINT.format(path=path)} and point {option} to the merged dir"]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as handle:
                json.load(handle)["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return [f"{path}: the weights index model.safetensors.index.json is not a valid index ({exc}); "
                    "re-save the model ({option})".replace("{option}", option)]
    try:
        with open(os.path.join(path, "config.json")) as handle:
            json.load(handle)
    except FileNotFoundError:
        return [f"{path} has no config.json: not a saved transformers model ({option})"]
    except (OSError, ValueError) as exc:
        return [f"{path}/config.json is not valid JSON ({exc}); re-save the model ({option})"]
    # any supported family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as its own class: a base model or an evaluated model
    # need not be the counting submission (export and selfcheck --verify check that)
    report = export_lib.verify_submission(path, generate=False, expected_class=None)
    has_processor = os.path.isfile(os.path.join(path, "processor_config.json"))  # transformers 5 layout
    wrong = [p for p in report.problems if p.startswith("wrong architecture")]
    if wrong:  # the other files of a model we cannot train are beside the point
        return [f"model {path}: {wrong[0]} ({option})"]
    problems = [p for p in report.problems
                if (need_tokenizer or not any(k in p for k in ("tokenizer", "chat template", "processor")))
                and not (has_processor and "preprocessor_config.json" in p)]
    return [f"model {path}: {p} ({option})" for p in problems]


def check_checkpoint(path: str) -> str | None:
    """Why a training checkpoint's weights would not load (adapter or full), or None."""
    from open_r1 import export as export_lib

    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        for name in ("adapter_model.safetensors",):
            file_path = os.path.join(path, name)
            if os.path.isfile(file_path):
                problem = export_lib._safetensors_problem(file_path)
                return f"{name} is {problem}" if problem else None
        if os.path.isfile(os.path.join(path, "adapter_model.bin")):
            return None
        return "adapter_model.safetensors is missing"
    if not os.path.isfile(os.path.join(path, "config.json")):
        return "config.json is missing"
    problems = export_lib._check_weights(path)
    return "; ".join(problems) if problems else None


# ---- data and images -------------------------------------------------------------------------------------------


def _verify_image(cell) -> str | None:
    from PIL import Image

    if cell is None:
        return "no image"
    data, path = (cell.get("bytes"), cell.get("path")) if isinstance(cell, dict) else (None, None)
    try:
        if data is not None:
            handle = io.BytesIO(data)
        elif path:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        else:
            return "no image bytes or path"
        with handle, Image.open(handle) as image:
            if min(image.size) < 1:
                return f"empty image {image.size}"
            image.verify()  # header + chunk checksums, no full decode
    except Exception as exc:  # noqa: BLE001 - PIL raises many types
        return f"{type(exc).__name__}: {exc}"
    return None


def check_images(dataset, name: str, rows: int | None = None, workers: int | None = None,
                 batch_size: int = 512) -> None:
    """Every image of `dataset` (the first `rows` rows), checked in parallel as the rows stream from Arrow.
    Raises DataError naming the set and the first bad row."""
    import datasets

    if "image" not in dataset.column_names:
        return
    n = len(dataset) if rows is None else min(rows, len(dataset))
    if n <= 0:
        return
    raw = dataset.select(range(n)) if n < len(dataset) else dataset
    if isinstance(raw.features["image"], datasets.Image):
        raw = raw.cast_column("image", datasets.Image(decode=False))
    raw = raw.select_columns(["image"])
    workers = workers or min(8, (os.cpu_count() or 1) + 1)
    offset = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for batch in raw.iter(batch_size=batch_size):
            cells = batch["image"]
            for i, problem in enumerate(pool.map(_verify_image, cells)):
                if problem:
                    raise DataError(f"{name} row {offset + i}: unreadable image ({problem}); fix or drop that row")
            offset += len(cells)


def load_split(path_or_name: str, split: str = "train", generate_hint: str | None = None):
    """Load a split: a `save_to_disk` directory (a Dataset, or a DatasetDict holding `split`) or a hub name.
    `generate_hint`: the command that makes the task's embedded default data, named in the errors."""
    import datasets

    if os.path.isdir(path_or_name):
        try:
            loaded = datasets.load_from_disk(path_or_name)
        except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
            hint = f", or generate one: {generate_hint}" if generate_hint else ""
            raise DataError(
                f"{path_or_name} is a directory but not a dataset saved with Dataset.save_to_disk ({exc}). "
                f"Point to the split's directory (e.g. data/train){hint}"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                example = os.path.join(path_or_name, sorted(loaded)[0])
                raise DataError(f"{path_or_name} holds the splits {sorted(loaded)}, not {split!r}: name one split's "
                                f"directory, DATA / --dataset_name {example}")
            loaded = loaded[split]
        return loaded
    if os.path.sep in path_or_name or path_or_name.startswith("."):
        start = f"Generate the embedded default with `{generate_hint}` or point" if generate_hint else "Point"
        raise DataError(f"dataset directory {path_or_name} does not exist. {start} DATA / --dataset_name to your split")
    try:  # a hub name: only works where a hub is reachable
        return datasets.load_dataset(path_or_name, split=split)
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"could not load dataset {path_or_name!r} (split {split!r}): {exc}") from None


def dataset_problems(path: str, option: str, split: str = "train", task: str = "counting") -> tuple[list[str], object]:
    """(problems, dataset or None) for a save_to_disk dir / hub name, loaded the way the recipe's `task` loads its
    data (`open_r1.tasks.get_task(task).load_split`)."""
    from open_r1.tasks import get_task

    if os.path.sep in str(path) or str(path).startswith(".") or os.path.isabs(str(path)):
        if not os.path.exists(path):
            return [f"data set {path} does not exist ({option})"], None
    if os.path.isdir(path):
        state = None
        try:
            with open(os.path.join(path, "state.json")) as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            pass
        if isinstance(state, dict) and not state.get("_data_files"):
            return [f"data set {path} has no rows: an empty data set ({option})"], None
        if not os.listdir(path):
            return [f"data set {path} is an empty directory, not a save_to_disk data set ({option})"], None
    try:
        dataset = get_task(task).load_split(path, split)
    except OpenR1Error as exc:
        text = str(exc).replace("point DATA / --dataset_name to your split", f"set {option}").replace(
            "DATA / --dataset_name ", f"{option} ")
        return [f"{text} ({option})" if option not in text else text], None
    if len(dataset) == 0:
        return [f"data set {path} has no rows: an empty data set ({option})"], None
    return [], dataset


# ---- the whole run ------------------------------------------------------------------------------------------------


def validate_training(script_args, training_args, model_args, submission: str | None = None,
                      check_images_of_data: bool = True, log=print) -> None:
    """Everything `open_r1.grpo` needs, checked before the model loads. Raises one RecipeError/DataError/ModelError
    listing every problem found."""
    problems: list[str] = []
    problems += check_reward_weights(getattr(training_args, "reward_weights", None),
                                     getattr(script_args, "reward_funcs", None))
    problems += check_loss_type(training_args)
    problems += normalise_time_budget(script_args)
    problems += check_eval_settings(script_args)
    problems += check_sizes(script_args)
    problems += check_devices(training_args, model_args)
    # paths: model first (the most common mistake), then data, eval sets, outputs
    model_path = getattr(model_args, "model_name_or_path", None)
    if not model_path:
        problems.append("no model: set model_name_or_path in the recipe, or MODEL_PATH (train.sh) / "
                        "--model_name_or_path")
    else:
        problems += model_dir_problems(model_path, "MODEL_PATH (train.sh) / --model_name_or_path")
    train = None
    task = getattr(script_args, "task", None) or "counting"
    data_path = getattr(script_args, "dataset_name", None)
    if not data_path:
        problems.append("no training data: set dataset_name in the recipe, or DATA (train.sh) / --dataset_name")
    else:
        found, train = dataset_problems(data_path, "DATA (train.sh) / --dataset_name",
                                        getattr(script_args, "dataset_train_split", "train"), task=task)
        problems += found
    eval_sets = []
    for path in list(getattr(script_args, "eval_sets", None) or []):
        found, dataset = dataset_problems(path, "--eval_sets (recipe key eval_sets)", task=task)
        problems += found
        if dataset is not None:
            eval_sets.append((path, dataset))
    output_dir = getattr(training_args, "output_dir", None)
    if output_dir:
        problem = writable_problem(output_dir)
        if problem:
            problems.append(f"output dir: {problem} (OUTPUT_DIR (train.sh) / --output_dir)")
    if submission:
        problem = writable_problem(submission)
        if problem:
            problems.append(f"submission dir: {problem} (SUBMISSION (train.sh) / export --out)")
    raise_all(problems)
    if output_dir and getattr(script_args, "auto_resume", True) and str(
            getattr(training_args, "resume_from_checkpoint", None) or "").lower() not in ("false", "none", "no"):
        from open_r1.run.resume import find_resume_checkpoint

        explicit = getattr(training_args, "resume_from_checkpoint", None)
        checkpoint = explicit if explicit and str(explicit).lower() not in ("true", "latest", "last") else \
            find_resume_checkpoint(output_dir)
        check_resume_compat(output_dir, checkpoint, model_path, script_args,
                            allow=bool(getattr(script_args, "resume_mismatch_ok", False)), log=log)
    if not check_images_of_data:
        return
    if train is not None:
        check_images(train, data_path, rows=getattr(script_args, "max_train_samples", None) or None)
    limit = getattr(script_args, "eval_limit", None)
    for path, dataset in eval_sets:
        check_images(dataset, path, rows=limit)


def check_resume_compat(output_dir: str, checkpoint: str | None, base_model: str, script_args,
                        allow: bool = False, log=print) -> None:
    """Refuse to resume a run dir trained from another base model or reward/prompt recipe (unless `allow`)."""
    if checkpoint is None:
        return
    from open_r1.export import TRAINING_META_FILE
    from open_r1.run.keep_best import read_json

    meta = read_json(os.path.join(output_dir, TRAINING_META_FILE))
    if not isinstance(meta, dict):
        return
    differences = []
    recorded = meta.get("base_model")
    if recorded and base_model and os.path.abspath(base_model) != os.path.abspath(recorded):
        differences.append(f"base model {recorded} (now {os.path.abspath(base_model)})")
    for key in ("task", "reward_funcs", "prompt_templates"):
        if key in meta and getattr(script_args, key, None) is not None and list(meta[key]) != list(
                getattr(script_args, key)):
            differences.append(f"{key} {meta[key]} (now {list(getattr(script_args, key))})")
    if not differences:
        return
    message = (f"{output_dir} holds a run trained with another " + "; ".join(differences)
               + f": resuming {os.path.basename(checkpoint)} would continue that run under the new name")
    if allow:
        log(f"[resume] warning: {message}; resuming anyway (resume_mismatch_ok)")
        return
    raise RecipeError(message + ". Use another --output_dir (OUTPUT_DIR), start fresh with --auto_resume false, "
                      "or resume anyway with --resume_mismatch_ok true")
