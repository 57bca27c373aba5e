"""Ctrl-C while training: the run stops between two steps, so that --resume is exact.

A training step changes three things: the batch stream (its batch is drawn), the dropout
generator (forward draws the masks) and, in the optimizer's update, the weights and AdamW's
moments and step count. A checkpoint resumes exactly only if it holds all of them as one
same step left them. Python raises KeyboardInterrupt wherever Ctrl-C lands, often in the
middle of a step: the batch drawn, the update not made. Saved so, the resumed run skipped
that batch and took the dropout masks meant for the next step.

So while ``Interrupts`` is on, the first Ctrl-C only asks the loop to stop: the step under
way finishes, and the loop stops before the next. A second Ctrl-C stops at once (a step
can be long), except inside the optimizer's update and a checkpoint write, which always
finish (``uninterrupted``); the loop then puts the run at a step boundary
(``StepStart.undo``): if the update was not made, back where the step began (the batch
stream and the dropout generator as they were then, the gradients dropped: the weights never
changed); if it was made, the step counts as done. Either way the checkpoint holds one step's
state, all of it.
"""
import contextlib
import signal
import threading

_active = None          # the Interrupts in force, if any


class Interrupts:
    """A context: Ctrl-C (SIGINT) asks the loop to stop (``requested``), a second one raises
    KeyboardInterrupt outside ``uninterrupted`` blocks. Elsewhere than in the main thread,
    or where SIGINT is ignored (the processes of rank > 0), nothing changes."""

    def __init__(self, say=print):
        self.say = say
        self.requested = False       # Ctrl-C was pressed: stop at the next step boundary
        self.critical = 0            # inside uninterrupted blocks
        self.updating = False        # inside the optimizer's update (True after one that raised)
        self.updates = 0             # optimizer updates finished
        self._old = None             # SIGINT's handler before arm()

    def __enter__(self):
        global _active
        _active = self
        return self

    def arm(self):
        """From here on (the training loop) Ctrl-C asks to stop; before, it raises as usual."""
        if self._old is None and threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc):
        global _active
        _active = None
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False

    def _on_sigint(self, signum, frame):
        if self.requested and not self.critical:
            raise KeyboardInterrupt
        if not self.requested:
            self.requested = True
            self.say("Ctrl-C: stopping after this step, then saving (Ctrl-C again to stop at once)")


def active():
    """The Interrupts in force (train() enters one)."""
    return _active


@contextlib.contextmanager
def uninterrupted():
    """A block that Ctrl-C never cuts in two (a checkpoint write, the loop's bookkeeping)."""
    guard = _active
    if guard is None:
        yield
        return
    guard.critical += 1
    try:
        yield
    finally:
        guard.critical -= 1


@contextlib.contextmanager
def optimizer_update():
    """The optimizer's update: uninterrupted, and counted, so that the loop knows whether a
    KeyboardInterrupt came before it, after it, or (raised by the update itself) inside it."""
    guard = _active
    if guard is None:
        yield
        return
    guard.critical += 1
    guard.updating = True
    try:
        yield
    finally:
        guard.critical -= 1
    guard.updating = False
    guard.updates += 1


class StepStart:
    """What a step changes before its update, as it was when the step began."""

    def __init__(self, state, device_backend, guard):
        self.step = state["step"]
        self.data_rng = state["data_rng"].bit_generator.state
        self.device_rng = device_backend.get_rng_state()
        self.updates = guard.updates

    def undo(self, state, device_backend, guard, optimizer):
        """After a KeyboardInterrupt inside the step: put the run at a step boundary.
        -> None, or why that cannot be done (the update itself was cut in two)."""
        if guard.updating:
            return "inside the optimizer's update (the weights are half updated)"
        if guard.updates > self.updates:            # the update was made: the step is done
            state["step"] = self.step + 1
        else:                                       # it was not: the step never happened
            state["data_rng"].bit_generator.state = self.data_rng
            device_backend.set_rng_state(self.device_rng)
            state["step"] = self.step
        optimizer.zero_grad()
        return None
