"""``with ta.profile() as p:`` where the time goes, op by op.

Inside the block every op's forward and backward is timed, and the bytes of
the arrays it returns (its output; its gradients) are counted. Afterwards:

    print(p.table())               # the top ops: calls, forward and backward ms, MB returned
    p.chrome_trace("trace.json")   # open in chrome://tracing or https://ui.perfetto.dev

The ops that an op's backward formula runs belong to that backward: their
time is its backward time. On the CPU the times come from the host clock.
On a GPU ops run asynchronously, so the host clock would only measure the
launch: there each op is timed with CUDA events, on the device's own clock.
Outside the block nothing is recorded and nothing is paid.
"""
import json
import math
import time
from collections import defaultdict

from .hooks import Tool


def _nbytes(backend, array):
    """Bytes of an array (or of a tuple of them), on any backend (the array API has no ``nbytes``)."""
    if type(array) is tuple:
        return sum(_nbytes(backend, a) for a in array)
    return math.prod(array.shape) * backend.dtype_of(array).itemsize


class _Event:
    __slots__ = ("name", "phase", "backend", "start", "end", "nbytes", "shapes")

    def __init__(self, name, phase, backend, start, shapes):
        self.name, self.phase, self.backend, self.start, self.shapes = name, phase, backend, start, shapes
        self.end, self.nbytes = None, 0


class profile(Tool):
    """Record every op's forward and backward inside the ``with`` block."""
    order = 1      # innermost: a detect_anomaly() check around it is not timed

    def __init__(self):
        self.events = []          # _Event, in the order the ops ran
        self._open = []           # events begun but not yet ended (a stack)
        self._origins = {}        # backend -> its first time mark: time zero of the trace
        self.wall_s = 0.0         # seconds inside the block (summed when it is entered again)

    def __enter__(self):
        self._wall_start = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc):
        self.wall_s += time.perf_counter() - self._wall_start
        return super().__exit__(*exc)

    # --- the hooks ---
    def _begin(self, ctx, phase, shapes):
        backend = ctx.backend
        if backend not in self._origins:
            self._origins[backend] = backend.time_mark()
        self._open.append(_Event(type(ctx).__name__, phase, backend, backend.time_mark(), shapes))

    def _end(self, nbytes):
        event = self._open.pop()
        event.end = event.backend.time_mark()
        event.nbytes = nbytes
        self.events.append(event)

    def before_forward(self, ctx, inputs):
        self._begin(ctx, "forward", [t.shape for t in inputs])

    def after_forward(self, ctx, inputs, data):
        self._end(_nbytes(ctx.backend, data))

    def before_backward(self, ctx, grad):
        grads = grad if type(grad) is tuple else (grad,)           # a tuple: an op with several outputs
        self._begin(ctx, "backward", [g.shape for g in grads if g is not None])

    def after_backward(self, ctx, grad, grads):
        self._end(sum(_nbytes(ctx.backend, g.data) for g in grads if g is not None))

    def failed(self, ctx):
        self._open.pop()                    # the op raised: its event never ends

    # --- the results ---
    @property
    def timer(self):
        """The clock of the devices the ops ran on: 'CUDA events' when any ran on a GPU, else 'host clock'."""
        clocks = {b.clock for b in self._origins} - {"host clock"}
        return clocks.pop() if clocks else "host clock"

    def _seconds(self, event):
        return event.backend.seconds_between(event.start, event.end)

    def key_averages(self):
        """{op name: dict(calls, forward_s, backward_s, total_s, bytes)}, from the most time to the least."""
        rows = defaultdict(lambda: dict(calls=0, forward_s=0.0, backward_s=0.0, bytes=0))
        for e in self.events:
            row = rows[e.name]
            row["calls"] += e.phase == "forward"
            row[f"{e.phase}_s"] += self._seconds(e)
            row["bytes"] += e.nbytes
        for row in rows.values():
            row["total_s"] = row["forward_s"] + row["backward_s"]
        return dict(sorted(rows.items(), key=lambda kv: -kv[1]["total_s"]))

    def table(self, row_limit=15):
        """The ``row_limit`` ops that took the most time, as a text table (-1 or None: every op,
        as in PyTorch)."""
        rows = self.key_averages()
        if row_limit is None or row_limit < 0:
            row_limit = len(rows)
        total = sum(r["total_s"] for r in rows.values())
        lines = [f"{'op':<22}{'calls':>7}{'forward ms':>12}{'backward ms':>13}{'total ms':>11}{'%':>7}{'MB out':>9}"]
        for name, r in list(rows.items())[:row_limit]:
            share = 100 * r["total_s"] / total if total else 0.0
            lines.append(f"{name:<22}{r['calls']:>7}{1e3 * r['forward_s']:>12.2f}{1e3 * r['backward_s']:>13.2f}"
                         f"{1e3 * r['total_s']:>11.2f}{share:>7.1f}{r['bytes'] / 1e6:>9.2f}")
        if len(rows) > row_limit:
            lines.append(f"... {len(rows) - row_limit} more ops")
        wall = f"; {1e3 * self.wall_s:.2f} ms in the block" if self.wall_s else ""
        lines.append(f"{'all ops':<22}{sum(r['calls'] for r in rows.values()):>7}"
                     f"{1e3 * sum(r['forward_s'] for r in rows.values()):>12.2f}"
                     f"{1e3 * sum(r['backward_s'] for r in rows.values()):>13.2f}{1e3 * total:>11.2f}"
                     f"{100.0 if total else 0.0:>7.1f}{sum(r['bytes'] for r in rows.values()) / 1e6:>9.2f}")
        lines.append(f"times: {self.timer}{wall}; an op's backward includes the ops its formula runs")
        return "\n".join(lines)

    def chrome_trace(self, path):
        """Write the ops as a Chrome trace (JSON): chrome://tracing or Perfetto open it."""
        trace = []
        for e in self.events:
            start = e.backend.seconds_between(self._origins[e.backend], e.start)
            trace.append(dict(name=e.name if e.phase == "forward" else f"{e.name}.backward", cat=e.phase,
                              ph="X", ts=round(start * 1e6, 3), dur=round(self._seconds(e) * 1e6, 3),
                              pid=e.backend.name, tid=e.phase,
                              args=dict(shapes=[list(s) for s in e.shapes], bytes=e.nbytes)))
        with open(path, "w") as f:
            json.dump(dict(traceEvents=trace, displayTimeUnit="ms"), f)
        return path
