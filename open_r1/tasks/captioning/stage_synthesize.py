"""Stage 1: thinking-trace synthesis: the base policy explains why each top-rated caption is funny.

For the top-k captions of every training contest (``sft.top_k``) the base policy is prompted with
``protocol.synthesis_messages`` and generates its thinking up to ``</think>`` (HF, or vLLM with ``use_vllm``). A
trace is dropped, and counted by reason, when truncated (unless ``close_unterminated``: closed at the budget and
counted, for a CPU check whose tiny policy never writes ``</think>``), empty, or leaking the caption; the kept ones
become the ``thinking`` column SFT trains on under the plain prompt (the policy never sees the caption).
"""

import dataclasses
import importlib.util
import logging
import os

from open_r1 import generation, modeling
from open_r1.checks import first_rows
from open_r1.decoding import DECODER_CHOICES
from open_r1.jsonio import write_json
from open_r1.tasks.captioning import config, protocol
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning.config import help_field

logger = logging.getLogger(__name__)

NAME = "synthesize"
TAKES = ("sft.top_k",)  # the top-k captions SFT trains on


@dataclasses.dataclass
class Config:
    limit: int | None = help_field(None, "synthesize for the first N top-k rows only (null: all)")
    max_new_tokens: int = help_field(protocol.SYNTHESIS_MAX_NEW_TOKENS, "token budget of a trace (truncated: dropped)")
    temperature: float = help_field(0.4, "sampling temperature")
    top_p: float = help_field(0.9, "nucleus sampling")
    batch_size: int = help_field(32, "prompts per generate call")
    use_vllm: bool = help_field(False, "generate with vLLM when it is installed")
    vllm_gpu_memory_utilization: float = help_field(0.5, "vLLM's share of the GPU")
    vllm_max_model_len: int = help_field(4096, "vLLM's context length")
    min_pixels: int | None = help_field(None, "image budget (null: the saved processor's)")
    max_pixels: int | None = help_field(None, "image budget (null: the saved processor's)")
    decoder: str | None = help_field(None, "open_r1.generation decoder (null: its default; hf for small models)")
    close_unterminated: bool = help_field(
        False, "keep a trace cut at max_new_tokens, closed there (counted: closed); a CPU check's tiny policy"
    )

    def __post_init__(self):
        config.require(
            self.decoder in (None, *DECODER_CHOICES),
            f"synthesize.decoder must be one of {', '.join(DECODER_CHOICES)} or null, got {self.decoder!r}",
        )
        config.require(
            0 < self.top_p <= 1 and 0 < self.vllm_gpu_memory_utilization <= 1,
            "synthesize.top_p and synthesize.vllm_gpu_memory_utilization must be in (0, 1]",
        )
        config.at_least(NAME, self, 0, "temperature", "limit")
        config.at_least(NAME, self, 1, "max_new_tokens", "batch_size", "vllm_max_model_len")


def split_trace(text: str, close: bool = False) -> tuple[str | None, str]:
    """(thinking, reason): the text before the first ``</think>``, or None (truncated, or empty); with `close`, a
    trace without ``</think>`` is closed where it ends (reason ``closed``)."""
    if protocol.THINK_CLOSE not in text and not close:
        return None, "truncated"
    reason = "ok" if protocol.THINK_CLOSE in text else "closed"
    thinking = text.split(protocol.THINK_CLOSE, 1)[0].strip().removeprefix(protocol.THINK_OPEN).strip()
    return (thinking, reason) if thinking else (None, "empty")


