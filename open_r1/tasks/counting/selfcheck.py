"""Self-check: the grader's protocol on a model dir, over any number of counting sets.

    open-r1-selfcheck                                      # the same as python selfcheck.py, from any directory
    python selfcheck.py                                    # /app/submission on /app/data/val and /app/data/ood_val
    python selfcheck.py --model submission --sets data/val data/ood_val data/compositional --limit 200
    python selfcheck.py --verify --model /app/submission   # load check only, says exactly what is wrong
    python selfcheck.py --image-root R1-V/src/eval \\
        --sets R1-V/src/eval/prompts/superclevr_test200_counting_problems.jsonl  # R1-V's SuperCLEVR-200 (docs/R1V.md)

A set is a save_to_disk dir, a hub snapshot folder (hf download --repo-type dataset ID --local-dir DIR), a .parquet,
.jsonl or .json file (R1-V's eval jsonl: image_path, question, integer ground_truth) or a hub id; rows whose gold is
not a count (CoGenT-B's yes/no questions) are left out, their number in the report.

Protocol (open_r1/tasks/counting/protocol.py): "{question} First output the thinking process in <think> </think>
and final answer (number) in <answer> </answer> tags." after the image, greedy, max_new_tokens=256, the model's own
saved processor and generation config, first <answer>N</answer> match, integer equality. Prints a table per set
(accuracy, format rate, mean completion tokens, truncated %) and the mean over sets; writes JSON with per-example
predictions.
"""

import os
import sys

# Only light modules here: --help and the argument checks answer before torch/transformers load (the rest is
# imported inside the functions that need it).
from open_r1.checks import raise_all
from open_r1.errors import OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.noise import quiet_library_noise
from open_r1.submission.install import exit_cli, settle
from open_r1.tasks import get_task, one_line
from open_r1.tasks.counting import CountingSettings

DEFAULT_MODEL = "/app/submission"
DEFAULT_SETS = ["/app/data/val", "/app/data/ood_val"]


def run_verify(model_dir: str, strict: bool, any_family: bool = False) -> int:
    """The counting submission's load check (the grader loads Qwen2VLForConditionalGeneration), or with
    `any_family` the check of a model of any supported family as its own class."""
    from open_r1.submission.verify import COUNTING_GRADER_CLASS, verify_submission  # deferred: torch

    report = verify_submission(
        model_dir, strict_answer=strict, expected_class=None if any_family else COUNTING_GRADER_CLASS
    )
    for warning in report.warnings:
        print(f"warning: {warning}")
    if not report.ok:
        for problem in report.problems:
            print(f"problem: {problem}", file=sys.stderr)
        if report.sample_completion is not None:  # only --strict's answer check failed: it loads and runs
            print(
                f"FAIL (--strict): {model_dir} loads as {report.loaded_class} and generates, but its sample answer "
                f"has no parseable <answer>N</answer>: {one_line(report.sample_completion)}. Train longer or check "
                "the chat template; without --strict this is a warning",
                file=sys.stderr,
            )
        else:
            print(f"FAIL: {model_dir} would not load or run as the grader loads it", file=sys.stderr)
        return 1
    role = "" if any_family else " (the class the counting grader loads)"
    print(f"OK: {model_dir} loads as {report.loaded_class}{role} and generates: {one_line(report.sample_completion)}")
    return 0


