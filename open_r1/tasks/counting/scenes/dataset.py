"""Dataset splits of rendered scenes: ``build_split`` (one ``datasets.Dataset``) and ``write_splits`` (to disk).

Each split fixes a renderer and CoGenT condition (``SPLITS``). Columns: image (PNG), problem (the question),
solution (``<answer> N </answer>``) and scene (JSON: objects with attributes, pose, visible box and pixel count;
camera, lights and the question). Example ``i`` renders from ``SeedSequence(seed, spawn_key=(split_stream, i, 0))``
and draws its question from ``(split_stream, i, 1)``: images depend on neither the number of workers, ``n`` nor
the question mode, and no two splits share a stream. ``write_splits`` also refuses two examples of one scene.
"""

import contextlib
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from open_r1.checks import is_int
from open_r1.errors import SceneArgumentError
from open_r1.submission.install import installing

from .png import encode_png
from .questions import format_solution, make_question, resolve_question_kinds
from .render import parse_image_size, render_scene, scene_fingerprint, validate_scene_args

logger = logging.getLogger(__name__)

SPLITS: dict[str, tuple[str, str | None]] = {
    "train": ("clevr", "A"),
    "val": ("clevr", "A"),
    "compositional": ("clevr", "B"),
    "ood_val": ("ood", None),
    # OOD-renderer scenes for *other* training than counting supervision (the retired proxy warm start's exposure rows,
    # experiments/LOG.md); never part of an evaluation.
    "ood_train": ("ood", None),
}
# Independent seed streams per split (never reuse or renumber: it would change every published split).
_SPLIT_STREAM = {"train": 0, "val": 1, "compositional": 2, "ood_val": 3, "ood_train": 4}
# zlib level for open_r1/tasks/counting/scenes/png.py: about 1.5 ms and 33 KB per 480x320 image.
PNG_COMPRESS_LEVEL = 3


def features():
    import datasets  # deferred: heavy

    text = datasets.Value("string")
    return datasets.Features({"image": datasets.Image(), "problem": text, "solution": text, "scene": text})


def example_seeds(seed: int, split: str, index: int) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """(scene seed, question seed) of one example."""
    key = (_SPLIT_STREAM[split], int(index))
    return np.random.SeedSequence(seed, spawn_key=key + (0,)), np.random.SeedSequence(seed, spawn_key=key + (1,))


@dataclass(frozen=True)
class SplitJob:
    """Everything that determines a split's content (validated)."""

    split: str
    n: int
    seed: int
    kinds: tuple[str, ...]
    image_size: tuple[int, int]
    min_objects: int
    max_objects: int


def make_job(
    split: str,
    n: int,
    seed: int = 0,
    questions: str | Sequence[str] = "default",
    image_size: Any = None,
    min_objects: int = 3,
    max_objects: int = 10,
) -> SplitJob:
    """Validate a split request; raises SceneArgumentError with the fix in the message."""
    if split not in SPLITS:
        raise SceneArgumentError(f"unknown split {split!r}; choose from: {', '.join(SPLITS)}")
    if not is_int(n) or n < 1:
        raise SceneArgumentError(f"split {split!r} needs n >= 1 examples, got {n!r}")
    if not is_int(seed) or seed < 0:
        raise SceneArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    renderer, condition = SPLITS[split]
    validate_scene_args(renderer, condition, min_objects, max_objects)
    kinds = resolve_question_kinds(questions, renderer)
    size = parse_image_size(image_size, renderer)
    return SplitJob(split, int(n), int(seed), kinds, size, int(min_objects), int(max_objects))


def make_example(job: SplitJob, index: int) -> dict:
    """One dataset row: PNG bytes, question, gold solution and scene JSON."""
    scene_seed, question_seed = example_seeds(job.seed, job.split, index)
    renderer, condition = SPLITS[job.split]
    image, scene, _ = render_scene(scene_seed, renderer, condition, job.image_size, job.min_objects, job.max_objects)
    question, answer, meta = make_question(np.random.default_rng(question_seed), scene, job.kinds)
    scene["question"] = {**meta, "text": question, "answer": answer}
    scene["source"] = {"split": job.split, "index": int(index), "seed": job.seed}
    return {
        "image": {"bytes": encode_png(np.asarray(image), PNG_COMPRESS_LEVEL), "path": None},
        "problem": question,
        "solution": format_solution(answer),
        "scene": json.dumps(scene, separators=(",", ":")),
    }


