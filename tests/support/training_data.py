"""The tiny text and model that the training tests share, and the repository's root."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 40
TINY = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--batch_size", "8",
        "--eval_iters", "2", "--warmup_iters", "5", "--lr_decay_iters", "40", "--learning_rate", "3e-3",
        "--quiet", "--sample_tokens", "0"]


def error_lines(err):
    """The lines of python -m train's stderr that are not notes or the resume line (they say what
    the run adapted or where it starts; an error stands alone in the lines left)."""
    return [line for line in err.strip().splitlines()
            if not line.startswith(("python -m train: note: ", "python -m train: resuming "))]


def ctrl_c_in_backward(monkeypatch, at_call, action=None):
    """Patch the training program's step so that, inside the backward of its at_call-th loss, this
    process gets a real SIGINT, as Ctrl-C sends it (or ``action()`` runs). The loss passes through
    an identity op of the test's own, whose backward does it: no library code is replaced (that
    would turn the compiled paths off, and the run would not be the one it is compared with)."""
    import signal
    import tinyattn as ta
    from train import loop
    real, calls = loop.train_step, []

    class InTheBackward(ta.Function):
        def forward(self, loss):
            return loss.copy()

        def backward(self, g):
            calls.append(1)
            if len(calls) == at_call:
                action() if action else os.kill(os.getpid(), signal.SIGINT)
            return g

    def train_step(model, optimizer, batches, grad_clip, average_grads=None, loss_fn=loop.lm_loss):
        return real(model, optimizer, batches, grad_clip, average_grads,
                    lambda model, batch: InTheBackward.apply(loss_fn(model, batch)))
    monkeypatch.setattr(loop, "train_step", train_step)
