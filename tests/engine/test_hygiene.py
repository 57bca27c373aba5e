"""Backend hygiene: a training step never copies data from the device to the host.

On a GPU every such copy waits for the device to finish (``float(loss)``,
``if loss < x``, ``loss.item()``, printing an array). The stand-in device
"strict" (array_api_strict on a non-CPU device) lets us count them on a CPU:
we wrap every way an array can leave it and run the real ``train_step``.
"""
import traceback

import numpy as np
import pytest

array_api_strict = pytest.importorskip("array_api_strict")

import tinyattn as ta  # noqa: E402
from tinyattn.backend import StrictBackend, get_backend  # noqa: E402
from tinyattn.models import GPT, GPTConfig  # noqa: E402
import train.command as train_command  # noqa: E402
import train.loop as train_main  # noqa: E402
import train.report as train_report  # noqa: E402

# Array methods through which data reaches the host (implicitly or not).
LEAKS = ("__bool__", "__float__", "__int__", "__index__", "__complex__", "__array__",
         "__dlpack__", "__buffer__", "__repr__", "__str__", "tolist")


class Transfers:
    """Counts device->host copies on the "strict" device, with the line that made each."""

    def __init__(self):
        self.explicit = []      # Backend.to_numpy: Tensor.numpy(), .item(), .tolist(), float(t), ...
        self.implicit = []      # anything else: float(array), bool(array), array.to_device(CPU), ...
        self._inside_to_numpy = False

    def reset(self):
        self.explicit, self.implicit = [], []

    @staticmethod
    def where():
        """The last three calls in tinyattn/ or train/ that led to the copy, outermost first."""
        chain = []
        for frame in traceback.extract_stack()[:-2]:
            path = frame.filename.replace("\\", "/")
            if "/tinyattn/" in path or "/train/" in path:
                chain.append(f"{'/'.join(path.split('/')[-2:])}:{frame.lineno} ({frame.name})")
        return " -> ".join(chain[-3:]) or "outside tinyattn"

    def install(self, monkeypatch):
        counter = self
        original_to_numpy = StrictBackend.to_numpy

        def to_numpy(backend, a):
            counter.explicit.append(counter.where())
            counter._inside_to_numpy = True
            try:
                return original_to_numpy(backend, a)
            finally:
                counter._inside_to_numpy = False

        monkeypatch.setattr(StrictBackend, "to_numpy", to_numpy)
        array_type = get_backend("strict").array_type

        def wrap(name):
            original = getattr(array_type, name)

            def method(self, *args, **kwargs):
                moving = name != "to_device" or args[0] != self.device
                if moving and not counter._inside_to_numpy:
                    counter.implicit.append(f"{name} at {counter.where()}")
                return original(self, *args, **kwargs)
            return method

        for name in LEAKS + ("to_device",):
            if hasattr(array_type, name):
                monkeypatch.setattr(array_type, name, wrap(name))
        return self


@pytest.fixture
def transfers(monkeypatch):
    return Transfers().install(monkeypatch)


def tiny_gpt_and_batches(device, dropout=0.1, n_batches=1):
    """A 2-layer GPT on ``device`` (dropout on, to cover it), its AdamW, and host-made batches."""
    ta.manual_seed(0)
    config = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=dropout)
    model = GPT(config).to(device)
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    rng = np.random.default_rng(0)
    batches = [(ta.tensor(rng.integers(0, 11, (3, 8)), device=device),
                ta.tensor(rng.integers(0, 11, (3, 8)), device=device)) for _ in range(n_batches)]
    return model, optimizer, batches


@pytest.mark.parametrize("n_batches", [1, 2], ids=["one batch", "accumulating two"])
def test_a_training_step_makes_no_device_to_host_copy(transfers, n_batches):
    """forward, backward, clip_grad_norm_, AdamW: all on the device, the loss too."""
    model, optimizer, batches = tiny_gpt_and_batches("strict", n_batches=n_batches)
    transfers.reset()
    for _ in range(3):                   # the first step also creates the AdamW state
        loss = train_main.train_step(model, optimizer, batches, grad_clip=1.0)
    assert transfers.explicit == [] and transfers.implicit == [], (
        f"host copies in a training step: {transfers.explicit + transfers.implicit}")
    assert loss.device == "strict" and loss.shape == ()

    value = loss.item()                  # reading the loss: exactly one copy, an explicit one
    assert isinstance(value, float) and np.isfinite(value)
    assert len(transfers.explicit) == 1 and transfers.implicit == []


def test_the_training_loop_reads_the_loss_only_at_log_steps(transfers, monkeypatch, tmp_path):
    """The real loop (train.loop.train) on the stand-in device, with evaluation and
    checkpoints stubbed out: the only copies are the loss reads at steps 0, 3 and 6."""
    text = tmp_path / "tiny.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 20)
    monkeypatch.setattr(train_main, "estimate_loss", lambda *args: {"train": 1.0, "val": 1.0})
    monkeypatch.setattr(train_main.checkpoint, "save_run", lambda *args, **kwargs: None)
    monkeypatch.setattr(train_report, "write_plot", lambda rows, out_dir, train_losses=(): "no plot")
    argv = ["--data", str(text), "--device", "strict", "--out_dir", str(tmp_path / "run"),
            "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "8", "--batch_size", "4",
            "--dropout", "0.1", "--max_iters", "7", "--log_interval", "3", "--eval_interval", "100",
            "--eval_iters", "1", "--quiet", "--sample_tokens", "0"]
    assert train_command.main(argv) == 0
    assert transfers.implicit == [], f"implicit host copies: {transfers.implicit}"
    assert len(transfers.explicit) == 3, f"expected 3 loss reads (steps 0, 3, 6), got {transfers.explicit}"
    assert all("loop.py" in w for w in transfers.explicit), transfers.explicit


def test_the_counter_sees_implicit_conversions(transfers):
    """The instrument itself: float(), bool() and printing a device array are all caught."""
    x = ta.tensor([1.5], device="strict")
    s = x.sum()
    float(s.data), bool(s.data > 0), repr(s.data)
    assert len(transfers.implicit) == 3 and transfers.explicit == []
    float(s)                             # Tensor.__float__ goes through to_numpy: explicit
    assert len(transfers.explicit) == 1 and len(transfers.implicit) == 3
