"""Validate a run up front, once, before the model loads (`open_r1.grpo`, selfcheck): recipe values, paths (model,
data, eval sets, output and submission dirs, each problem naming its option), devices, model dirs (config, weights,
tokenizer, an unmerged LoRA adapter) and every image of every set the run reads. All problems found are reported in
one `OpenR1Error` (open_r1/errors.py), which the entry points print as one line; the checks live in `open_r1.checks`.
"""

import logging
import os

from open_r1 import modeling
from open_r1.checks import (
    check_devices,
    check_eval_settings,
    check_images,
    check_loss_type,
    check_reward_weights,
    check_sizes,
    granularity_problems,
    is_hub_id,
    lost_updates_warning,
    raise_all,
    writable_problem,
)
from open_r1.errors import BudgetError, OpenR1Error, RecipeError
from open_r1.jsonio import read_json
from open_r1.rewards import reward_kwargs_problems
from open_r1.run.budget import parse_time_budget
from open_r1.run.keep_best import has_weights
from open_r1.run.resume import find_resume_checkpoint
from open_r1.submission.export import TRAINING_META_FILE
from open_r1.submission.verify import verify_submission
from open_r1.tasks import get_task

logger = logging.getLogger(__name__)

MERGE_HINT = "python -m open_r1.submission.export --checkpoint {path} --out <merged dir>"


def normalise_time_budget(script_args) -> list[str]:
    """Parse time_budget once; '0', 'off', 'none' become None (no budget) so no budget callback is built."""
    value = script_args.time_budget
    if value is None:
        return []
    try:
        deadline = parse_time_budget(value)
    except BudgetError as exc:
        return [f"{exc} (--time_budget; '0' or 'off' = no budget)"]
    if deadline is None:
        script_args.time_budget = None
    return []


def model_dir_problems(path: str, option: str) -> list[str]:
    """Static checks of a model dir, no weights loaded: each problem names the dir and the fix."""
    if not os.path.isdir(path):
        return [
            f"model {path} does not exist ({option}); for a tiny test model: "
            "python -m open_r1.tiny_models --out models/tiny-qwen2vl"
        ]
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(
        os.path.join(path, "config.json")
    ):
        return [
            f"{path} is a LoRA adapter, not a full model; merge it with "
            f"{MERGE_HINT.format(path=path)} and point {option} to the merged dir"
        ]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            read_json(index)["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return [
                f"{path}: the weights index model.safetensors.index.json is not a valid index ({exc}); "
                f"re-save the model ({option})"
            ]
    try:
        read_json(os.path.join(path, "config.json"))
    except FileNotFoundError:
        return [f"{path} has no config.json: not a saved transformers model ({option})"]
    except (OSError, ValueError) as exc:
        return [f"{path}/config.json is not valid JSON ({exc}); re-save the model ({option})"]
    # any supported family as its own class: it need not be the counting submission (export and --verify check)
    report = verify_submission(path, generate=False, expected_class=None)
    has_processor = os.path.isfile(os.path.join(path, "processor_config.json"))  # transformers 5 layout
    wrong = [p for p in report.problems if p.startswith("wrong architecture")]
    if wrong:  # the other files of a model we cannot train are beside the point
        return [f"model {path}: {wrong[0]} ({option})"]
    problems = [p for p in report.problems if not (has_processor and "preprocessor_config.json" in p)]
    return [f"model {path}: {p} ({option})" for p in problems]


def dataset_problems(path: str, option: str, split: str = "train", task="counting") -> tuple[list[str], object]:
    """(problems, dataset or None) for a data set in any form `checks.load_split` reads, loaded the way the recipe's
    `task` (a name or the run's task object) loads its data (`Task.load_split`, which keeps it for the run)."""
    if not os.path.exists(path) and not is_hub_id(str(path)):
        return [f"data set {path} does not exist ({option})"], None
    if os.path.isdir(path):
        state = read_json(os.path.join(path, "state.json"), None)
        if isinstance(state, dict) and not state.get("_data_files"):
            return [f"data set {path} has no rows: an empty data set ({option})"], None
        if not os.listdir(path):
            return [f"data set {path} is an empty directory, not a save_to_disk data set ({option})"], None
    try:
        dataset = (get_task(task) if isinstance(task, str) else task).load_split(path, split)
    except OpenR1Error as exc:
        text = (
            str(exc)
            .replace("point DATA / --dataset_name to your split", f"set {option}")
            .replace("DATA / --dataset_name ", f"{option} ")
        )
        return [f"{text} ({option})" if option not in text else text], None
    if len(dataset) == 0:
        return [f"data set {path} has no rows: an empty data set ({option})"], None
    return [], dataset


