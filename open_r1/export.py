r"""Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python scripts/export_submission.py --checkpoint runs/demo/grpo --out submission
    python scripts/export_submission.py --checkpoint runs/lora/checkpoint-300 \
        --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json); the processor
keeps the training vision-token budget. Given a run dir, the keep-best checkpoint is exported (the best in-training OOD
score, open_r1/run/keep_best.py), else the final model, and the export time is recorded for the next round's budget.
The result is verified (loads with Qwen2VLForConditionalGeneration and generates) in a temp dir beside --out, with
modes 0755/0644, then swapped in atomically (docs/GUARANTEES.md); a replaced submission is kept as
<out>.prev-<timestamp>. A submission holding its selfcheck report (selfcheck.json) is never replaced without
--replace: the new model goes to <out>.candidate-<timestamp> and the commands to score and promote it are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch
from peft import PeftModel

from open_r1 import modeling
from open_r1.checks import check_checkpoint, weights_problems, writable_problem
from open_r1.errors import CliHelp, ExportError, OpenR1Error, error_exit
from open_r1.families import FAMILIES
from open_r1.jsonio import read_json, write_json
from open_r1.noise import quiet_library_noise
from open_r1.run.budget import record_export_seconds
from open_r1.run.keep_best import resolve_export_checkpoint
from open_r1.run.resume import find_resume_checkpoint
from open_r1.tasks import get_task

TRAINING_META_FILE = "training_meta.json"
REPORT_FILE = "selfcheck.json"  # a scored submission's selfcheck report
# The class the counting grader loads; other families verify as their own class (`expected_class=None`).
COUNTING_GRADER_CLASS = "Qwen2VLForConditionalGeneration"


@dataclass
class VerifyReport:
    path: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sample_completion: str | None = None
    loaded_class: str | None = None  # the transformers class the dir loaded as

    @property
    def ok(self) -> bool:
        return not self.problems


def _read_meta(checkpoint: str) -> dict:
    for folder in (checkpoint, os.path.dirname(os.path.abspath(checkpoint))):  # or checkpoint-N/'s run dir
        path = os.path.join(folder, TRAINING_META_FILE)
        if os.path.isfile(path):
            return read_json(path)
    return {}


def load_for_export(checkpoint: str, base_model: str | None = None):
    """The full model from a checkpoint dir: full weights as saved, or base + LoRA adapter merged."""
    adapter_config = os.path.join(checkpoint, "adapter_config.json")
    if not os.path.isfile(adapter_config):
        return modeling.load_model(checkpoint, dtype="auto", attn_implementation="sdpa"), checkpoint
    base = (
        base_model
        or _read_meta(checkpoint).get("base_model")
        or read_json(adapter_config).get("base_model_name_or_path")
    )
    if not base:
        raise ExportError(f"{checkpoint} is a LoRA adapter with no recorded base model; pass --base-model")
    model = modeling.load_model(base, dtype="auto", attn_implementation="sdpa")
    return PeftModel.from_pretrained(model, checkpoint).merge_and_unload(), base


def architecture_problems(config: dict, expected_class: str | None) -> list[str]:
    """What is wrong with config.json's model_type / architectures for a grader that loads `expected_class`
    (None: any supported family, loaded as its own class)."""
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    family = FAMILIES.get(model_type or "")
    if family is None:
        needs = (
            f"the grader loads {expected_class}"
            if expected_class
            else "supported families: " + ", ".join(f"{f.model_type} ({f.class_name})" for f in FAMILIES.values())
        )
        return [
            f"wrong architecture: config.json says model_type={model_type!r}, architectures={architectures}; {needs}"
        ]
    if family.class_name not in architectures:
        return [
            f"wrong architecture: config.json says model_type={model_type!r} ({family.name}) but architectures="
            f"{architectures}, not {family.class_name}; re-save the model with save_pretrained"
        ]
    if expected_class and family.class_name != expected_class:
        return [
            f"wrong architecture for the counting submission: this is a {family.name} checkpoint "
            f"({family.class_name}); the counting grader loads {expected_class} (a Qwen2-VL model), which cannot "
            f"load it. Submit a Qwen2-VL model for counting, or check it as a {family.name} model of its own "
            "(selfcheck.py --verify --any-family / export --any-family)"
        ]
    return []


def verify_submission(
    path: str,
    generate: bool = True,
    strict_answer: bool = False,
    expected_class: str | None = COUNTING_GRADER_CLASS,
    task: str = "counting",
) -> VerifyReport:
    """Check a model dir the way the grader loads it (as `expected_class`; None: as its own family's class); with
    `generate`, load it and write one greedy completion under `task`'s protocol (its `probe`): output off the format
    is a warning, or a problem with `strict_answer`. Never raises for a bad dir: it reports."""
    if not os.path.isdir(path):
        return VerifyReport(path, [f"{path} does not exist"])
    adapter = os.path.isfile(os.path.join(path, "adapter_config.json"))
    if not os.path.isfile(os.path.join(path, "config.json")):
        return VerifyReport(
            path,
            [
                f"{path} is a LoRA adapter (adapter_config.json, no config.json), not a full model; "
                f"merge it with python -m open_r1.export --checkpoint {path} --out <dir>"
                if adapter
                else "config.json is missing: not a saved transformers model"
            ],
        )
    report = VerifyReport(path, architecture_problems(read_json(os.path.join(path, "config.json")), expected_class))
    if adapter:
        report.problems.append("adapter_config.json present: a LoRA adapter must be merged into full weights")
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        report.problems.append("processor file preprocessor_config.json is missing: save the processor too")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(path, name)):
            report.problems.append(f"tokenizer file {name} is missing: save the tokenizer (processor.save_pretrained)")
    templates = [n for n in ("chat_template.jinja", "chat_template.json") if os.path.isfile(os.path.join(path, n))]
    if not templates and "chat_template" not in (read_json(os.path.join(path, "tokenizer_config.json"), None) or {}):
        report.problems.append("chat template is missing (chat_template.jinja): the prompt cannot be built")
    if not os.path.isfile(os.path.join(path, "generation_config.json")):
        report.warnings.append("generation_config.json is missing: eos ids fall back to config.json")
    report.problems.extend(weights_problems(path))
    if report.problems or not generate:
        return report
    probe = get_task(task).probe  # an unknown task fails here, before the model loads
    step = "loading"
    try:
        model = modeling.load_model(path, dtype="auto", attn_implementation="sdpa")
        report.loaded_class = type(model).__name__
        if torch.cuda.is_available():  # a 2B model generates 256 tokens in seconds on a GPU, minutes on a CPU
            model = model.to("cuda")
        processor = modeling.load_processor(path)
        step = "generation"
        text, message = probe(model, processor)
    except Exception as exc:  # noqa: BLE001 - every load or generation failure is a finding
        report.problems.append(f"{step} failed: {type(exc).__name__}: {exc}")
        return report
    report.sample_completion = text
    if message:
        (report.problems if strict_answer else report.warnings).append(message)
    return report


def report_set_paths(report: dict) -> dict:
    """{set name: real path} from a selfcheck report's sets_paths (a list in the order of its sets)."""
    paths = report.get("sets_paths")
    if isinstance(paths, dict):
        return {name: os.path.realpath(p) for name, p in paths.items()}
    if isinstance(paths, list) and len(paths) == len(report.get("sets") or ()):
        return {name: os.path.realpath(p) for name, p in zip(report["sets"], paths)}
    return {}


def export_submission(
    checkpoint: str,
    out: str,
    base_model: str | None = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    verify: bool = True,
    log=print,
    replace_scored: bool = False,
    expected_class: str | None = COUNTING_GRADER_CLASS,
) -> VerifyReport:
    """Merge (if LoRA), save and verify beside `out`, then swap it in (`swap_in`). A scored `out` (holding its
    selfcheck.json) is kept unless `replace_scored`: the new model goes beside it as `<out>.candidate-<time>`
    (report.path). `expected_class`: as in `verify_submission`."""
    if not os.path.isdir(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} does not exist; train first (bash train.sh) or pass --checkpoint")
    out = os.path.abspath(out.rstrip("/") or out)
    problem = writable_problem(out)
    if problem:
        raise ExportError(f"cannot write the submission: {problem} (--out / SUBMISSION)")
    problem = check_checkpoint(checkpoint)
    if problem:
        run_dir = os.path.dirname(os.path.abspath(checkpoint.rstrip("/")))
        loadable = (
            find_resume_checkpoint(run_dir)
            if os.path.basename(checkpoint.rstrip("/")).startswith("checkpoint-")
            else None
        )
        fix = (
            f"export the newest checkpoint that loads: --checkpoint {loadable}"
            if loadable
            else "export another checkpoint (--checkpoint <run dir>/checkpoint-N) or re-train"
        )
        raise ExportError(
            f"checkpoint {checkpoint} does not load: {problem}. {fix}; the submission at {out} is unchanged"
        )
    recover_interrupted_swap(out, log=log)
    scored = None if replace_scored else read_json(os.path.join(out, REPORT_FILE), None)
    scored = scored if isinstance(scored, dict) else None
    meta = _read_meta(checkpoint)
    model, base = load_for_export(checkpoint, base_model)
    processor = modeling.load_processor(  # the training run's vision-token budget unless given
        checkpoint if os.path.isfile(os.path.join(checkpoint, "preprocessor_config.json")) else base,
        meta.get("min_pixels") if min_pixels is None else min_pixels,
        meta.get("max_pixels") if max_pixels is None else max_pixels,
    )
    report = None

    def fill(staging: str) -> None:
        nonlocal report
        log(f"[export] writing merged model from {checkpoint} into {staging}")
        model.save_pretrained(staging, safe_serialization=True)
        processor.save_pretrained(staging)
        modeling.write_compat_processor_files(staging)
        model.generation_config.save_pretrained(staging)
        report = verify_submission(
            staging, generate=verify, expected_class=expected_class, task=meta.get("task", "counting")
        )  # probed under the run's own task
        if not report.ok:
            raise ExportError(
                "the exported model failed verification: "
                + "; ".join(report.problems)
                + f". The submission at {out} is unchanged"
            )
        for warning in report.warnings:
            log(f"[export] warning: {warning}")

    report.path = swap_in(out, fill, "prev", ExportError, "writing the new model", log=log, beside=scored is not None)[
        0
    ]
    if scored is None:
        log(f"[export] submission ready: {out}")
        return report
    sets = report_set_paths(scored).values()
    sets_arg = f" --sets {' '.join(sets)}" if sets else ""
    limit_arg = f" --limit {scored['limit']}" if scored.get("limit") else ""
    log(
        f"[export] {out} holds a scored submission ({scored.get('mean_accuracy_pct')}% mean accuracy in its "
        f"{REPORT_FILE}): kept. The new model is at {report.path}; score it the same way and promote it if it is "
        f"better: python selfcheck.py --model {report.path}{sets_arg}{limit_arg} && python -m open_r1.promote "
        f"--candidate {report.path} --submission {out} (or export with --replace to overwrite without comparing)"
    )
    return report


# ---- installing a verified model at the submission path (docs/GUARANTEES.md) ---------------------------------------
# The model there is always complete: the new one is staged in `.<name>.tmp-<pid>-*` beside it and swapped in by one
# renameat2(RENAME_EXCHANGE), else two renames, under a journal `.<name>.swap.json` and with SIGINT/SIGTERM held.


def _journal_path(target: str) -> str:
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.swap.json")


def kept_path(target: str, tag: str) -> str:
    """A free `<target>.<tag>-<time>` path for a model kept beside the target (prev, candidate, replaced)."""
    path = candidate = f"{target}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while os.path.exists(candidate):
        candidate, suffix = f"{path}-{suffix}", suffix + 1
    return candidate


def inode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE). False when the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT/SIGTERM back (delivered at the end) so a swap of two renames is never cut in the middle. The
    handlers are replaced by a recorder, not the signals masked: a mask holds only this thread's signals, and the
    kernel may hand a Ctrl-C to any of torch's threads, whose C handler still wakes the Python handler here."""
    received, previous = [], {}
    try:  # a pending SIGTERM can raise inside signal.signal: SIGINT's recorder is then undone below
        if threading.current_thread() is threading.main_thread():  # Python sets handlers in the main thread only
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, lambda number, frame: received.append(number))
        yield
    finally:
        raised = [
            exc
            for signum, handler in previous.items()
            if (exc := set_handler(signum, signal.SIG_DFL if handler is None else handler))
        ]
        for signum in received[:1]:
            signal.raise_signal(signum)
        if raised:  # a signal that came as the handlers were put back: delivered now, not lost
            raise raised[0]


