"""Graceful stop: SIGTERM/SIGINT set a flag; at the end of the current optimizer step (a GRPO step can take
minutes) the trainer saves a full checkpoint and stops, and `open_r1.grpo` exits with 128+signal so that train.sh
stops before exporting. A second signal exits at once."""

import contextlib
import logging
import os
import signal

from transformers import TrainerCallback

from open_r1.run.common import _reduce_max

logger = logging.getLogger(__name__)


class GracefulStopCallback(TrainerCallback):
    """SIGTERM/SIGINT -> checkpoint at the end of the current step, then stop (see the module docstring)."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.signals = tuple(signals)
        self.received: int | None = None
        self.stop_signal: int | None = None
        self.stopped_at_step: int | None = None
        self._previous: dict = {}

    @property
    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    @property
    def exit_code(self) -> int | None:
        return 128 + self.stop_signal if self.stop_signal else None

    def _handler(self, signum, frame):
        if self.received is not None:  # second signal: leave now
            self.restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        logger.info(
            f"[stop] {signal.Signals(signum).name} received: saving a checkpoint at the end of this step, "
            "then exiting (send it again to exit immediately)"
        )

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.install()
        logger.info(
            f"[run] training in {args.output_dir} (pid {os.getpid()}): SIGTERM/SIGINT saves a checkpoint "
            "and stops; re-running the same command resumes"
        )
        return control

    def on_step_end(self, args, state, control, **kwargs):
        (signum,) = _reduce_max([self.received or 0], args)
        if signum:
            self.stop_signal = int(signum)
            if self.stopped_at_step is None:
                self.stopped_at_step = state.global_step
                logger.info(
                    f"[stop] saving checkpoint-{state.global_step} and stopping "
                    f"({signal.Signals(self.stop_signal).name})"
                )
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()
        return control
