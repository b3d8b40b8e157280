"""Checks that import nothing else of the project (errors and jsonio aside): numbers from a recipe or data, paths
a run will write, recipe values, weight files, data sets and their images. Each returns problems (one line each,
naming the option that fixes it) or raises one `OpenR1Error`; `open_r1.validate` runs them for a whole run."""

import difflib
import io
import logging
import math
import numbers
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor

from open_r1.errors import DataError, RecipeError
from open_r1.jsonio import read_json

logger = logging.getLogger(__name__)
ALLOW_CPU_ENV = "OPEN_R1_ALLOW_CPU"


def is_int(value) -> bool:
    """An integral number that is not a bool (a YAML `true` must not pass as 1): int and numpy integers."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number that is not a bool (`numbers.Real`, numpy's too); nan and inf count."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def closest_key(key: str, valid) -> str | None:
    """The valid key closest to a misspelt `key` (difflib, its default cutoff 0.6), or None."""
    match = difflib.get_close_matches(key, list(valid), n=1)
    return match[0] if match else None


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


def raise_all(problems: list[str], header: str = "cannot start") -> None:
    if not problems:
        return
    if len(problems) == 1:
        raise RecipeError(problems[0])
    raise RecipeError(f"{header}, {len(problems)} problems:\n  - " + "\n  - ".join(problems))


# TRL 1.16's GRPOConfig.loss_type values (tests/test_validate.py checks its help lists the same): TRL itself refuses
# another name only inside the loss, after the model loaded and the first rollouts ran.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def check_loss_type(training_args) -> list[str]:
    loss_type = training_args.loss_type
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
            problems.append(
                f"reward_weights[{i}] (reward {name}) is {weight!r}: every weight must be a finite number "
                "(a nan/inf weight silently drops that reward; --reward_weights)"
            )
    if reward_funcs is not None and len(weights) != len(reward_funcs):
        problems.append(
            f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward_funcs "
            f"{list(reward_funcs)}; give one weight per reward (--reward_weights)"
        )
    return problems


def check_eval_settings(script_args) -> list[str]:
    problems = []
    eval_sets = list(script_args.eval_sets or [])
    every, limit = script_args.eval_steps_protocol, script_args.eval_limit
    if eval_sets:
        if every is None or every < 1:
            problems.append(
                f"eval_steps_protocol must be >= 1 when eval_sets is set, got {every} "
                "(--eval_steps_protocol N evaluates every N steps)"
            )
        if limit is not None and limit < 1:
            problems.append(
                f"eval_limit must be >= 1 (rows per eval set) or null for every row, got {limit} (--eval_limit)"
            )
        batch = script_args.eval_batch_size
        if batch is not None and batch < 1:
            problems.append(f"eval_batch_size must be >= 1, got {batch} (--eval_batch_size)")
        names = [os.path.basename(os.path.normpath(p)) for p in eval_sets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(f"eval sets {duplicates} appear twice by name (names are dir basenames; --eval_sets)")
    elif script_args.keep_best:
        problems.append(
            "keep_best needs eval_sets (held-out sets to score checkpoints on): set --eval_sets, or --keep_best false"
        )
    return problems


def check_sizes(script_args) -> list[str]:
    """Counts and pixel budgets that would silently mean something else (0 rows = all rows) or fail after the
    model loaded (min_pixels > max_pixels)."""
    problems = []
    rows = script_args.max_train_samples
    if rows is not None and rows < 1:
        problems.append(f"max_train_samples must be >= 1 or null (every row), got {rows} (--max_train_samples)")
    low, high = script_args.min_pixels, script_args.max_pixels
    for name, value in (("min_pixels", low), ("max_pixels", high)):
        if value is not None and value < 1:
            problems.append(f"{name} must be >= 1, got {value} (--{name})")
    if low is not None and high is not None and low > high:
        problems.append(
            f"min_pixels {low} > max_pixels {high}: images are resized into [min_pixels, max_pixels] "
            "(--min_pixels / --max_pixels)"
        )
    return problems


# Counts of TRL's GRPOConfig / transformers' TrainingArguments and their least value (null = derived): GRPOConfig
# divides by the group sizes as it is built (num_generations 0: ZeroDivisionError), and a batch of 0 trains nothing.
COUNTS = {
    "num_generations": 2,  # GRPO's advantages compare completions within a group
    "num_generations_eval": 1,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "generation_batch_size": 1,
    "steps_per_generation": 1,
}


def check_counts(values: dict) -> list[str]:
    """Group sizes, batch sizes and max_steps (-1 = by num_train_epochs, HF's; 0 or below also trained by epochs),
    from the parsed recipe before the dataclasses that use them are built."""
    problems = [
        f"{key} must be >= {least}, got {values[key]} (--{key})"
        for key, least in COUNTS.items()
        if is_number(values.get(key)) and values[key] < least
    ]
    steps, epochs = values.get("max_steps"), values.get("num_train_epochs")
    if is_number(steps) and steps < 1 and steps != -1:
        problems.append(f"max_steps must be >= 1, or -1 to train num_train_epochs, got {steps} (--max_steps)")
    elif steps == -1 and is_number(epochs) and not epochs > 0:  # 0 epochs: no step, the base model saved as trained
        problems.append(f"num_train_epochs must be > 0 when max_steps is -1, got {epochs} (--num_train_epochs)")
    return problems


def check_devices(training_args) -> list[str]:
    """A recipe that needs GPUs (DeepSpeed, or a generation batch a CPU cannot carry) on a machine without one."""
    import torch

    if os.environ.get(ALLOW_CPU_ENV) == "1":
        return []
    if torch.cuda.is_available() and not training_args.use_cpu:
        return []
    reasons = []
    if training_args.deepspeed:
        reasons.append("DeepSpeed")
    completions = training_args.generation_batch_size or training_args.per_device_train_batch_size * (
        training_args.steps_per_generation or 1
    )
    if completions > 64:
        reasons.append(f"{completions} completions per generation round")
    if not reasons:
        return []
    return [
        f"this recipe needs GPUs ({', '.join(reasons)}) but none is visible "
        f"(torch.cuda.is_available() is {torch.cuda.is_available()}). Run it on a GPU machine, use the CPU demo "
        f"recipe (bash train.sh configs/demo.yaml), or set {ALLOW_CPU_ENV}=1 to run it on the CPU anyway"
    ]


def granularity_problems(config) -> list[str]:
    """DeepSpeed's stage3_module_granularity_threshold (`config`: --deepspeed's path or dict) can make the vision
    tower a ZeRO-3 leaf, whose gradients it drops (reduced in a full backward hook, never run for a ModelOutput)."""
    config = read_json(config, {}) if isinstance(config, str) and os.path.isfile(config) else config
    if not isinstance(config, dict) or not (config.get("zero_optimization") or {}).get(
        "stage3_module_granularity_threshold"
    ):
        return []
    return [
        "--deepspeed: remove stage3_module_granularity_threshold; it can make the vision tower one ZeRO-3 leaf, "
        "whose gradients DeepSpeed drops (the trainer makes each decoder layer and vision block a leaf instead)"
    ]


def lost_updates_warning(training_args, dtype, use_peft: bool = False) -> str | None:
    """Full fine-tuning of half-precision weights (`dtype`: modeling.resolve_dtype's) without DeepSpeed's fp32 master
    copy: AdamW adds each step to the weight, where one under half its spacing (>= |w| / 2**bits) rounds away."""
    dtype = str(dtype).removeprefix("torch.")
    bits = {"bfloat16": 9, "float16": 12}.get(dtype)
    if not bits or training_args.deepspeed or use_peft:
        return None
    lr = training_args.learning_rate
    return (
        f"warning: full fine-tuning of {dtype} weights without DeepSpeed: AdamW's steps (about learning_rate, "
        f"{lr:g}) round away on every weight above {lr * 2**bits:.1e} in magnitude. Train under DeepSpeed "
        "ZeRO-3 (train.sh's default; fp32 master weights) or with dtype float32"
    )


def weights_problems(path: str) -> list[str]:
    """Every safetensors file present, with a readable header and the size its header promises."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        index = read_json(index_path, None)
        if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
            return ["weights index model.safetensors.index.json is not valid JSON with a weight_map: re-save the model"]
        files = sorted(set(index["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        return ["weights are missing: no model.safetensors or model.safetensors.index.json"]
    problems = []
    for name in files:
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            problems.append(f"weights file {name} named in the index is missing")
            continue
        problem = safetensors_problem(file_path)
        if problem:
            problems.append(f"weights file {name} is {problem}")
    return problems


def safetensors_problem(file_path: str) -> str | None:
    """Why a .safetensors file would not load, or None: `safe_open` checks the header and that the file covers every
    tensor it declares (a truncated copy fails here, not at load time)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file_path, framework="pt") as handle:
            handle.keys()
    except SafetensorError as exc:
        return f"truncated or corrupt ({exc}; {os.path.getsize(file_path)} bytes on disk)"
    except OSError as exc:
        return f"unreadable ({exc})"
    return None


def check_checkpoint(path: str) -> str | None:
    """Why a training checkpoint's weights would not load (adapter or full), or None."""
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        file_path = os.path.join(path, "adapter_model.safetensors")
        if os.path.isfile(file_path):
            problem = safetensors_problem(file_path)
            return f"adapter_model.safetensors is {problem}" if problem else None
        if os.path.isfile(os.path.join(path, "adapter_model.bin")):
            return None
        return "adapter_model.safetensors is missing"
    if not os.path.isfile(os.path.join(path, "config.json")):
        return "config.json is missing"
    problems = weights_problems(path)
    return "; ".join(problems) if problems else None


def nonfinite_weights(path: str) -> str | None:
    """The first weight holding nan or inf in a checkpoint dir's safetensors files (a run that diverged before the
    save), or None; one tensor in memory at a time."""
    import torch  # deferred: heavy
    from safetensors import safe_open

    for name in sorted(n for n in os.listdir(path) if n.endswith(".safetensors")):
        with safe_open(os.path.join(path, name), framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    return f"{name}: {key} holds nan or inf"
    return None


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


def check_images(dataset, name: str, rows: int | None = None, batch_size: int = 512) -> None:
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
    offset = 0
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) + 1)) as pool:
        for batch in raw.iter(batch_size=batch_size):
            cells = batch["image"]
            for i, problem in enumerate(pool.map(_verify_image, cells)):
                if problem:
                    raise DataError(f"{name} row {offset + i}: unreadable image ({problem}); fix or drop that row")
            offset += len(cells)


# one data file, read by `datasets`' builder of its format
FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
# what a hub dataset id looks like ("owner/name", or a canonical "name"); anything else is a local path
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def is_hub_id(path_or_name: str) -> bool:
    """A name that is no local path and reads as a hub dataset id (`leonardPKU/clevr_cogen_a_train`); `data/train`
    where `data/` exists, or `val.jsonl`, is a missing local one."""
    if os.path.exists(path_or_name) or HUB_ID.fullmatch(path_or_name) is None:
        return False
    if os.path.splitext(path_or_name)[1].lower() in FILE_BUILDERS:
        return False
    return not os.path.isdir(path_or_name.split("/")[0])


def first_rows(dataset, limit: int | None):
    """The first `limit` rows (None: all)."""
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def load_split(path_or_name: str, split: str = "train", generate_hint: str | None = None):
    """A split of a data set in the forms researchers have it, read by `datasets`' own loaders: a `save_to_disk` dir
    (a Dataset, or a DatasetDict holding `split`); a folder of data files, as `hf download --repo-type dataset ID
    --local-dir DIR` leaves one (its README's `configs`, else `data/<split>-*.parquet`: every shard, rows in file
    order); one `.parquet`, `.jsonl` or `.json` file (its rows, whatever `split`); a hub id where the hub is
    reachable. `generate_hint`: the command that makes the task's default data, named in the errors."""
    import datasets

    path = path_or_name
    hint = f", or generate one: {generate_hint}" if generate_hint else ""
    if os.path.isfile(path):
        builder = FILE_BUILDERS.get(os.path.splitext(path)[1].lower())
        if builder is None:
            raise DataError(
                f"{path} is a file but not a data file: give a .parquet, .jsonl or .json file, a save_to_disk dir "
                "or a folder of data files (DATA / --dataset_name)"
            )
        return _load(lambda: datasets.load_dataset(builder, data_files=path, split="train"), path)
    if os.path.isdir(path) and not any(
        os.path.isfile(os.path.join(path, name)) for name in ("state.json", "dataset_dict.json")
    ):  # no save_to_disk dir: a folder of data files (a hub snapshot)
        try:
            return _load(lambda: datasets.load_dataset(path, split=split), path, hint)
        except DataError as exc:  # the README's row counts are not the shards': read what is there, and say so
            if "NonMatchingSplitsSizesError" not in str(exc):
                raise
            logger.warning(
                f"warning: {path}: its README.md counts other rows than its shards hold (a partial download?)"
            )
            return _load(lambda: datasets.load_dataset(path, split=split, verification_mode="no_checks"), path, hint)
    if os.path.isdir(path):
        try:
            loaded = datasets.load_from_disk(path)
        except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
            raise DataError(
                f"{path} is a directory but not a dataset saved with Dataset.save_to_disk ({exc}). "
                f"Point to the split's directory (e.g. data/train){hint}"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                example = os.path.join(path, sorted(loaded)[0])
                raise DataError(
                    f"{path} holds the splits {sorted(loaded)}, not {split!r}: name one split's "
                    f"directory, DATA / --dataset_name {example}"
                )
            loaded = loaded[split]
        return loaded
    if not is_hub_id(path):
        start = f"Generate the embedded default with `{generate_hint}` or point" if generate_hint else "Point"
        raise DataError(f"dataset directory {path} does not exist. {start} DATA / --dataset_name to your split")
    try:  # a hub id: only where a hub is reachable
        return datasets.load_dataset(path, split=split)
    except ConnectionError as exc:  # datasets' own, offline or with no route to the hub
        raise DataError(
            f"{path} is no local path, and as a hub dataset id it cannot be fetched: the Hugging Face hub is "
            f"unreachable ({exc}). Download it where the hub is reachable, `hf download --repo-type dataset {path} "
            "--local-dir DIR`, and pass DIR"
        ) from None
    except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
        raise DataError(f"could not load dataset {path!r} (split {split!r}): {exc}") from None


def _load(load, path: str, hint: str = ""):
    """`load()`'s data set, its failure one DataError naming `path`."""
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; re-raised as one clear error
        if "Unknown split" in str(exc):
            raise DataError(f"{path}: {exc} Name one with --dataset_train_split") from None
        kind = "data file" if os.path.isfile(path) else "folder of data files (a hub snapshot: data/<split>-*.parquet)"
        cause = exc.__cause__ or exc  # datasets' DatasetGenerationError says why only in its cause
        raise DataError(
            f"{path} could not be read as a {kind} ({type(cause).__name__}: {str(cause)[:300]}); point to a "
            f"save_to_disk dir, a hub snapshot folder or a .parquet/.jsonl/.json file{hint}"
        ) from None