def set_handler(signum: int, handler) -> KeyboardInterrupt | None:
    """signal.signal, which first runs any pending handler: the KeyboardInterrupt one raises is returned (the caller
    decides whether it still matters) and the handler is set all the same."""
    try:
        signal.signal(signum, handler)
        return None
    except KeyboardInterrupt as exc:
        return set_handler(signum, handler) or exc


def install(staging: str, target: str, aside: str, log=print) -> str | None:
    """Put the verified model `staging` at `target`, the one there at `aside` (returned; None if there was none)."""
    journal = _journal_path(target)
    with _signals_held():
        if not os.path.exists(target):
            os.rename(staging, target)
            COMMITTED.append(target)  # a held signal, delivered next, has nothing left to stop (run_cli)
            return None
        write_json(
            journal,
            {
                "target": target,
                "staging": staging,
                "aside": aside,
                "new_inode": os.stat(staging).st_ino,
                "pid": os.getpid(),
            },
        )
        if _exchange(staging, target):  # one atomic step: the new model at target, the old one at staging
            os.rename(staging, aside)
        else:
            os.rename(target, aside)
            os.rename(staging, target)
        os.remove(journal)
        log(f"[export] previous model kept at {aside}")  # before a held signal is delivered
        COMMITTED.append(target)
    return aside


