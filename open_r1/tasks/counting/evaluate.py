"""The grader's protocol, run locally (selfcheck, in-training evaluation, tests): the EVAL template after the image,
greedy, `max_new_tokens=256`, the model's own processor and generation config, first `<answer>N</answer>` by integer
equality. Batches are left-padded (right padding shifts Qwen2-VL's M-RoPE positions), sorted by question length, and
the next batch's CPU work runs in a thread while the current one generates; results come back in dataset order.
"""

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from open_r1.generation import generate_texts, prepare_inputs, resolve_decoder
from open_r1.images import decode_images, lazy_image_column
from open_r1.jsonio import write_json
from open_r1.tasks.counting import protocol

logger = logging.getLogger(__name__)


@dataclass
class SetReport:
    name: str
    n: int
    accuracy_pct: float
    format_pct: float
    mean_completion_tokens: float
    truncated_pct: float
    seconds: float
    records: list[dict] = field(default_factory=list, repr=False)

    @property
    def score(self) -> float:
        """What keep-best ranks checkpoints by: the grader's accuracy."""
        return self.accuracy_pct

    def summary(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key != "records"}


def report_from_records(name: str, records: list[dict], seconds: float) -> SetReport:
    """A SetReport over per-example records (e.g. gathered from several ranks)."""
    n = len(records)

    def pct(flag):
        return 100.0 * sum(bool(flag(r)) for r in records) / max(n, 1)

    return SetReport(
        name=name,
        n=n,
        accuracy_pct=pct(lambda r: r["correct"]),
        format_pct=pct(lambda r: r["prediction"] is not None),
        mean_completion_tokens=sum(r["completion_tokens"] for r in records) / max(n, 1),
        truncated_pct=pct(lambda r: r["truncated"]),
        seconds=seconds,
        records=records,
    )


def _prompt_texts(processor, questions: list[str], template: str) -> list[str]:
    messages = [protocol.build_messages(q, template) for q in questions]
    return [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]


def generate_batch(
    model, processor, images, questions, template=protocol.EVAL_TEMPLATE, max_new_tokens=protocol.EVAL_MAX_NEW_TOKENS
):
    """Greedy protocol completions for one batch. Returns (texts, completion token counts, truncated flags)."""
    return generate_texts(model, processor, _prompt_texts(processor, questions, template), images, max_new_tokens)