def synthesize(model_path: str, rows, cfg: Config) -> tuple[list[str | None], dict]:
    """Traces for caption rows (image, caption and description columns); None where dropped. (traces, counts)."""
    use_vllm = cfg.use_vllm and importlib.util.find_spec("vllm") is not None
    records = list(rows)
    processor = modeling.load_processor(model_path, cfg.min_pixels, cfg.max_pixels)
    prompts = [
        processor.apply_chat_template(
            protocol.synthesis_messages(protocol.description_from_row(r), r["caption"]),
            tokenize=False,
            add_generation_prompt=True,
        )
        for r in records
    ]
    images = [r["image"] for r in records]
    texts = (_generate_vllm if use_vllm else _generate_hf)(model_path, processor, prompts, images, cfg)
    reasons = ("kept", "closed", "truncated", "empty", "leaks_caption")
    counts = {"rows": len(records), **dict.fromkeys(reasons, 0), "engine": "vllm" if use_vllm else "hf"}
    traces = []
    for record, text in zip(records, texts):
        thinking, reason = split_trace(text, cfg.close_unterminated)  # no closing tag: truncated (or closed)
        if thinking is not None and protocol.trace_leaks_caption(thinking, record["caption"]):
            thinking, reason = None, "leaks_caption"
        counts["kept" if thinking is not None else reason] += 1
        counts["closed"] += thinking is not None and reason == "closed"
        traces.append(thinking)
    counts["examples"] = [t[:160] for t in texts[:3]]
    logger.info(
        f"[synthesize] {counts['rows']} rows: kept {counts['kept']} ({counts['closed']} closed at the budget), "
        f"dropped truncated {counts['truncated']}, "
        f"empty {counts['empty']}, caption-leaking {counts['leaks_caption']} ({counts['engine']})"
    )
    return traces, counts


def _generate_hf(model_path, processor, prompts, images, cfg: Config):
    model = modeling.load_model(model_path).to(config.device()).eval()
    texts = []
    for start in range(0, len(prompts), cfg.batch_size):
        texts += generation.generate_texts(
            model,
            processor,
            prompts[start : start + cfg.batch_size],
            images[start : start + cfg.batch_size],
            cfg.max_new_tokens,
            do_sample=True,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            stop_strings=[protocol.THINK_CLOSE],
            tokenizer=processor.tokenizer,
            decoder=cfg.decoder,
        )[0]
    return texts


def _generate_vllm(model_path, processor, prompts, images, cfg: Config):  # pragma: no cover - needs vLLM and a GPU
    from vllm import LLM, SamplingParams  # deferred: optional, heavy

    llm = LLM(
        model=model_path,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_len=cfg.vllm_max_model_len,
        limit_mm_per_prompt={"image": 1},
    )
    params = SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_new_tokens,
        stop=[protocol.THINK_CLOSE],
        include_stop_str_in_output=True,
    )
    inputs = [{"prompt": p, "multi_modal_data": {"image": i}} for p, i in zip(prompts, images)]
    return [o.outputs[0].text for o in llm.generate(inputs, params)]


def inputs(cfg, paths, *_) -> dict[str, config.Input]:
    return {
        "model": config.Input(paths.policy_base, "the base policy", "set models.policy to a model dir"),
        "train": config.split_input(paths, "train"),
    }


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.traces]


def run(cfg: Config, paths, seed, top_k) -> dict:
    model_path = config.check_inputs(inputs(cfg, paths))["model"]
    train = cdata.load_captions(paths.split("train"), check_images="none")
    top = first_rows(cdata.top_k_rows(train, top_k), cfg.limit or None)  # limit 0: all
    traces, counts = synthesize(model_path, top, cfg)
    top.add_column(cdata.THINKING_COLUMN, traces).save_to_disk(paths.traces)
    counts["out"] = paths.traces
    write_json(os.path.join(os.path.dirname(paths.traces), "synthesis.json"), counts)
    return counts


def markdown(result: dict) -> list[str]:
    return [
        "",
        f"Trace synthesis ({result.get('engine')}): {result.get('rows')} rows, kept {result.get('kept')} "
        f"({result.get('closed', 0)} closed at the token budget), "
        f"dropped truncated {result.get('truncated')}, empty {result.get('empty')}, caption-leaking "
        f"{result.get('leaks_caption')}.",
    ]
