"""Write a submission: full merged Qwen2-VL weights + tokenizer + processor + chat template + generation config.

Atomic by construction: everything is written into a temporary directory beside the target, verified there the
way the grader loads it (`Qwen2VLForConditionalGeneration.from_pretrained`, `AutoProcessor`, one greedy
generation under the eval protocol), its modes set to 0755/0644, and only then swapped into place by `install`
(one atomic exchange, or two journaled renames that `recover_interrupted_swap` completes on the next run). The
model that was there is kept at `<target>.prev-<timestamp>`; a *scored* submission (one holding its selfcheck.json)
is not replaced at all unless asked (`--replace`): the new model goes beside it. Neither a crash, a signal nor a
bad export loses a finished model.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from open_r1 import modeling
from open_r1.checks import check_checkpoint, weights_problems, writable_problem
from open_r1.errors import CliHelp, ExportError, ModelError, OpenR1Error  # noqa: F401  (re-exported)
from open_r1.families import FAMILIES
from open_r1.jsonio import read_json, write_json
from open_r1.noise import quiet_library_noise
from open_r1.run.budget import record_export_seconds
from open_r1.run.keep_best import resolve_export_checkpoint
from open_r1.run.resume import find_resume_checkpoint
from open_r1.tasks import get_task

TRAINING_META_FILE = "training_meta.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# The class the counting grader loads a submission with. Other families (open_r1.families) export and verify as
# their own class (`expected_class=None`), but cannot be the counting submission.
EXPECTED_ARCHITECTURE = "Qwen2VLForConditionalGeneration"
COUNTING_GRADER_CLASS = EXPECTED_ARCHITECTURE
ANY_FAMILY_HINT = "selfcheck.py --verify --any-family / export --any-family"


@dataclass
class VerifyReport:
    path: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sample_completion: str | None = None
    loaded_class: str | None = None  # the transformers class the dir loaded as
    expected_class: str | None = None  # the class the grader needs (None: the dir's own family's class)
    installed: bool | None = None  # export: True = at --out, False = written beside a scored submission

    @property
    def ok(self) -> bool:
        return not self.problems


def _read_meta(checkpoint: str) -> dict:
    path = os.path.join(checkpoint, TRAINING_META_FILE)
    if os.path.isfile(path):
        with open(path) as handle:
            return json.load(handle)
    parent = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), TRAINING_META_FILE)
    if os.path.isfile(parent):  # checkpoint-N/ inside a run dir
        with open(parent) as handle:
            return json.load(handle)
    return {}


def load_for_export(checkpoint: str, base_model: str | None = None, dtype="auto"):
    """The full model from a checkpoint dir: full weights as saved, or base + LoRA adapter merged."""
    adapter_config = os.path.join(checkpoint, "adapter_config.json")
    if os.path.isfile(adapter_config):
        from peft import PeftModel

        with open(adapter_config) as handle:
            adapter_base = json.load(handle).get("base_model_name_or_path")
        base = base_model or _read_meta(checkpoint).get("base_model") or adapter_base
        if not base:
            raise ExportError(f"{checkpoint} is a LoRA adapter with no recorded base model; pass --base-model")
        model = modeling.load_model(base, dtype=dtype, attn_implementation="sdpa")
        model = PeftModel.from_pretrained(model, checkpoint).merge_and_unload()
        return model, base
    return modeling.load_model(checkpoint, dtype=dtype, attn_implementation="sdpa"), checkpoint


def _probe_image():
    """A small deterministic image for the load-and-generate check (no dataset needed)."""
    import numpy as np
    from PIL import Image

    grid = np.indices((96, 144)).sum(axis=0) % 32
    return Image.fromarray((np.stack([grid * 8, grid * 4, 255 - grid * 8], axis=-1)).astype("uint8"))


def architecture_problems(config: dict, expected_class: str | None = EXPECTED_ARCHITECTURE) -> list[str]:
    """What is wrong with config.json's model_type / architectures for a grader that loads `expected_class`
    (None: any supported family, loaded as its own class)."""
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    family = FAMILIES.get(model_type or "")
    if family is None:
        needs = (f"the grader loads {expected_class}" if expected_class else "supported families: "
                 + ", ".join(f"{f.model_type} ({f.class_name})" for f in FAMILIES.values()))
        return [f"wrong architecture: config.json says model_type={model_type!r}, architectures={architectures}; "
                f"{needs}"]
    if family.class_name not in architectures:
        return [f"wrong architecture: config.json says model_type={model_type!r} ({family.name}) but architectures="
                f"{architectures}, not {family.class_name}; re-save the model with save_pretrained"]
    if expected_class and family.class_name != expected_class:
        return [f"wrong architecture for the counting submission: this is a {family.name} checkpoint "
                f"({family.class_name}); the counting grader loads {expected_class} (a Qwen2-VL model), which cannot "
                f"load it. Submit a Qwen2-VL model for counting, or check it as a {family.name} model of its own "
                f"({ANY_FAMILY_HINT})"]
    return []


def verify_submission(path: str, generate: bool = True, strict_answer: bool = False, image=None,
                      expected_class: str | None = EXPECTED_ARCHITECTURE, task: str = "counting") -> VerifyReport:
    """Check a submission dir the way the grader will load it. Never raises for a bad dir: it reports.

    `expected_class`: the class the grader loads (default: the counting grader's Qwen2VLForConditionalGeneration);
    None checks the dir as a model of its own family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL). `generate`: load it and
    write one greedy completion under `task`'s protocol (`open_r1.tasks.get_task(task).probe`); output that does not
    follow the format is a warning, or a problem with `strict_answer`."""
    report = VerifyReport(path=path, expected_class=expected_class)
    if not os.path.isdir(path):
        report.problems.append(f"{path} does not exist")
        return report
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        if os.path.isfile(os.path.join(path, "adapter_config.json")):
            report.problems.append(f"{path} is a LoRA adapter (adapter_config.json, no config.json), not a full "
                                   f"model; merge it with python -m open_r1.export --checkpoint {path} --out <dir>")
        else:
            report.problems.append("config.json is missing: not a saved transformers model")
        return report
    with open(config_path) as handle:
        config = json.load(handle)
    report.problems.extend(architecture_problems(config, expected_class))
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        report.problems.append("adapter_config.json present: a LoRA adapter must be merged into full weights")
    if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
        report.problems.append("processor file preprocessor_config.json is missing: save the processor too")
    for name in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(path, name)):
            report.problems.append(f"tokenizer file {name} is missing: save the tokenizer (processor.save_pretrained)")
    if not any(os.path.isfile(os.path.join(path, n)) for n in CHAT_TEMPLATE_FILES) and "chat_template" not in (
        read_json(os.path.join(path, "tokenizer_config.json"), None) or {}
    ):
        report.problems.append("chat template is missing (chat_template.jinja): the prompt cannot be built")
    if not os.path.isfile(os.path.join(path, "generation_config.json")):
        report.warnings.append("generation_config.json is missing: eos ids fall back to config.json")
    report.problems.extend(weights_problems(path))
    if report.problems or not generate:
        return report
    probe = get_task(task).probe  # an unknown task fails here, before the model loads
    try:
        import torch

        model = modeling.load_model(path, dtype="auto", attn_implementation="sdpa")
        report.loaded_class = type(model).__name__
        if torch.cuda.is_available():  # a 2B model generates 256 tokens in seconds on a GPU, minutes on a CPU
            model = model.to("cuda")
        processor = modeling.load_processor(path)
    except Exception as exc:  # noqa: BLE001 - every load failure is a finding
        report.problems.append(f"loading failed: {type(exc).__name__}: {exc}")
        return report
    try:
        text, message = probe(model, processor, image or _probe_image())
    except Exception as exc:  # noqa: BLE001
        report.problems.append(f"generation failed: {type(exc).__name__}: {exc}")
        return report
    report.sample_completion = text
    if message:
        (report.problems if strict_answer else report.warnings).append(message)
    return report


def one_line(text: str | None, limit: int = 80) -> str:
    """A sample completion for a log line: whitespace collapsed, runs of one repeated token shortened, at most
    `limit` characters, quoted (a random model's ~150 reserved tokens would otherwise fill the screen)."""
    if text is None:
        return "None"
    flat = " ".join(text.split())
    flat = re.sub(r"(\S+?)(?:\s*\1){3,}", lambda m: f"{m.group(1)} ... x{len(re.findall(re.escape(m.group(1)), m.group(0)))}",
                  flat)
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def export_submission(checkpoint: str, out: str, base_model: str | None = None, min_pixels: int | None = None,
                      max_pixels: int | None = None, verify: bool = True, log=print,
                      replace_scored: bool = False,
                      expected_class: str | None = EXPECTED_ARCHITECTURE) -> VerifyReport:
    """Merge (if LoRA), save everything into a temp dir beside `out`, verify, then install it (see `install`).

    `out` holding a scored submission (its selfcheck.json) is never replaced unless `replace_scored`: the new model
    is written beside it as `<out>.candidate-<timestamp>` (report.path) with the commands to score and promote it.
    `expected_class`: the class the grader loads (default: the counting grader's); None verifies the export as a
    model of its own family (Qwen2.5-VL, Qwen3-VL, ...).
    """
    if not os.path.isdir(checkpoint):
        raise ExportError(f"checkpoint {checkpoint} does not exist; train first (bash train.sh) or pass --checkpoint")
    out = os.path.abspath(out.rstrip("/") or out)
    problem = writable_problem(out)
    if problem:
        raise ExportError(f"cannot write the submission: {problem} (--out / SUBMISSION)")
    problem = check_checkpoint(checkpoint)
    if problem:
        run_dir = os.path.dirname(os.path.abspath(checkpoint.rstrip("/")))
        loadable = find_resume_checkpoint(run_dir) if os.path.basename(checkpoint.rstrip("/")).startswith(
            "checkpoint-") else None
        fix = (f"export the newest checkpoint that loads: --checkpoint {loadable}" if loadable
               else "export another checkpoint (--checkpoint <run dir>/checkpoint-N) or re-train")
        raise ExportError(f"checkpoint {checkpoint} does not load: {problem}. {fix}; the submission at {out} is "
                          "unchanged")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    recover_interrupted_swap(out, log=log)
    clean_stale_staging(out, log=log)
    meta = _read_meta(checkpoint)
    model, base = load_for_export(checkpoint, base_model)
    processor_source = checkpoint if os.path.isfile(os.path.join(checkpoint, "preprocessor_config.json")) else base
    processor = modeling.load_processor(
        processor_source,
        min_pixels if min_pixels is not None else meta.get("min_pixels"),
        max_pixels if max_pixels is not None else meta.get("max_pixels"),
    )
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX.format(name=os.path.basename(out))}{os.getpid()}-",
                               dir=parent)
    verified, new_inode = False, None
    aside = unique_path(f"{out}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        log(f"[export] writing merged model from {checkpoint} into {staging}")
        model.save_pretrained(staging, safe_serialization=True)
        processor.save_pretrained(staging)
        modeling.write_compat_processor_files(staging)
        model.generation_config.save_pretrained(staging)
        fix_modes(staging)
        report = verify_submission(staging, generate=verify, expected_class=expected_class,
                                   task=meta.get("task", "counting"))  # probed under the run's own task
        if not report.ok:
            raise ExportError("the exported model failed verification: " + "; ".join(report.problems)
                              + f". The submission at {out} is unchanged")
        verified = True
        for warning in report.warnings:
            log(f"[export] warning: {warning}")
        current = scored_submission(out)
        if current is not None and not replace_scored:
            beside = unique_path(f"{out}.candidate-{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(staging, beside)
            score = current.get("mean_accuracy_pct")
            log(f"[export] {out} holds a scored submission ({score}% mean accuracy in its {REPORT_FILE}): kept. "
                f"The new model is at {beside}; " + promote_hint(beside, out, current)
                + " (or export with --replace to overwrite without comparing)")
            report.path = beside
            report.installed = False
            return report
        new_inode = os.stat(staging).st_ino
        install(staging, out, "prev", log=log, aside=aside)
    except BaseException as exc:
        if os.path.exists(_journal_path(out)):  # the swap itself failed half-way (an OSError): finish or undo it
            where = discard_staging(staging, out, log=log)
        elif new_inode is not None and inode_of(out) == new_inode:  # interrupted as the held signal was delivered
            where = f"the new model is in place at {out}" + (f", the previous one is kept at {aside}"
                                                             if os.path.isdir(aside) else "")
        elif verified and os.path.isdir(staging):  # a verified model is never deleted: keep it beside the target
            kept = unique_path(f"{out}.candidate-{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(staging, kept)
            where = f"{out} is unchanged, the verified new model is kept at {kept}"
        else:
            shutil.rmtree(staging, ignore_errors=True)  # a partial write, never a model
            where = f"{out} is unchanged (the partial new model was removed)"
        if isinstance(exc, KeyboardInterrupt):
            exc.where = where  # main's one line says where the models are
        elif isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":  # e.g. a full disk
            reason = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ExportError(f"writing the new model failed: {reason}; {where}") from None
        raise
    report.path = out
    report.installed = True
    log(f"[export] submission ready: {out}")
    return report


# ---- installing a verified model at the submission path -------------------------------------------------------------
#
# Guarantees (docs/GUARANTEES.md): the model at `target` is always complete. The new model is written and verified
# in `.<name>.tmp-<pid>-*` beside it, its modes set like any save_pretrained output (dirs 0755, files 0644), then
# swapped in by ONE atomic renameat2(RENAME_EXCHANGE) where the file system supports it (Linux >= 3.15), else by two
# renames. Either way a journal `.<name>.swap.json` is written first and removed last, SIGINT/SIGTERM are held back
# during the swap, and `recover_interrupted_swap` (run first by export, promote and selfcheck) completes or undoes a
# swap that a SIGKILL or a power cut interrupted.

SWAP_JOURNAL = ".{name}.swap.json"
STAGING_PREFIX = ".{name}.tmp-"
REPORT_FILE = "selfcheck.json"


def fix_modes(root: str) -> None:
    """Dirs 0755, files 0644, whatever the umask of mkdtemp (0700): a grader running as another user reads it."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE). False when the system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


def unique_path(path: str) -> str:
    candidate, suffix = path, 1
    while os.path.exists(candidate):
        candidate, suffix = f"{path}-{suffix}", suffix + 1
    return candidate


def _journal_path(target: str) -> str:
    return os.path.join(os.path.dirname(target), SWAP_JOURNAL.format(name=os.path.basename(target)))


class _SignalsHeld:
    """Hold SIGINT/SIGTERM back (delivered on exit) so a swap of two renames is never cut in the middle. The
    handlers are swapped for a recorder, not the signals masked: a mask holds only this thread's signals, and the
    kernel may hand a Ctrl-C to any of torch's threads, whose C handler still wakes the Python handler here."""

    def __enter__(self):
        self.received, self.previous = [], {}
        if threading.current_thread() is threading.main_thread():  # Python sets handlers in the main thread only
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, lambda number, frame: self.received.append(number))
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in self.received[:1]:
            signal.raise_signal(signum)
        return False


def install(staging: str, target: str, aside_tag: str = "prev", log=print, aside: str | None = None) -> str | None:
    """Put the verified model `staging` at `target`; the model that was there is kept at `aside` (default
    `<target>.<aside_tag>-<timestamp>`; returned, None when there was none)."""
    aside = aside or unique_path(f"{target}.{aside_tag}-{time.strftime('%Y%m%d-%H%M%S')}")
    journal = _journal_path(target)
    with _SignalsHeld():
        if not os.path.exists(target):
            os.rename(staging, target)
            return None
        write_json(journal, {"target": target, "staging": staging, "aside": aside,
                                    "new_inode": os.stat(staging).st_ino, "pid": os.getpid()})
        if _exchange(staging, target):  # one atomic step: the new model at target, the old one at staging
            os.rename(staging, aside)
        else:
            os.rename(target, aside)
            os.rename(staging, target)
        os.remove(journal)
        log(f"[export] previous model kept at {aside}")  # before a held signal is delivered
    return aside


def inode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def discard_staging(staging: str, target: str, log=print) -> str:
    """Drop a staging dir after a failure; when a swap was under way (journal present) recover it instead, since
    the staging path may then hold the previous model. Returns a line saying where the models are."""
    done = f"{target} is unchanged"
    if os.path.exists(_journal_path(target)):
        done = recover_interrupted_swap(target, log=log) or done  # moves whatever model `staging` held to its place
    if os.path.isdir(staging):
        shutil.rmtree(staging, ignore_errors=True)
    return done


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
            kept = unique_path(f"{target}.candidate-{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(staging, kept)
            done += f"; the verified new model is kept at {kept}"
    os.remove(journal)
    log(f"[export] {done}")
    return done


def clean_stale_staging(target: str, log=print) -> list[str]:
    """Remove the partial `.<name>.tmp-<pid>-*` dirs of export processes that are gone; one that holds a complete
    model (killed between verification and swap) is kept as `<name>.candidate-<time>`; report those whose owner
    cannot be told."""
    parent, name = os.path.dirname(os.path.abspath(target)), os.path.basename(os.path.abspath(target))
    if not os.path.isdir(parent):
        return []
    removed = []
    journal = read_json(_journal_path(target), None) or {}
    for entry in sorted(os.listdir(parent)):
        if not entry.startswith(STAGING_PREFIX.format(name=name)):
            continue
        path = os.path.join(parent, entry)
        if path == journal.get("staging"):
            continue
        pid = entry[len(STAGING_PREFIX.format(name=name)):].split("-", 1)[0]
        alive = pid.isdigit() and _pid_alive(int(pid))
        if pid.isdigit() and not alive:
            if verify_submission(path, generate=False, expected_class=None).ok:  # killed after verifying: keep it
                kept = unique_path(f"{os.path.join(parent, name)}.candidate-{time.strftime('%Y%m%d-%H%M%S')}")
                os.rename(path, kept)
                log(f"[export] {path} (an export, pid {pid}, killed before its swap) holds a complete model: kept "
                    f"at {kept}")
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log(f"[export] removed {path}: the partial staging dir of an export (pid {pid}) that did not finish")
        elif not pid.isdigit():
            log(f"[export] warning: stale staging dir {path} from an older export; delete it when no export runs")
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scored_submission(path: str) -> dict | None:
    """The selfcheck report recorded with an existing submission, when it has one (any readable JSON dict)."""
    report = read_json(os.path.join(path, REPORT_FILE), None) if os.path.isdir(path) else None
    return report if isinstance(report, dict) else None


def promote_hint(candidate: str, target: str, report: dict | None) -> str:
    sets = (report or {}).get("sets_paths") or sorted((report or {}).get("sets") or [])
    limit = (report or {}).get("limit")
    sets_arg = f" --sets {' '.join(sets)}" if sets else ""
    limit_arg = f" --limit {limit}" if limit else ""
    return (f"score it the same way and promote it if it is better: python selfcheck.py --model {candidate}"
            f"{sets_arg}{limit_arg} && python -m open_r1.promote --candidate {candidate} --submission {target}")


# ---- command line --------------------------------------------------------------------------------------------------

_START = time.time()  # import time of this module: the budget reserve covers the whole export process

CLI_DOC = """Export a trained checkpoint as a submission: merged full weights + tokenizer + processor, written atomically.

    python scripts/export_submission.py --checkpoint runs/demo --out submission
    python scripts/export_submission.py --checkpoint runs/lora/checkpoint-300 --base-model /app/models/Qwen2-VL-2B-Instruct --out /app/submission

A LoRA checkpoint is merged into its base (recorded in training_meta.json or adapter_config.json). The processor
keeps the training vision-token budget. The result is verified (loads with Qwen2VLForConditionalGeneration and
generates) in a temp dir beside --out, with modes 0755/0644, before it replaces anything; the swap is atomic
(docs/GUARANTEES.md) and a replaced submission is kept as <out>.prev-<timestamp>. A submission that holds its
selfcheck report (selfcheck.json) is never replaced without --replace: the new model goes to
<out>.candidate-<timestamp> and the commands to score and promote it are printed.

Given a run dir, the exported checkpoint is the keep-best one (open_r1/run/keep_best.py: the best in-training OOD score
recorded in eval_history.json / best_checkpoint.json), else the final model. The export time is recorded in the run
dir (budget_timings.json) so the next round's time budget reserves the measured value.
"""


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def interrupted(exc: KeyboardInterrupt, what: str, submission: str) -> int:
    """Print the one true line for an interrupted export or promote (`exc.where`, set during a swap, says where the
    models are) and return the exit status of the signal."""
    name = str(exc) or "SIGINT"
    where = getattr(exc, "where", f"the submission at {os.path.abspath(submission)} is unchanged")
    print(f"error: {what} interrupted ({name}); {where}", file=sys.stderr)
    return 128 + (signal.SIGTERM if name == "SIGTERM" else signal.SIGINT)


def main(argv=None) -> int:
    quiet_library_noise()
    parser = argparse.ArgumentParser(description=CLI_DOC, formatter_class=CliHelp)
    parser.add_argument("--checkpoint", required=True, help="training output dir or a checkpoint-N dir")
    parser.add_argument("--out", required=True, help="submission dir to write (replaced atomically)")
    parser.add_argument("--base-model", default=None, help="base model for a LoRA adapter (without it: the one recorded)")
    parser.add_argument("--min-pixels", type=int, default=None,
                        help="processor min_pixels (without it: the training run's, from training_meta.json)")
    parser.add_argument("--max-pixels", type=int, default=None,
                        help="processor max_pixels (without it: the training run's, from training_meta.json)")
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    parser.add_argument("--any-family", action="store_true",
                        help=f"verify as a model of its own family (Qwen2.5-VL, Qwen3-VL), not as the counting "
                        f"submission the grader loads with {EXPECTED_ARCHITECTURE}")
    parser.add_argument("--replace", action="store_true",
                        help=f"replace a scored submission (one with {REPORT_FILE}) without comparing; by default "
                        "the new model is written beside it as <out>.candidate-<timestamp>")
    args = parser.parse_args(argv)
    started = _START if argv is None else time.time()
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM unwinds like Ctrl-C: nothing half-done
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        checkpoint = resolve_export_checkpoint(args.checkpoint)
        export_submission(checkpoint, args.out, args.base_model, args.min_pixels, args.max_pixels,
                          verify=not args.no_verify_generate, replace_scored=args.replace,
                          expected_class=None if args.any_family else EXPECTED_ARCHITECTURE)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return interrupted(exc, "export", args.out)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if os.path.isfile(os.path.join(args.checkpoint, "training_meta.json")):  # a run dir: feed the next budget
        try:
            record_export_seconds(args.checkpoint, time.time() - started)
        except OSError as exc:
            print(f"warning: could not record the export time in {args.checkpoint}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
