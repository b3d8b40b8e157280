"""Keep-best: which checkpoint of a run gets exported, and the record of every evaluated checkpoint.

Run-dir files: `eval_history.json` (one entry per evaluated checkpoint, written during training), `eval_history.png`
(its plot) and `best_checkpoint.json` (the checkpoint to export and why, written at the end of training). One rule,
`select_best`, during training and at export: the highest primary-set accuracy, ties -> the secondary set, then the
later step; only checkpoints still on disk compete. `resolve_export_checkpoint` needs no training process, so a run
killed mid-way is still exported from its best evaluated checkpoint.
"""

import logging
import math
import os
import re
import time

from open_r1.errors import OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.jsonio import read_json, write_json

logger = logging.getLogger(__name__)
HISTORY_FILE = "eval_history.json"
HISTORY_PLOT = "eval_history.png"
BEST_FILE = "best_checkpoint.json"


def selection_rule(primary, secondary) -> str:
    return f"highest {primary} accuracy, ties -> {secondary or '-'} accuracy, then the later step"


_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def has_weights(path: str) -> bool:
    """A loadable model dir: config + full weights, or a LoRA adapter."""

    def exists(*names):  # any of them
        return any(os.path.isfile(os.path.join(path, name)) for name in names)

    if exists("adapter_config.json"):  # (no dir: no file either)
        return exists("adapter_model.safetensors", "adapter_model.bin")
    return exists("config.json") and exists("model.safetensors", "model.safetensors.index.json")


def checkpoint_step(name: str) -> int | None:
    match = _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(name)))
    return int(match.group(1)) if match else None


def checkpoint_dirs(run_dir: str) -> list[str]:
    """The `checkpoint-N` dirs of a run, newest first, complete or not."""
    if not os.path.isdir(run_dir):
        return []
    steps = sorted(
        (step, name)
        for name in os.listdir(run_dir)
        if (step := checkpoint_step(name)) is not None and os.path.isdir(os.path.join(run_dir, name))
    )
    return [os.path.join(run_dir, name) for _, name in reversed(steps)]


def complete_checkpoints(run_dir: str) -> list[str]:
    """`checkpoint-N` dirs whose save finished (the trainer writes trainer_state.json last), oldest first."""
    paths = checkpoint_dirs(run_dir)[::-1]
    return [p for p in paths if os.path.isfile(os.path.join(p, "trainer_state.json")) and has_weights(p)]


def load_history(run_dir: str) -> dict:
    data = read_json(os.path.join(run_dir, HISTORY_FILE), None)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return {"entries": []}
    return data


def score_key(entry: dict, primary: str, secondary: str | None):
    scores = entry.get("scores") or {}

    def value(name):
        v = scores.get(name) if name else None
        return -math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    return (value(primary), value(secondary) if secondary else 0.0, int(entry.get("step", 0)))


def select_best(entries: list[dict], primary: str, secondary: str | None = None, run_dir: str | None = None):
    """The best entry: max primary accuracy, ties -> secondary, then later step. With `run_dir`, only entries whose
    checkpoint is still a complete dir compete. Returns None when nothing qualifies."""
    candidates = [
        e
        for e in entries
        if run_dir is None or (e.get("checkpoint") and has_weights(os.path.join(run_dir, e["checkpoint"])))
    ]
    return max(candidates, key=lambda e: score_key(e, primary, secondary), default=None)


def history_best(run_dir: str):
    """The best entry of the run's history still on disk (or None) and the history."""
    history = load_history(run_dir)
    primary, secondary = history.get("primary"), history.get("secondary")
    if not primary:
        return None, history
    return select_best(history["entries"], primary, secondary, run_dir), history


