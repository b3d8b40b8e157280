"""The one way a directory is replaced (the guarantees: `open_r1.submission`): `check_target`, the path guard;
`installing`, which stages a dir beside its target and swaps it in under the target's lock; `recover`, which
finishes or undoes a swap a killed installer left; and `run_cli` / `exit_cli`, the signal handling of the commands
that install. Imports nothing heavy: data preparation and model saving use it too."""

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from open_r1.checks import writable_problem
from open_r1.errors import OpenR1Error, error_exit
from open_r1.jsonio import read_json

logger = logging.getLogger(__name__)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED: list[str] = []  # the dirs put in place since run_cli began (a signal after that has nothing to stop)
_HELD: dict[str, int] = {}  # target -> the fd of its lock file, for the targets this process holds


# ---- the path guard ------------------------------------------------------------------------------------------------


def _relation(path: str, other: str) -> str | None:
    """How real path `path` sits to real path `other`: 'is', 'contains', 'lies inside' or None."""
    if path == other:
        return "is"
    if other.startswith(path.rstrip(os.sep) + os.sep):
        return "contains"
    return "lies inside" if path.startswith(other.rstrip(os.sep) + os.sep) else None


def check_target(target, option: str, what: str, inputs=(), run_dir=None, own=None, force: bool = False) -> str:
    """The real path of `target`, a dir a command is about to replace, after refusing (one error naming both paths)
    one that is, contains or lies inside an input, is or contains the run dir, is or contains the repo, / or $HOME,
    or cannot be written; an existing non-empty dir is replaced only when `own(path)` recognises it as `what`,
    unless `force`."""
    real = os.path.realpath(os.fspath(target))
    protected = [(p, "the protected dir", ("is", "contains")) for p in (os.sep, os.path.expanduser("~"), REPO)]
    protected += [(p, "the run dir", ("is", "contains")) for p in [run_dir] if p]
    protected += [(p, "an input", ("is", "contains", "lies inside")) for p in inputs if p]
    for path, name, refused in protected:
        relation = _relation(real, os.path.realpath(os.fspath(path)))
        if relation in refused:
            raise OpenR1Error(
                f"refusing to replace {option} {target}: it {relation} {name} {path}; choose another {option}"
            )
    problem = writable_problem(real)
    if problem:
        raise OpenR1Error(f"cannot write {what}: {problem} ({option})")
    if own and os.path.isdir(real) and os.listdir(real) and not own(real) and not force:
        raise OpenR1Error(
            f"refusing to replace {option} {target}: it holds something other than {what}; choose another "
            f"{option}, or pass --force to replace it"
        )
    return real


# ---- the lock, whose file is also the journal of a swap ------------------------------------------------------------


def _lock_path(target: str) -> str:
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.lock")


def _record(target: str, **fields) -> None:
    """Rewrite the lock file in place (a rename would swap the locked inode for an unlocked one)."""
    fd = _HELD[target]
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), **fields}).encode(), 0)