def _limit_blas_threads() -> None:
    """Worker initializer: one BLAS thread per worker process (the workers already use every core)."""
    try:
        from threadpoolctl import threadpool_limits  # optional; the CLI sets OPENBLAS_NUM_THREADS instead
    except ImportError:
        return
    threadpool_limits(1)


def _pool_context():
    # fork starts workers instantly and needs no `if __name__ == "__main__"` guard in user scripts.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


_generated_jobs: set = set()  # jobs rendered by this process (vs. reused from the datasets cache)


def iter_examples(job: SplitJob, workers: int = 1, progress: bool = True) -> Iterator[dict]:
    """Rows 0..n-1 of a split, in order, rendered by ``workers`` processes, with a tqdm bar."""
    from tqdm.auto import tqdm  # deferred with datasets, which brings it

    _generated_jobs.add(job)
    workers = max(1, min(int(workers), job.n))
    render_one = functools.partial(make_example, job)
    bar = tqdm(total=job.n, desc=job.split, unit="img", disable=not progress, file=sys.stderr)
    with bar, contextlib.ExitStack() as stack:
        rows = map(render_one, range(job.n))
        if workers > 1:
            pool = stack.enter_context(_pool_context().Pool(workers, initializer=_limit_blas_threads))
            rows = pool.imap(render_one, range(job.n), chunksize=max(1, min(16, job.n // (workers * 4))))
        for row in rows:
            yield row
            bar.update()


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """Hash of this package's source: a cached split is reused only if the code that made it is unchanged."""
    digest = hashlib.sha1()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _job_fingerprint(job: SplitJob) -> str:
    payload = json.dumps([job.__dict__, PNG_COMPRESS_LEVEL, _code_version()], sort_keys=True, default=list)
    return "open-r1-scenes-" + hashlib.sha1(payload.encode()).hexdigest()[:20]


@contextlib.contextmanager
def _datasets_bars_off():
    """Silence datasets' own progress bars (ours is the one to watch), restoring the caller's setting after."""
    import datasets  # deferred: heavy

    were_on = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_on:
            datasets.enable_progress_bars()


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the worker pool; Windows counts no children)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _generate(job: SplitJob, workers: int, progress: bool, cache_dir: str | os.PathLike | None):
    """(Dataset, timing stats). Rows stream into Arrow files under ``cache_dir`` (never all in memory).

    Stats: n, seconds (wall clock, rendering through Arrow writing), images_per_s, and images_per_cpu_s (CPU time
    summed over all processes: what one core renders per second of its time, meaningful on a busy machine).
    """
    import datasets  # deferred: heavy

    _generated_jobs.discard(job)
    cpu_start, start = _cpu_seconds(), time.perf_counter()
    with _datasets_bars_off():
        dataset = datasets.Dataset.from_generator(
            iter_examples,
            features=features(),
            gen_kwargs={"job": job, "workers": workers, "progress": progress},
            cache_dir=None if cache_dir is None else str(cache_dir),
            fingerprint=_job_fingerprint(job),
        )
    seconds, cpu_seconds = time.perf_counter() - start, _cpu_seconds() - cpu_start
    per_cpu_s = job.n / cpu_seconds if cpu_seconds else None
    timing = {"n": job.n, "seconds": seconds, "images_per_s": job.n / seconds, "images_per_cpu_s": per_cpu_s}
    if progress and job not in _generated_jobs:
        logger.info(f"{job.split}: {job.n} images reused from the datasets cache (same request, same code)")
    elif progress:
        per_core = f", {per_cpu_s:.1f} images per CPU-second" if per_cpu_s else ""
        logger.info(
            f"{job.split}: {job.n} images in {seconds:.1f} s = {timing['images_per_s']:.1f} images/s{per_core} "
            f"({workers} worker{'s' if workers != 1 else ''}, {job.image_size[0]}x{job.image_size[1]})"
        )
    return dataset, timing


def _resolve_workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if not is_int(workers) or workers < 1:
        raise SceneArgumentError(f"workers must be a positive integer, got {workers!r}")
    return int(workers)


def build_split(
    split: str,
    n: int,
    seed: int = 0,
    questions: str | Sequence[str] = "default",
    image_size: Any = None,
    workers: int = 1,
    progress: bool = True,
    *,
    min_objects: int = 3,
    max_objects: int = 10,
    cache_dir: str | os.PathLike | None = None,
):
    """Render a split as a ``datasets.Dataset``, its Arrow files in ``cache_dir`` (default: the datasets cache),
    where an identical request with unchanged code reuses them."""
    job = make_job(split, n, seed, questions, image_size, min_objects, max_objects)
    dataset, _ = _generate(job, _resolve_workers(workers), progress, cache_dir)
    return dataset


def assert_disjoint(fingerprints: dict[str, Iterable[str]]) -> None:
    """Raise AssertionError if any scene fingerprint occurs twice, within or across splits."""
    owner: dict[str, str] = {}
    clashes: Counter = Counter()
    for split, prints in fingerprints.items():
        for fingerprint in prints:
            if fingerprint in owner:
                clashes[owner[fingerprint], split] += 1
            else:
                owner[fingerprint] = split
    if clashes:
        detail = ", ".join(f"{a}/{b}: {count}" for (a, b), count in sorted(clashes.items()))
        raise AssertionError(f"splits share scenes ({detail}); every example must be a distinct scene")


def write_splits(
    out_dir: str | os.PathLike,
    sizes: dict[str, int],
    seed: int = 0,
    overwrite: bool = False,
    workers: int | None = None,
    questions: str | Sequence[str] = "default",
    image_size: Any = None,
    ood_image_size: Any = None,
    *,
    min_objects: int = 3,
    max_objects: int = 10,
    progress: bool = True,
    stats: dict | None = None,
) -> dict[str, Path]:
    """Write ``out_dir/<split>/`` (``save_to_disk``) for each split in ``sizes`` ({split: n}); ``image_size`` for
    the clevr splits, ``ood_image_size`` for the ood ones (None: the renderer's default).

    Everything is validated before anything is written. Splits render into a staging directory beside ``out_dir``,
    are checked to share no scene, and only then move into place: a crash never leaves a half-written split.
    ``overwrite=True`` replaces the named splits and keeps the rest of ``out_dir``. ``stats``, if given, receives
    {split: {"n", "seconds", "images_per_s", "images_per_cpu_s", "path"}} (see ``_generate``).
    """
    if not isinstance(sizes, dict) or not sizes:
        raise SceneArgumentError(f"sizes must be a non-empty {{split: n}} dict, e.g. {{'train': 2000}}; got {sizes!r}")
    jobs = {}
    for split, n in sizes.items():
        size = ood_image_size if SPLITS.get(split, ("",))[0] == "ood" else image_size
        jobs[split] = make_job(split, n, seed, questions, size, min_objects, max_objects)
    workers = _resolve_workers(workers)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise SceneArgumentError(
            f"output directory {out} already exists; pass --overwrite (overwrite=True) to replace "
            "its splits, or choose a new --out"
        )
    if out.exists() and not out.is_dir():
        raise SceneArgumentError(f"output path {out} exists and is not a directory; choose another --out")

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    written: dict[str, Path] = {}
    fingerprints, timings = {}, {}
    try:
        for split, job in jobs.items():
            cache = staging / ".cache" / split
            dataset, timings[split] = _generate(job, workers, progress, cache)
            with _datasets_bars_off():
                dataset.save_to_disk(str(staging / split))
            fingerprints[split] = [scene_fingerprint(scene) for scene in dataset["scene"]]
            del dataset
            shutil.rmtree(cache, ignore_errors=True)
        assert_disjoint(fingerprints)
        out.mkdir(exist_ok=True)
        for split in jobs:
            target = out / split
            with installing(target) as empty:  # atomic, locked, recovered after a kill
                os.replace(staging / split, empty)
            written[split] = target
            if stats is not None:
                stats[split] = {**timings[split], "path": str(target)}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
