"""Command line of the scene generator (``open-r1-scenes`` = ``python -m open_r1.tasks.counting.scenes``).

Writes the splits (one ``save_to_disk`` folder per split under ``--out``) and prints a throughput table;
``--preview N`` instead renders N PNG files of one ``--renderer``. Bad arguments: one ``error:`` line, status 2.
"""

import argparse
import os

# One BLAS thread per process (must be set before numpy loads): the generator parallelises over processes, and
# numpy's small matrix products run slower, not faster, with several threads.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# after the BLAS setting above, like numpy's users below
from open_r1.errors import SceneArgumentError, cli_parser, error_exit, setup_logging, user_error  # noqa: E402
from open_r1.jsonio import write_json  # noqa: E402
from open_r1.submission.install import check_target  # noqa: E402

from .dataset import SPLITS, write_splits  # noqa: E402
from .render import parse_image_size, render_scene, validate_scene_args  # noqa: E402

DEFAULT_SIZES = {"train": 2000, "val": 200, "compositional": 200, "ood_val": 200, "ood_train": 200}
DEFAULT_SPLITS = ("train", "val", "compositional", "ood_val")  # ood_train only when --splits names it
SPLIT_FLAGS = {split: "--" + split.replace("_", "-") for split in DEFAULT_SIZES}  # ood_val -> --ood-val
SAMPLES_PER_SPLIT = 4


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's default prints the whole usage block first
        raise SceneArgumentError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = cli_parser(
        "open-r1-scenes",
        "Render CLEVR-style counting splits (train/val: CoGenT A, compositional: B, ood_val: vehicles).",
        parser_class=_Parser,
    )
    parser.add_argument("--out", required=True, help="output directory; gets one save_to_disk folder per split")
    for split, flag in SPLIT_FLAGS.items():
        parser.add_argument(flag, type=int, default=DEFAULT_SIZES[split], metavar="N", help=f"examples in {split}")
    parser.add_argument(
        "--splits",
        default=",".join(DEFAULT_SPLITS),
        help="comma-separated splits to write (ood_train, OOD-renderer scenes for non-evaluation use, only when named)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the scenes are a pure function of the seed")
    parser.add_argument("--workers", type=int, help="processes (default: all cores)")
    parser.add_argument(
        "--questions", default="default", help="default | mixed | a comma-separated list of total,different,filtered"
    )
    parser.add_argument("--image-size", metavar="WxH", help="clevr splits (default 480x320)")
    parser.add_argument("--ood-image-size", metavar="WxH", help="ood_val and ood_train (default 640x480)")
    parser.add_argument("--min-objects", type=int, default=3, help="fewest objects in a scene")
    parser.add_argument("--max-objects", type=int, default=10, help="most objects in a scene")
    parser.add_argument("--overwrite", action="store_true", help="replace the named splits if --out exists")
    parser.add_argument(
        "--samples",
        metavar="DIR",
        help=f"also save the first {SAMPLES_PER_SPLIT} images of each split as DIR/<split>_<i>.png",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--preview",
        type=int,
        metavar="N",
        help="instead of splits: render N PNGs of --renderer into --out",
    )
    parser.add_argument("--renderer", default="clevr", help="for --preview: clevr | ood")
    parser.add_argument("--condition", default="A", help="for --preview with clevr: CoGenT condition A | B")
    return parser


def _questions_arg(text: str):
    return text if text in ("default", "mixed") else [part.strip() for part in text.split(",") if part.strip()]


def _run_splits(args) -> int:
    names = [name.strip() for name in args.splits.split(",") if name.strip()]
    for name in names:
        if name not in SPLITS:
            raise SceneArgumentError(f"unknown split {name!r} in --splits; choose from: {', '.join(SPLITS)}")
    if not names:
        raise SceneArgumentError(f"--splits is empty; name at least one of: {', '.join(SPLITS)}")
    sizes = {name: getattr(args, name) for name in names}
    for name, n in sizes.items():
        if n < 1:
            raise SceneArgumentError(
                f"{SPLIT_FLAGS[name]} must be at least 1 (got {n}); to skip the split, leave it out of --splits"
            )
    check_target(args.out, "--out", "--out")  # before minutes of rendering: writable, not /, $HOME or the repo
    stats: dict = {}
    paths = write_splits(
        args.out,
        sizes,
        seed=args.seed,
        overwrite=args.overwrite,
        workers=args.workers,
        questions=_questions_arg(args.questions),
        image_size=args.image_size,
        ood_image_size=args.ood_image_size,
        min_objects=args.min_objects,
        max_objects=args.max_objects,
        progress=not args.no_progress,
        stats=stats,
    )
    rows = []
    for split, path in paths.items():
        per_core = stats[split]["images_per_cpu_s"]
        per_core = "n/a" if per_core is None else f"{per_core:.1f}"
        rows.append((split, str(stats[split]["n"]), f"{stats[split]['images_per_s']:.1f}", per_core, str(path)))
    # images/s: wall clock with all workers; per CPU-s: what one core renders per second of its time.
    header = ("split", "n", "images/s", "images/CPU-s", "path")
    widths = [max(map(len, column)) for column in zip(header, *rows)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    if args.samples:
        _save_samples(args.samples, paths)
    return 0


def _save_samples(directory: str, paths: dict) -> None:
    import datasets  # deferred: heavy, and only for --samples

    os.makedirs(directory, exist_ok=True)
    for split, path in paths.items():
        dataset = datasets.load_from_disk(str(path))
        for i in range(min(SAMPLES_PER_SPLIT, len(dataset))):
            dataset[i]["image"].save(os.path.join(directory, f"{split}_{i}.png"), optimize=True)
    print(f"samples: {directory}")


def _run_preview(args) -> int:
    if args.preview < 1:
        raise SceneArgumentError(f"--preview must be at least 1 (got {args.preview})")
    validate_scene_args(args.renderer, args.condition, args.min_objects, args.max_objects)
    size = parse_image_size(args.ood_image_size if args.renderer == "ood" else args.image_size, args.renderer)
    if os.path.exists(args.out) and not args.overwrite:
        raise SceneArgumentError(f"output directory {args.out} already exists; pass --overwrite, or choose a new --out")
    os.makedirs(args.out, exist_ok=True)
    scenes = []
    for i in range(args.preview):
        seed = args.seed * 1_000_003 + i
        image, scene, _ = render_scene(seed, args.renderer, args.condition, size, args.min_objects, args.max_objects)
        image.save(os.path.join(args.out, f"{args.renderer}_{i}.png"))
        scenes.append(scene)
    write_json(os.path.join(args.out, "scenes.json"), scenes)
    print(f"wrote {args.preview} images to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    try:
        args = build_parser().parse_args(argv)
        return _run_preview(args) if args.preview is not None else _run_splits(args)
    except Exception as exc:  # a render worker's error arrives wrapped by multiprocessing and `datasets`
        found = user_error(exc)
        if found is None:
            raise
        return error_exit(found)