def evaluate_dataset(
    model,
    processor,
    dataset,
    name="eval",
    batch_size=32,
    limit=None,
    template=protocol.EVAL_TEMPLATE,
    max_new_tokens=protocol.EVAL_MAX_NEW_TOKENS,
    progress=True,
    compile_generation=False,
    extract=protocol.extract_answer,
    prefetch=True,
    image_device=None,
    timings: list | None = None,
    cpu_positions: bool = True,
) -> SetReport:
    """Run the protocol over a counting dataset (columns image, problem, solution).

    `template` / `extract`: the grader's unless a diagnostic swaps them (the plain-question probe). `prefetch`: build
    the next batch in a thread (same inputs). `image_device='cuda'`: preprocess on the GPU (faster; pixel values may
    differ in the last bits). `cpu_positions`: for the graph decoder, compute the prefill's M-RoPE positions with the
    batch's CPU work (`decoding.rope_positions`; the same positions). `timings`: gets one dict per batch for benches
    (rows, built 'here'/'ahead', wait_s, generate_s, post_s). A batch out of GPU memory is split in two and the rest
    of the set runs at the smaller size (a warning says so)."""
    import torch  # deferred: heavy libraries
    from tqdm.auto import tqdm

    n = len(dataset) if limit is None else min(limit, len(dataset))
    questions = list(dataset["problem"][:n]) if n else []
    golds = [protocol.parse_gold(s) for s in dataset["solution"][:n]]
    # Sort by question length to keep text padding small (images are decoded lazily, batch by batch).
    order = sorted(range(n), key=lambda i: len(questions[i]))
    records: list[dict | None] = [None] * n
    start = time.perf_counter()
    bar = tqdm(total=n, desc=f"selfcheck {name}", disable=not progress, unit="ex")
    pending = [order[begin : begin + batch_size] for begin in range(0, n, batch_size)]
    device = getattr(model, "device", torch.device("cpu"))

    dataset = lazy_image_column(dataset)  # decoded batch by batch, in threads (a metadata change)

    # only the graph decoder takes precomputed positions (HF generate computes its own)
    precompute_positions = (
        cpu_positions and image_device is None and not compile_generation and resolve_decoder(None, device) != "hf"
    )

    def build(index):  # the processor's batch for the rows `index` (CPU work; images decoded here in threads)
        rows = decode_images([{"image": image} for image in dataset.select(index)["image"]])
        texts = _prompt_texts(processor, [questions[i] for i in index], template)
        images = [row["image"].convert("RGB") for row in rows]
        return prepare_inputs(
            processor,
            texts,
            images,
            image_device=image_device,
            pin_memory=device.type == "cuda" and image_device is None,
            rope_model=model if precompute_positions else None,
        )

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="selfcheck-prefetch") if prefetch else None
    ahead = None  # (index list, future of its inputs): the next batch, being built
    try:
        while pending:
            index = pending.pop(0)
            waited = time.perf_counter()
            if ahead is not None and ahead[0] is index:
                inputs, built = ahead[1].result(), "ahead"
            else:  # the GPU waits for this batch
                inputs, built = build(index), "here"
            waited = time.perf_counter() - waited
            ahead = (pending[0], pool.submit(build, pending[0])) if pool is not None and pending else None
            generating = time.perf_counter()
            try:
                texts, lengths, truncated = generate_texts(
                    model, processor, None, None, max_new_tokens, compile_generation=compile_generation, inputs=inputs
                )
            except torch.OutOfMemoryError:
                if len(index) == 1:
                    raise
                batch_size = (len(index) + 1) // 2
                rest = [i for chunk in [index, *pending] for i in chunk]
                pending = [rest[begin : begin + batch_size] for begin in range(0, len(rest), batch_size)]
                ahead = None  # built for the old batch size: dropped
                del inputs
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                logger.warning(
                    f"[selfcheck] warning: out of GPU memory at batch {len(index)}; continuing at batch "
                    f"{batch_size} (pass --batch-size {batch_size} to start there)"
                )
                continue
            del inputs
            posting = time.perf_counter()
            for i, text, length, cut in zip(index, texts, lengths, truncated):
                prediction = extract(text)
                records[i] = {
                    "index": i,
                    "question": questions[i],
                    "gold": golds[i],
                    "prediction": prediction,
                    "correct": prediction is not None and prediction == golds[i],
                    "completion_tokens": length,
                    "truncated": bool(cut),
                    "completion": text,
                }
            if timings is not None:
                timings.append(
                    {
                        "rows": len(index),
                        "built": built,
                        "wait_s": waited,
                        "generate_s": posting - generating,
                        "post_s": time.perf_counter() - posting,
                    }
                )
            bar.update(len(index))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    seconds = time.perf_counter() - start
    return report_from_records(name, [r for r in records if r is not None], seconds)


def format_table(reports: list[SetReport]) -> str:
    """Markdown table, one row per set, and the mean accuracy over sets (the score the grader reports)."""
    header = (
        "| set | n | accuracy % | format % | mean tokens | truncated % | seconds |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {r.name} | {r.n} | {r.accuracy_pct:.2f} | {r.format_pct:.2f} | {r.mean_completion_tokens:.1f} | "
        f"{r.truncated_pct:.2f} | {r.seconds:.1f} |"
        for r in reports
    ]
    mean = mean_accuracy(reports)
    rows.append(f"| **mean** | | **{mean:.2f}** | | | | |")
    return "\n".join([header, *rows])


def mean_accuracy(reports: list[SetReport]) -> float:
    return sum(r.accuracy_pct for r in reports) / len(reports) if reports else math.nan


def write_report(
    path: str, reports: list[SetReport], model_dir: str, extra: dict | None = None, per_set: dict | None = None
) -> None:
    """The JSON report: the protocol, the mean, per set its numbers (and `per_set[name]`'s) and records."""
    payload = {
        "model": model_dir,
        "protocol": {
            "template": protocol.EVAL_TEMPLATE,
            "regex": protocol.ANSWER_RE.pattern,
            "max_new_tokens": protocol.EVAL_MAX_NEW_TOKENS,
            "decoding": "greedy",
        },
        "mean_accuracy_pct": mean_accuracy(reports),
        "sets": {r.name: {**r.summary(), **(per_set or {}).get(r.name, {}), "records": r.records} for r in reports},
        **(extra or {}),
    }
    write_json(path, payload)
