"""The captioning task as the engine sees it (``task: captioning`` in a GRPO recipe).

Training prompts: one row per contest of ``dataset_name`` (a caption dataset, ``data.py``; split
``dataset_train_split`` of a DatasetDict): ``prompt``, ``image``, ``contest`` and the description columns the
``caption_rm`` reward reads (keep ``remove_unused_columns: false``); ``max_train_samples`` keeps the first N.
In-training evaluation (``eval_sets``, named by basename): ``caption_eval_samples`` (1) completions per cartoon,
greedy unless ``caption_eval_temperature``, scored by ``caption_eval_reward_model`` (default: caption_rm's); keep-best
ranks by the fail-as-zero sigma(RM) mean (``eval/<set>_fail0_sigma_rm``).
"""

import hashlib
import os
import time
from dataclasses import dataclass, field

from open_r1.checks import first_rows
from open_r1.errors import DataError, RecipeError
from open_r1.tasks import Task, one_line
from open_r1.tasks.captioning import data as data_lib
from open_r1.tasks.captioning import evaluate as evaluate_lib
from open_r1.tasks.captioning import protocol
from open_r1.tasks.captioning.rewards import get_reward_model


@dataclass
class CaptionSetReport:
    """One eval set's result in the engine's report shape (name, n, seconds, records, score, summary())."""

    name: str
    n: int
    seconds: float
    metrics: dict
    records: list[dict] = field(default_factory=list, repr=False)

    @property
    def score(self) -> float:
        """What keep-best ranks checkpoints by: the fail-as-zero sigma(RM) mean over cartoons."""
        return float(self.metrics["fail_as_zero"])

    def summary(self) -> dict:
        keys = ("format_rate", "truncated_rate", "emitted_sigmoid", "fail_as_zero")
        out = {"name": self.name, "n": self.n, "seconds": round(self.seconds, 2)}
        out.update({k: self.metrics[k] for k in keys if self.metrics.get(k) is not None})
        tokens = [r["completion_tokens"] for r in self.records if r.get("completion_tokens") is not None]
        if tokens:
            out["mean_completion_tokens"] = sum(tokens) / len(tokens)
        return out


class CaptioningTask(Task):
    name = "captioning"
    metric = "fail0_sigma_rm"
    default_primary = "val"
    default_secondary = "ood"

    def train_dataset(self, script_args, training_args):
        if not script_args.dataset_name:
            raise DataError(
                "task captioning needs dataset_name: a caption dataset dir (see open_r1/tasks/captioning/data.py)"
            )
        # a split is picked only from a DatasetDict; a plain dataset dir is the split itself
        dataset = data_lib.load_captions(script_args.dataset_name, split=script_args.dataset_train_split)
        return first_rows(data_lib.prompt_rows(dataset), script_args.max_train_samples)

    generate_hint = (
        "open-r1-caption-prepare (the real data) or python -m standin.captioning.cartoons --out "
        "data/humor --contests 40"
    )

    def load_split(self, path_or_name, split="train"):
        if os.path.isdir(path_or_name):  # a caption dataset: its columns checked as training will read them
            return data_lib.load_captions(path_or_name, split=split, check_images="none")
        return super().load_split(path_or_name, split)

    def probe(self, model, processor):
        from open_r1.generation import generate_texts  # deferred: torch

        prompt = processor.apply_chat_template(
            protocol.build_messages(None), tokenize=False, add_generation_prompt=True
        )
        texts, _, _ = generate_texts(model, processor, [prompt], [self.probe_image()], protocol.MAX_NEW_TOKENS)
        parsed = protocol.parse_details(texts[0])
        problem = f"the sample completion has no parseable caption ({parsed.reason}): {one_line(texts[0])}"
        return texts[0], None if parsed.ok else problem

    def training_meta(self) -> dict:
        sha = hashlib.sha1(protocol.SYSTEM_PROMPT.encode()).hexdigest()[:12]
        return {
            "caption_protocol": {
                "max_words": protocol.MAX_WORDS,
                "max_new_tokens": protocol.MAX_NEW_TOKENS,
                "system_prompt_sha": sha,
            },
            "eval_reward_model": self._rm_settings()[0],
        }

    def _rm_settings(self) -> tuple[str | None, str | None]:
        """(the eval's reward model dir, its device): caption_eval_reward_model, else the caption_rm reward's."""
        kwargs = self.script_args.reward_kwargs.get("caption_rm") or {} if self.script_args else {}
        return self.settings.caption_eval_reward_model or kwargs.get("reward_model"), kwargs.get("device")

    def load_eval_set(self, path, limit=None):
        return first_rows(data_lib.prompt_rows(data_lib.load_captions(path)), limit)

    def evaluate(self, model, processor, dataset, name, batch_size, limit=None, progress=False):
        path, device = self._rm_settings()
        if not path:
            raise RecipeError(
                "the captioning evaluation scores with the reward model: set "
                "reward_kwargs.caption_rm.reward_model (or caption_eval_reward_model) in the recipe"
            )
        settings, temperature = self.settings, self.settings.caption_eval_temperature
        start = time.perf_counter()
        records = evaluate_lib.evaluate_policy(
            model,
            processor,
            dataset,
            get_reward_model(path, device),
            n=settings.caption_eval_samples,
            max_new_tokens=settings.caption_eval_max_new_tokens or protocol.MAX_NEW_TOKENS,
            do_sample=temperature is not None,
            temperature=temperature if temperature is not None else 1.0,
            batch_size=batch_size,
            max_cartoons=limit,
        )
        return self.report_from_records(name, records, time.perf_counter() - start)

    def report_from_records(self, name, records, seconds):
        metrics = evaluate_lib.policy_metrics(records, bon_ns=(1,))
        metrics.pop("per_cartoon", None)
        return CaptionSetReport(name=name, n=metrics["cartoons"], seconds=seconds, metrics=metrics, records=records)


TASK = CaptioningTask
