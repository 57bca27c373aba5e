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


def backward_with_ctrl_c(at_call):
    """Tensor.backward that sends this process a real SIGINT, as Ctrl-C does, at its at_call-th
    call (a test patches it in: the run is stopped inside that step's backward)."""
    import signal
    import tinyattn as ta
    real, calls = ta.Tensor.backward, []

    def backward(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)
    return backward
