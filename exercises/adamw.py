"""Exercise 15 (EXERCISES.md, "Build the core"): one AdamW step, with decoupled weight decay.

    python -m exercises adamw
"""
from tinyattn.optim import Optimizer


class AdamW(Optimizer):
    """``AdamW(params, lr, betas, eps, weight_decay)``, as ``ta.optim.AdamW``.

    Optimizer gives you ``self.param_groups`` (dicts with "params", "lr",
    "betas", "eps", "weight_decay") and ``self.state`` (a dict for your
    per-parameter arrays, keyed by ``id(p)``).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def step(self):
        """Update every parameter that has a gradient, in place: ``p.data`` is the raw array,
        ``p.grad.data`` its gradient, ``p.xp`` the array namespace. Read each group's
        hyperparameters at every step (the training loop changes "lr")."""
        raise NotImplementedError