def check_arguments(args) -> None:
    """Bad option values, before anything loads (one error listing each)."""
    problems = []
    if args.limit is not None and args.limit < 1:
        problems.append(f"--limit must be >= 1 (examples per set), got {args.limit}; leave it out to score every row")
    if args.batch_size < 1:
        problems.append(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.device is not None:
        import torch

        kind = args.device.split(":")[0]
        if kind not in ("cuda", "cpu"):
            problems.append(f"--device {args.device!r}: use cuda, cuda:N or cpu")
        elif kind == "cuda" and not torch.cuda.is_available():
            problems.append(
                f"--device {args.device}: no GPU is visible (torch.cuda.is_available() is False); "
                "use --device cpu or leave --device out"
            )
    raise_all(problems, header="bad arguments")


def unique_set_names(paths: list[str]) -> list[str]:
    """Set names for the report: dir basenames, with parent dirs added where two sets share one (a report keeps
    every set it measured)."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    depth = [1] * len(paths)
    while True:
        names = ["/".join(p[-d:]).lstrip("/") for p, d in zip(parts, depth)]
        clashes = [i for i, n in enumerate(names) if names.count(n) > 1 and depth[i] < len(parts[i])]
        if not clashes:
            return names
        for i in clashes:
            depth[i] += 1


def load_sets(model_dir: str, sets: list[str], explicit_sets: bool, limit: int | None, settings=None) -> list:
    """Check the model dir and every set at once (one error listing each problem with its option), then every
    image the run will read; returns [(name, dataset, rows left out as no count)]. `settings`: `columns` and
    `image_root` (the command's arguments)."""
    from open_r1.checks import check_images  # deferred (datasets, PIL): --help answers without them
    from open_r1.tasks.counting.data import drop_non_counts, validate_counting_dataset  # deferred: datasets
    from open_r1.validate import dataset_problems, model_dir_problems  # deferred: torch, transformers

    task = get_task("counting", settings=settings)  # one task for every set: it keeps the sets it loads
    option = "--sets" if explicit_sets else "--sets (or --val / --ood-val)"
    problems = model_dir_problems(model_dir, "--model / SUBMISSION")
    real = [os.path.realpath(p) for p in sets]
    problems += [
        f"{path} is listed twice ({option}): each set is scored once"
        for i, path in enumerate(sets)
        if real[i] in real[:i]
    ]
    loaded = []
    for path in sets:
        found, dataset = dataset_problems(path, option, task=task)
        problems += found
        if dataset is not None:
            loaded.append((path, dataset))
    raise_all(problems)
    names, kept = unique_set_names(sets), []
    for path, dataset in loaded:
        dataset, skipped = drop_non_counts(dataset, path)
        validate_counting_dataset(dataset, path, image_check_rows=0)
        check_images(dataset, path, rows=limit)
        kept.append((names[sets.index(path)], dataset, skipped))
    return kept


def main(argv=None) -> int:
    setup_logging()
    quiet_library_noise()

    try:
        return _run(argv)
    except OpenR1Error as exc:
        return error_exit(exc)


def _run(argv=None) -> int:
    parser = cli_parser("open-r1-selfcheck", __doc__)
    parser.add_argument(
        "--model", default=os.environ.get("SUBMISSION", DEFAULT_MODEL), help="model dir to score ($SUBMISSION when set)"
    )
    parser.add_argument(
        "--sets",
        nargs="+",
        help="data sets: save_to_disk dirs, hub snapshot folders, .parquet/.jsonl/.json files, hub ids "
        "(without it: --val and --ood-val)",
    )
    parser.add_argument(
        "--columns",
        help="column names of sets in another layout: image=COL,question=COL,answer=COL (recognised without "
        "it: image/problem/solution and R1-V's image_path/question/ground_truth)",
    )
    parser.add_argument(
        "--image-root",
        help="folder that relative image paths (R1-V's ./images/x.png) start from (without it: the current "
        "directory, where R1-V's eval runs)",
    )
    parser.add_argument("--val", default=DEFAULT_SETS[0], help="in-distribution val dir")
    parser.add_argument("--ood-val", default=DEFAULT_SETS[1], help="OOD val dir")
    parser.add_argument("--limit", type=int, help="first N examples of each set (without it: every row)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=512,
        help="fastest measured on one H200 (docs/PERFORMANCE.md); halved automatically on out-of-memory",
    )
    parser.add_argument("--out", help="JSON report path (without it: <model>/selfcheck.json)")
    parser.add_argument("--verify", action="store_true", help="only check that the dir loads and generates")
    parser.add_argument("--strict", action="store_true", help="with --verify: an unparseable sample answer fails")
    parser.add_argument(
        "--any-family",
        action="store_true",
        help="with --verify: check a Qwen2.5-VL / Qwen3-VL dir as its own class, not as the counting "
        "submission (the counting grader loads Qwen2VLForConditionalGeneration)",
    )
    parser.add_argument("--device", help="cuda / cpu (without it: cuda when available)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--decoder",
        choices=["auto", "graph", "eager", "hf"],
        default="auto",
        help="graph: static cache + CUDA-graph decode step (open_r1/decoding.py, same greedy answers, "
        "faster on GPUs: docs/PERFORMANCE.md); hf: transformers generate; auto: graph on CUDA, hf on "
        "CPU",
    )
    parser.add_argument(
        "--image-device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where images are preprocessed: cpu (in a thread beside the GPU's work) or cuda "
        "(faster; pixel values may differ from the CPU's in the last bits)",
    )
    parser.add_argument(
        "--vision-attention",
        choices=["grouped", "per_image"],
        default="grouped",
        help="grouped: the vision tower's SDPA attention once per image size (the same result, "
        "faster: docs/PERFORMANCE.md); per_image: transformers' loop over the images",
    )
    args = parser.parse_args(argv)
    check_arguments(args)
    import open_r1.generation  # deferred (torch, transformers): --help and bad arguments answer without them
    from open_r1.modeling import load_model, load_processor  # deferred: torch, transformers
    from open_r1.tasks.counting.evaluate import evaluate_dataset, format_table, write_report  # deferred: torch

    settle(args.model)  # a swap cut by a power loss is completed or undone first

    if args.verify:
        return run_verify(args.model, args.strict, args.any_family)
    sets = args.sets or [args.val, args.ood_val]
    import torch  # deferred: --help and the argument checks run without it

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = CountingSettings(columns=args.columns, image_root=args.image_root)
    datasets_ = load_sets(args.model, sets, bool(args.sets), args.limit, settings)  # a DataError: main prints it
    model = load_model(args.model, dtype="auto", vision_attention=args.vision_attention).to(device).eval()
    processor = load_processor(args.model)
    open_r1.generation.DEFAULT_DECODER = args.decoder  # what evaluate_dataset's generate_texts calls use
    reports = [
        evaluate_dataset(
            model,
            processor,
            dataset,
            name=name,
            batch_size=args.batch_size,
            limit=args.limit,
            progress=not args.quiet,
            image_device="cuda" if args.image_device == "cuda" and device.startswith("cuda") else None,
        )
        for name, dataset, _ in datasets_
    ]
    print(format_table(reports))
    out = args.out or os.path.join(args.model, "selfcheck.json")
    extra = {
        "sets_paths": {name: os.path.abspath(path) for (name, _, _), path in zip(datasets_, sets)},
        "sets_rows": {name: len(dataset) for name, dataset, _ in datasets_},
        "limit": args.limit,
    }
    skipped = {name: {"skipped_non_count": count} for name, _, count in datasets_}
    try:
        write_report(out, reports, args.model, extra, skipped)
    except OSError:
        out = os.path.abspath("selfcheck.json")
        write_report(out, reports, args.model, extra, skipped)
    print(f"report: {out}")
    return 0


def cli(argv=None) -> None:  # open-r1-selfcheck, selfcheck.py: a signal in the interpreter's exit keeps the status
    exit_cli(main, argv)


if __name__ == "__main__":
    cli()