def swap_in(
    target: str,
    fill,
    aside_tag: str,
    error: type[OpenR1Error],
    what: str,
    log=print,
    beside: bool = False,
    source: str | None = None,
) -> tuple[str, str | None]:
    """`fill(staging)` writes and verifies the new model beside `target` (or raises); it then goes to `target`, the
    previous one to `<target>.<aside_tag>-<time>` (with `beside`: to `<target>.candidate-<time>`). Returns (new path,
    previous path or None). A failure leaves `target` complete and one line says where the models are: a disk error
    raises `error("<what> failed: ...; <where>")`, an interrupt gets `exc.where`. A verified model is kept as a
    candidate unless it is a copy of `source` (which stays)."""
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    clean_stale_staging(target, log=log)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-{os.getpid()}-", dir=parent)
    aside = kept_path(target, aside_tag)
    verified, new_inode = False, None
    try:
        fill(staging)
        modeling.fix_modes(staging)
        verified = True
        if beside:
            kept = kept_path(target, "candidate")
            os.rename(staging, kept)
            COMMITTED.append(kept)
            return kept, None
        new_inode = os.stat(staging).st_ino
        return target, install(staging, target, aside, log=log)
    except BaseException as exc:
        if os.path.exists(_journal_path(target)):  # the swap itself failed half-way (an OSError): finish or undo it
            where = recover_interrupted_swap(target, log=log) or f"{target} is unchanged"
        elif new_inode is not None and inode_of(target) == new_inode:  # interrupted as the held signal was delivered
            where = f"the new model is in place at {target}" + (
                f", the previous one is kept at {aside}" if os.path.isdir(aside) else ""
            )
        elif verified and source is None and os.path.isdir(staging):  # a verified model is never deleted
            kept = kept_path(target, "candidate")
            os.rename(staging, kept)
            where = f"{target} is unchanged, the verified new model is kept at {kept}"
        else:
            where = f"{target} is unchanged" + (
                f", the candidate is still at {source}" if source else " (the partial new model was removed)"
            )
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            exc.where = where  # run_cli's one line says where the models are
        elif isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":  # e.g. a full disk
            reason = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise error(f"{what} failed: {reason}; {where}") from None
        raise