def inode_of(path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@contextlib.contextmanager
def locked(target: str):
    """Hold `target`'s lock `.<name>.lock` beside it (another process holding it: one error naming it) and first
    `recover` what a killed installer left. Re-entrant within a process."""
    target = os.path.abspath(target)
    if target in _HELD:
        yield
        return
    path = _lock_path(target)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = (read_json(path, None) or {}).get("pid", "?")
                raise OpenR1Error(
                    f"another command (pid {holder}) is writing {target} now; wait for it to end, then run this again"
                ) from None
            if os.fstat(fd).st_ino == inode_of(path):
                break
            os.close(fd)  # its holder removed it as we opened it: lock the new one
    except OSError as exc:
        raise OpenR1Error(f"cannot write {target}: {reason(exc)}") from None
    _HELD[target] = fd
    try:
        try:
            recover(target)
        except OSError as exc:
            raise OpenR1Error(f"cannot finish the install a killed command left at {target}: {reason(exc)}") from None
        _record(target)
        yield
    finally:
        del _HELD[target]
        if not (read_json(path, None) or {}).get("staging"):  # a swap that could not be undone stays journaled
            os.remove(path)  # before unlocking: a process waiting on this inode then takes a new one
        os.close(fd)


def settle(target: str) -> None:
    """For a reader of `target` (selfcheck): finish or undo a swap a killed installer left there, if any (the lock is
    taken only then: a reader needs no write access to the parent)."""
    if os.path.exists(_lock_path(os.path.abspath(target))):
        with locked(target):
            pass


def kept_path(target: str, tag: str) -> str:
    """A free `<target>.<tag>-<time>` path for a dir kept beside the target (prev, candidate, replaced)."""
    path = candidate = f"{target}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while os.path.exists(candidate):
        candidate, suffix = f"{path}-{suffix}", suffix + 1
    return candidate


def recover(target: str) -> str | None:
    """With the lock held: finish or undo the swap journaled in the lock file (a SIGKILL or power cut between the
    renames), then remove staging dirs of installers that died (only the lock's holder stages, so any other is
    stale). Returns a line saying what was done, or None."""
    target = os.path.abspath(target)
    record = read_json(_lock_path(target), None) or {}
    staging, aside, new = record.get("staging"), record.get("aside"), record.get("new_inode")
    done = None
    if staging:
        if not os.path.exists(target) and inode_of(staging) == new:
            os.rename(staging, target)
            done = f"completed an interrupted install: the new {target} is in place"
        elif not os.path.exists(target) and os.path.isdir(aside):
            os.rename(aside, target)
            done = f"restored {target} from {aside} after an interrupted install"
        elif inode_of(target) == new:
            done = f"completed an interrupted install: the new {target} is in place"
            if os.path.isdir(staging):  # the old one, after the exchange
                os.rename(staging, aside)
        elif inode_of(staging) == new and record.get("keep_new"):
            kept = kept_path(target, "candidate")
            os.rename(staging, kept)
            done = f"an interrupted install never replaced {target} (unchanged); the verified new one is kept at {kept}"
        else:
            done = f"an interrupted install never replaced {target} (unchanged)"
        if record.get("keep_old") and os.path.isdir(aside):
            done += f", the previous one is kept at {aside}"
        _record(target)
        logger.info(f"[install] {done}")
    parent, name = os.path.dirname(target), os.path.basename(target)
    for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        if entry.startswith((f".{name}.tmp-", f".{name}.old-")):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
            logger.info(f"[install] removed {os.path.join(parent, entry)}, left by an install that did not finish")
    return done


# ---- the installer -------------------------------------------------------------------------------------------------


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


def _swap(staging: str, target: str, aside: str) -> bool:
    """`staging` to `target`, an old `target` to `aside` (True when there was one). One atomic exchange, else two
    renames, the old one put back when the second fails."""
    if not os.path.exists(target):
        os.rename(staging, target)
        return False
    if _exchange(staging, target):
        os.rename(staging, aside)
        return True
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(aside, target)
        raise
    return True


def fix_modes(root: str) -> None:
    """Dirs 0755, files 0644, whatever the umask of mkdtemp (0700): a grader running as another user reads it."""
    for dirpath, _, filenames in os.walk(root):  # symlinks are neither followed nor changed
        os.chmod(dirpath, 0o755)
        for path in (os.path.join(dirpath, name) for name in filenames):
            if not os.path.islink(path):
                os.chmod(path, 0o644)


def reason(exc: BaseException) -> str:
    """An OSError (a full disk, a read-only place) in a few words; shutil.copytree's list of errors by its first."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        return str(exc.args[0][0][-1])  # (source, destination, why)
    return f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)


@contextlib.contextmanager
def installing(target, keep_old: str | None = None, keep_new=False, source=None, error=OpenR1Error, what=None):
    """Yield a staging dir `.<name>.tmp-*` beside `target`; when the block ends, journal the swap in the lock file,
    give the dir modes 0755/0644 and swap it in with SIGINT/SIGTERM held. The old dir goes to `keep_old` (None:
    deleted). A failure leaves `target` as it was (`recover`): the staging dir removed, a complete one kept as a
    candidate with `keep_new`; a disk error raises `error("<what> failed: <reason>; <where the dirs are>")`, an
    interrupt gets `exc.where`."""
    target = os.path.abspath(os.fspath(target))
    parent, name = os.path.split(target)
    with locked(target):
        staging = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
        aside = keep_old or os.path.join(parent, f".{name}.old-{os.getpid()}")
        try:
            yield staging
            journal = dict(staging=staging, aside=aside, new_inode=inode_of(staging), keep_old=bool(keep_old))
            _record(target, **journal, keep_new=keep_new)
            fix_modes(staging)
            with _signals_held():
                replaced = _swap(staging, target, aside)
                COMMITTED.append(target)
                if replaced and keep_old:
                    logger.info(f"[install] previous model kept at {aside}")  # before a held signal is delivered
            _record(target)
            if replaced and not keep_old:
                shutil.rmtree(aside, ignore_errors=True)
        except BaseException as exc:
            if (read_json(_lock_path(target), None) or {}).get("staging"):  # complete: finish or undo the swap
                try:
                    where = recover(target)
                except OSError as again:
                    where = f"the install stopped half-way ({reason(again)}); the next run on {target} finishes it"
            else:
                where = f"{target} is unchanged" + (
                    f", the candidate is still at {source}" if source else " (the partial new one was removed)"
                )
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, KeyboardInterrupt):
                exc.where = where  # run_cli's one line says where the dirs are
            elif isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":  # e.g. a full disk
                raise error(f"{what or 'writing ' + target} failed: {reason(exc)}; {where}") from None
            raise


# ---- signals -------------------------------------------------------------------------------------------------------


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


def _raise_interrupt(signum, frame):
    if not COMMITTED:  # once a model is in place the rest is messages: nothing left to stop
        raise KeyboardInterrupt(signal.Signals(signum).name)
    logger.warning(f"note: {signal.Signals(signum).name} after the new model was in place at {COMMITTED[-1]}")


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
