"""How a training run stops and keeps its work: Ctrl-C, SIGTERM and SIGHUP stop it between two
steps, so that its checkpoint holds one step's state and --resume is exact.

A training step changes three things: the batch stream (its batch is drawn), the dropout
generator (forward draws the masks) and, in the optimizer's update, the weights and AdamW's
moments and step count. A checkpoint resumes exactly only if it holds all of them as one
same step left them. Python raises KeyboardInterrupt wherever Ctrl-C lands, often in the
middle of a step: the batch drawn, the update not made. Saved so, the resumed run skipped
that batch and took the dropout masks meant for the next step.

So while ``Stop`` is on, the first signal only asks the loop to stop: the step under way
finishes, the loop stops before the next and saves. That is the same for Ctrl-C (SIGINT),
SIGTERM (what ``kill``, ``timeout``, Slurm and ``docker stop`` send) and SIGHUP (the terminal
closed). A second Ctrl-C stops at once (a step can be long), except inside the optimizer's
update and a checkpoint write, which always finish (``uninterrupted``); ``Stop.step`` then puts
the run back at a step boundary: if the update was not made, where the step began (the batch
stream and the dropout generator as they were then, the gradients dropped: the weights never
changed); if it was made, the step counts as done. Either way the checkpoint holds one step's
state, all of it.

A run that stops writes notes; its stdout may be a pipe that is gone (``| tee log`` when
Ctrl-C reaches tee too). ``keep_writing`` makes a write to a closed stream a no-op, so that
it never stops a save.
"""
import contextlib
import os
import signal
import sys
import threading

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
if hasattr(signal, "SIGHUP"):                    # not on Windows
    NAMES[signal.SIGHUP] = "SIGHUP"

_active = None          # the Stop in force, if any


class Stop:
    """A context around the training loop: a signal asks the loop to stop (``requested`` is its
    number), a second Ctrl-C raises KeyboardInterrupt outside ``uninterrupted`` blocks. The
    context ends a KeyboardInterrupt: ``requested`` says that the run stopped, ``cut`` that it
    stopped inside an update (which only an error raised there can do). Outside the main
    thread, and for a signal that is ignored (SIGHUP under nohup, all of them in ranks > 0),
    nothing changes."""

    def __init__(self, say=print):
        self.say = say
        self.requested = None        # the signal that asked to stop, or None
        self.cut = False             # a KeyboardInterrupt ended the loop inside an update
        self.critical = 0            # inside uninterrupted blocks
        self.updating = False        # inside the optimizer's update (True after one that raised)
        self.updates = 0             # optimizer updates finished
        self._old = {}               # each signal's handler before

    def __enter__(self):
        global _active
        _active = self
        if threading.current_thread() is threading.main_thread():
            for signum in NAMES:
                if signal.getsignal(signum) not in (signal.SIG_IGN, None):
                    self._old[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, kind, error, tb):
        global _active
        _active = None
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        if kind is KeyboardInterrupt:
            self.requested = self.requested or signal.SIGINT
            self.cut = self.updating                 # the update cut in two: nothing may be saved
            return True
        return False

    @property
    def exit_code(self):
        """What the program exits with: 128 + the signal's number, as the shell reports it."""
        return 128 + int(self.requested)

    @property
    def name(self):
        return NAMES[self.requested]

    def _on_signal(self, signum, frame):
        if self.requested and signum == signal.SIGINT and not self.critical:
            raise KeyboardInterrupt
        if not self.requested:
            self.requested = signum
            again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
            self.say(f"{NAMES[signum]}: stopping after this step, then saving{again}")

    @contextlib.contextmanager
    def step(self, state, device_backend, optimizer):
        """One training step: a KeyboardInterrupt inside it puts the run back at a step boundary
        (unless it cut the update in two) and passes on to ``__exit__``."""
        start = state["step"]
        data_rng = state["data_rng"].bit_generator.state
        device_rng = device_backend.get_rng_state()
        updates = self.updates
        try:
            yield
        except KeyboardInterrupt:
            if not self.updating:
                if self.updates > updates:                 # the update was made: the step is done
                    state["step"] = start + 1
                else:                                      # it was not: the step never happened
                    state["data_rng"].bit_generator.state = data_rng
                    device_backend.set_rng_state(device_rng)
                    state["step"] = start
                optimizer.zero_grad()
            raise


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


class SafeStream:
    """A text stream whose writes stop, silently, once the reader is gone (a closed pipe, a
    closed terminal): a note about a save must never stop the save."""

    def __init__(self, stream):
        self.stream = stream
        self.closed_reader = False

    def write(self, text):
        if not self.closed_reader:
            try:
                return self.stream.write(text)
            except OSError:                         # BrokenPipeError, or EIO from a closed terminal
                self.closed_reader = True
        return len(text)

    def flush(self):
        if not self.closed_reader:
            try:
                self.stream.flush()
            except OSError:
                self.closed_reader = True

    def __getattr__(self, name):                   # isatty, fileno, encoding, ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def keep_writing():
    """sys.stdout and sys.stderr as SafeStreams, for the run (put back after)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        yield
    finally:
        for new, old in zip((sys.stdout, sys.stderr), saved):
            if getattr(new, "closed_reader", False):  # Python's own flush at exit would fail again
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), old.fileno())
        sys.stdout, sys.stderr = saved