def recover_interrupted_swap(target: str, log=print) -> str | None:
    """Complete or undo a swap cut short by SIGKILL or a power cut (its journal is still there). Returns a line
    saying what was done, or None when there was nothing to recover."""
    target = os.path.abspath(target.rstrip("/"))
    journal = _journal_path(target)
    record = read_json(journal, None)
    if not isinstance(record, dict):
        if os.path.exists(journal):
            os.remove(journal)
        return None
    staging, aside, new_inode = record.get("staging"), record.get("aside"), record.get("new_inode")
    if not os.path.exists(target):
        if staging and inode_of(staging) == new_inode:
            os.rename(staging, target)
            done = f"completed an interrupted swap: the new model {staging} is now {target}"
        elif aside and os.path.isdir(aside):
            os.rename(aside, target)
            done = f"restored {target} from {aside} after an interrupted swap"
        else:
            done = f"an interrupted swap left nothing to restore at {target}"
    elif inode_of(target) == new_inode:
        done = f"completed an interrupted swap: {target} is the new model"
        if staging and os.path.isdir(staging):
            os.rename(staging, aside)
            done += f", the previous one is kept at {aside}"
    else:
        done = f"an interrupted swap never replaced {target} (unchanged)"
        if staging and inode_of(staging) == new_inode:
            kept = kept_path(target, "candidate")
            os.rename(staging, kept)
            done += f"; the verified new model is kept at {kept}"
    os.remove(journal)
    log(f"[export] {done}")
    return done