def validate_training(
    script_args,
    training_args,
    model_args,
    task,
    submission: str | None = None,
    check_images_of_data: bool = True,
) -> None:
    """Everything `open_r1.grpo` needs, checked before the model loads. Raises one RecipeError/DataError/ModelError
    listing every problem found. `task`: the run's task object, whose `load_split` keeps each loaded set for the
    run."""
    problems: list[str] = []
    problems += check_reward_weights(training_args.reward_weights, script_args.reward_funcs)
    problems += reward_kwargs_problems(script_args.reward_funcs, script_args.reward_kwargs)
    problems += check_loss_type(training_args)
    problems += normalise_time_budget(script_args)
    problems += check_eval_settings(script_args)
    problems += check_sizes(script_args)
    problems += check_devices(training_args) + granularity_problems(training_args.deepspeed)
    # paths: model first (the most common mistake), then data, eval sets, outputs
    model_path = model_args.model_name_or_path
    if not model_path:
        problems.append(
            "no model: set model_name_or_path in the recipe, or MODEL_PATH (train.sh) / --model_name_or_path"
        )
    else:
        problems += model_dir_problems(model_path, "MODEL_PATH (train.sh) / --model_name_or_path")
    train = None
    data_path = script_args.dataset_name
    if not data_path:
        problems.append("no training data: set dataset_name in the recipe, or DATA (train.sh) / --dataset_name")
    else:
        found, train = dataset_problems(
            data_path,
            "DATA (train.sh) / --dataset_name",
            script_args.dataset_train_split,
            task=task,
        )
        problems += found
    eval_sets = []
    for path in script_args.eval_sets or []:
        found, dataset = dataset_problems(path, "--eval_sets (recipe key eval_sets)", task=task)
        problems += found
        if dataset is not None:
            eval_sets.append((path, dataset))
    output_dir = training_args.output_dir
    if output_dir:
        problem = writable_problem(output_dir)
        if problem:
            problems.append(f"output dir: {problem} (OUTPUT_DIR (train.sh) / --output_dir)")
    if submission:
        problem = writable_problem(submission)
        if problem:
            problems.append(f"submission dir: {problem} (SUBMISSION (train.sh) / export --out)")
    raise_all(problems)
    dtype = modeling.resolve_dtype(model_args.dtype)  # what load_model will load
    if warning := lost_updates_warning(training_args, dtype, model_args.use_peft):
        logger.warning(warning)
    explicit = training_args.resume_from_checkpoint
    if output_dir and script_args.auto_resume and str(explicit or "").lower() not in ("false", "none", "no"):
        checkpoint = (
            explicit
            if explicit and str(explicit).lower() not in ("true", "latest", "last")
            else find_resume_checkpoint(output_dir)
        )
        recipe = {"task": script_args.task, "reward_funcs": script_args.reward_funcs}
        recipe.update({k: v for k, v in vars(task.settings).items() if k in task.training_meta()})
        check_resume_compat(output_dir, checkpoint, model_path, recipe, allow=script_args.resume_mismatch_ok)
    if not check_images_of_data:
        return
    if train is not None:
        check_images(train, data_path, rows=script_args.max_train_samples)
    for path, dataset in eval_sets:
        check_images(dataset, path, rows=script_args.eval_limit)


def check_resume_compat(
    output_dir: str, checkpoint: str | None, base_model: str, recipe: dict, allow: bool = False
) -> None:
    """Refuse to resume a run dir trained from another base model or another value of a `recipe` key (the task, its
    rewards and the task's own settings it records, e.g. counting's prompt_templates), unless `allow`."""
    if checkpoint is None:
        return
    meta = read_json(os.path.join(output_dir, TRAINING_META_FILE), None)
    if not isinstance(meta, dict):
        return
    differences = []
    recorded = meta.get("base_model")
    if recorded and base_model and os.path.abspath(base_model) != os.path.abspath(recorded):
        differences.append(f"base model {recorded} (now {os.path.abspath(base_model)})")
    for key, value in recipe.items():
        now = list(value) if isinstance(value, (list, tuple)) else value
        if key in meta and value is not None and meta[key] != now:
            differences.append(f"{key} {meta[key]} (now {now})")
    if not differences:
        return
    message = (
        f"{output_dir} holds a run trained with another "
        + "; ".join(differences)
        + f": resuming {os.path.basename(checkpoint)} would continue that run under the new name"
    )
    if allow:
        logger.warning(f"[resume] warning: {message}; resuming anyway (resume_mismatch_ok)")
        return
    # a fresh start over a finished run's final model is refused (run.resume), so it is offered only where none is
    fresh = "" if has_weights(output_dir) else "start fresh with --auto_resume false, "
    raise RecipeError(
        f"{message}. Use another --output_dir (OUTPUT_DIR), {fresh}or resume anyway with --resume_mismatch_ok true"
    )