def write_best_checkpoint(
    run_dir: str, keep_best: bool = True, final_step: int | None = None, final_model_saved: bool = True
) -> dict:
    """Record which checkpoint to export. Keep-best: the best evaluated checkpoint on disk; otherwise (or when no
    evaluated checkpoint exists) the final model in the run dir, or failing that the latest complete checkpoint."""
    record: dict = {"keep_best": bool(keep_best), "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    best, history = history_best(run_dir) if keep_best else (None, {})
    if best is not None:
        record.update(
            checkpoint=best["checkpoint"],
            step=best["step"],
            scores=best.get("scores"),
            reason="best evaluated checkpoint: " + selection_rule(history.get("primary"), history.get("secondary")),
        )
    elif final_model_saved and has_weights(run_dir):
        record.update(
            checkpoint=".",
            step=final_step,
            reason="final model" + (" (no evaluated checkpoint on disk)" if keep_best else ""),
        )
    else:
        latest = complete_checkpoints(run_dir)
        if latest:
            record.update(
                checkpoint=os.path.basename(latest[-1]),
                step=checkpoint_step(latest[-1]),
                reason="latest complete checkpoint (training stopped before the final save)",
            )
        else:
            record.update(checkpoint=None, step=final_step, reason="nothing exportable in the run dir")
    write_json(os.path.join(run_dir, BEST_FILE), record)
    target = record["checkpoint"] and os.path.normpath(os.path.join(run_dir, record["checkpoint"]))  # "." = the run dir
    logger.info(
        f"[keep-best] export target: {target} (step {record.get('step')}): {record['reason']}"
        + (f" scores={record['scores']}" if record.get("scores") else "")
    )
    return record


def resolve_export_checkpoint(run_dir: str) -> str:
    """The dir to export for `--checkpoint run_dir`: with keep-best (default) the best evaluated checkpoint on disk
    (correct even if training was killed before best_checkpoint.json), else what best_checkpoint.json names, else the
    run dir's final model, else its latest complete checkpoint."""
    if not os.path.isdir(run_dir):
        return run_dir
    record = read_json(os.path.join(run_dir, BEST_FILE), None) or {}
    keep = record.get("keep_best", True)
    if keep:
        best, history = history_best(run_dir)
        if best is not None:
            path = os.path.join(run_dir, best["checkpoint"])
            logger.info(
                f"[keep-best] exporting {best['checkpoint']} (step {best['step']}, scores {best.get('scores')}): "
                + selection_rule(history.get("primary"), history.get("secondary"))
            )
            return path
    named = record.get("checkpoint")
    if named:
        path = os.path.normpath(os.path.join(run_dir, named))
        if has_weights(path):
            if named != ".":
                logger.info(f"[keep-best] exporting {named} as recorded in {BEST_FILE}: {record.get('reason')}")
            return path
        logger.warning(f"[keep-best] warning: {BEST_FILE} names {named}, which is not on disk; falling back")
    if has_weights(run_dir):
        return run_dir
    latest = complete_checkpoints(run_dir)
    if latest:
        logger.info(f"[keep-best] no final model in {run_dir}: exporting the latest complete checkpoint {latest[-1]}")
        return latest[-1]
    return run_dir


def set_names(history: dict) -> list[str]:
    """The eval sets of a history, primary first, then secondary, then by name."""
    return sorted(
        {name for e in history.get("entries", []) for name in (e.get("scores") or {})},
        key=lambda n: (n != history.get("primary"), n != history.get("secondary"), n),
    )


def plot_history(history: dict, log_history: list[dict] | None, path: str) -> str | None:
    """accuracy vs step (one line per set, the best starred) and reward vs step, as a PNG. None if matplotlib is
    missing (the JSON is the record; the plot is a convenience)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    entries = sorted(history.get("entries", []), key=lambda e: e["step"])
    fig, (ax_acc, ax_rew) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    names = set_names(history)
    for name in names:
        points = [(e["step"], e["scores"][name]) for e in entries if name in (e.get("scores") or {})]
        ax_acc.plot(*zip(*points), marker="o", label=name)
    best = history.get("best")
    if best and history.get("primary") in (best.get("scores") or {}):
        ax_acc.plot(
            [best["step"]],
            [best["scores"][history["primary"]]],
            marker="*",
            markersize=16,
            color="gold",
            markeredgecolor="black",
            linestyle="none",
            label=f"best: step {best['step']}",
        )
    top = max([v for e in entries for v in (e.get("scores") or {}).values() if v is not None], default=0.0)
    ax_acc.set_ylim(0, min(100.0, max(5.0, top * 1.15)) if top < 100 else 101)
    ax_acc.set_ylabel("accuracy % (eval protocol)")
    ax_acc.set_title("in-training evaluation")
    ax_acc.grid(alpha=0.3)
    if names:
        ax_acc.legend(fontsize=8)
    rewards = [(e["step"], e["reward"]) for e in (log_history or []) if e.get("reward") is not None]
    if rewards:
        ax_rew.plot(*zip(*rewards), color="tab:green", alpha=0.6, label="reward (logged)")
    at_eval = [(e["step"], e["reward"]) for e in entries if e.get("reward") is not None]
    if at_eval:
        ax_rew.plot(
            *zip(*at_eval), marker="o", linestyle="none", color="tab:green", label="mean reward since previous eval"
        )
    ax_rew.set_xlabel("step")
    ax_rew.set_ylabel("reward")
    ax_rew.grid(alpha=0.3)
    if rewards or at_eval:
        ax_rew.legend(fontsize=8)
    fig.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def latest_log_history(run_dir: str) -> list[dict]:
    """log_history from the newest trainer_state.json in the run (for re-plotting after the fact)."""
    for path in reversed(complete_checkpoints(run_dir)):
        state = read_json(os.path.join(path, "trainer_state.json"), None)
        if isinstance(state, dict):
            return state.get("log_history") or []
    return []


CLI_DOC = """Scores of every evaluated checkpoint of a run: a table, and the plot redrawn (accuracy and reward vs step).

    open-r1-plot-run runs/qwen2vl_2b_counting                 # writes runs/.../eval_history.png
    open-r1-plot-run runs/qwen2vl_2b_counting --out plot.png

Reads <run>/eval_history.json (written during training by the in-training evaluation) and the reward log of the
newest checkpoint's trainer_state.json. The best checkpoint (keep-best rule: highest primary/OOD accuracy, ties ->
secondary/ID, then later step) among those still on disk is marked with '*' and is what export takes.
"""


def main(argv=None) -> int:
    setup_logging()
    parser = cli_parser("open-r1-plot-run", CLI_DOC)
    parser.add_argument("run_dir")
    parser.add_argument("--out", help=f"PNG path (default <run_dir>/{HISTORY_PLOT})")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        return error_exit(
            OpenR1Error(f"run dir {args.run_dir} does not exist; pass a training output_dir (runs/<recipe>)")
        )
    history = load_history(args.run_dir)
    if not history["entries"]:
        return error_exit(
            OpenR1Error(
                f"no evaluated checkpoints in {args.run_dir} ({HISTORY_FILE} missing or empty); "
                "train with eval_sets set"
            )
        )
    best, _ = history_best(args.run_dir)
    history["best"] = best
    names = set_names(history)
    print("| step | " + " | ".join(f"{n} %" for n in names) + " | reward | checkpoint |")
    print("|---:|" + "---:|" * len(names) + "---:|---|")
    for entry in history["entries"]:
        path = os.path.join(args.run_dir, entry["checkpoint"]) if entry.get("checkpoint") else None
        where = entry["checkpoint"] if path and has_weights(path) else "(deleted)" if path else "(not saved)"
        mark = " *" if best is not None and entry["step"] == best["step"] else ""
        scores = " | ".join(f"{entry['scores'][n]:.2f}" if n in entry.get("scores", {}) else "-" for n in names)
        reward = f"{entry['reward']:.3f}" if entry.get("reward") is not None else "-"
        print(f"| {entry['step']}{mark} | {scores} | {reward} | {where} |")
    out = args.out or os.path.join(args.run_dir, HISTORY_PLOT)
    if plot_history(history, latest_log_history(args.run_dir), out) is None:
        logger.warning("warning: matplotlib is not installed: no plot")
    else:
        print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