def clean_stale_staging(target: str, log=print) -> list[str]:
    """Remove the partial staging dirs of exports that are gone (returned); one that holds a complete model (killed
    between verification and swap) is kept as a candidate; one whose owner cannot be told is reported."""
    target = os.path.abspath(target)
    parent, prefix = os.path.dirname(target), f".{os.path.basename(target)}.tmp-"
    if not os.path.isdir(parent):
        return []
    removed, journal = [], read_json(_journal_path(target), None) or {}
    for entry in sorted(os.listdir(parent)):
        path = os.path.join(parent, entry)
        if not entry.startswith(prefix) or path == journal.get("staging"):
            continue
        pid = entry[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit():
            log(f"[export] warning: stale staging dir {path} from an older export; delete it when no export runs")
        elif not _pid_alive(int(pid)):
            if verify_submission(path, generate=False, expected_class=None).ok:  # killed after verifying: keep it
                kept = kept_path(target, "candidate")
                os.rename(path, kept)
                log(
                    f"[export] {path} (an export, pid {pid}, killed before its swap) holds a complete model: kept "
                    f"at {kept}"
                )
            else:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
                log(f"[export] removed {path}: the partial staging dir of an export (pid {pid}) that did not finish")
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


# ---- command line --------------------------------------------------------------------------------------------------

_START = time.time()  # import time of this module: the budget reserve covers the whole export process
COMMITTED: list[str] = []  # the models put in place since run_cli began


def _raise_interrupt(signum, frame):
    if not COMMITTED:  # once a model is in place the rest is messages: nothing left to stop
        raise KeyboardInterrupt(signal.Signals(signum).name)
    print(f"note: {signal.Signals(signum).name} after the new model was in place at {COMMITTED[-1]}", file=sys.stderr)


def run_cli(what: str, submission: str, work) -> int:
    """Run an entry point's `work()` (its exit status) with SIGINT/SIGTERM unwinding, nothing half-done, until a model
    is in place; an OpenR1Error or interrupt ends in one stderr line (`where`: where the models are)."""
    previous, COMMITTED[:] = {}, []
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _raise_interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return work()
    except OpenR1Error as exc:
        return error_exit(exc)
    except KeyboardInterrupt as exc:
        name = str(exc) or "SIGINT"
        where = getattr(exc, "where", f"the submission at {os.path.abspath(submission)} is unchanged")
        print(f"error: {what} interrupted ({name}); {where}", file=sys.stderr)
        return 128 + (signal.SIGTERM if name == "SIGTERM" else signal.SIGINT)
    finally:
        for signum, handler in previous.items():
            set_handler(signum, signal.SIG_DFL if handler is None else handler)  # after work(): nothing to stop


def exit_cli(main, argv=None) -> None:
    """`raise SystemExit(main())`, ignoring SIGINT/SIGTERM once main() has returned: a signal in the interpreter's
    exit (~1 s with torch loaded) cannot turn a finished command's status into a kill."""
    status = main(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        set_handler(signum, signal.SIG_IGN)
    raise SystemExit(status)


def main(argv=None) -> int:
    quiet_library_noise()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=CliHelp)
    parser.add_argument("--checkpoint", required=True, help="training output dir or a checkpoint-N dir")
    parser.add_argument("--out", required=True, help="submission dir to write (replaced atomically)")
    parser.add_argument(
        "--base-model", default=None, help="base model for a LoRA adapter (without it: the one recorded)"
    )
    parser.add_argument(
        "--min-pixels",
        type=int,
        default=None,
        help="processor min_pixels (without it: the training run's, from training_meta.json)",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="processor max_pixels (without it: the training run's, from training_meta.json)",
    )
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    parser.add_argument(
        "--any-family",
        action="store_true",
        help=f"verify as a model of its own family (Qwen2.5-VL, Qwen3-VL), not as the counting "
        f"submission the grader loads with {COUNTING_GRADER_CLASS}",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help=f"replace a scored submission (one with {REPORT_FILE}) without comparing; by default "
        "the new model is written beside it as <out>.candidate-<timestamp>",
    )
    args = parser.parse_args(argv)
    started = _START if argv is None else time.time()

    def work() -> int:
        export_submission(
            resolve_export_checkpoint(args.checkpoint),
            args.out,
            args.base_model,
            args.min_pixels,
            args.max_pixels,
            verify=not args.no_verify_generate,
            replace_scored=args.replace,
            expected_class=None if args.any_family else COUNTING_GRADER_CLASS,
        )
        if os.path.isfile(os.path.join(args.checkpoint, TRAINING_META_FILE)):  # a run dir: feed the budget
            try:
                record_export_seconds(args.checkpoint, time.time() - started)
            except OSError as exc:
                print(f"warning: could not record the export time in {args.checkpoint}: {exc}", file=sys.stderr)
        return 0

    return run_cli("export", args.out, work)


def cli(argv=None) -> None:  # the console script open-r1-export
    exit_cli(main, argv)


if __name__ == "__main__":
    cli()
