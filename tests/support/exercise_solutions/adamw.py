"""Reference solution: AdamW's step with decoupled weight decay (exercise 15 of EXERCISES.md)."""
import math

from tinyattn.optim import Optimizer


class AdamW(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, xp = p.grad.data, p.xp
                state = self.state.get(id(p))
                if state is None:
                    state = self.state[id(p)] = {"step": 0, "exp_avg": xp.zeros_like(p.data),
                                                 "exp_avg_sq": xp.zeros_like(p.data)}
                state["step"] += 1
                t = state["step"]
                state["exp_avg"] = m = b1 * state["exp_avg"] + (1 - b1) * g            # first moment
                state["exp_avg_sq"] = v = b2 * state["exp_avg_sq"] + (1 - b2) * (g * g)  # second moment
                p.data = p.data * (1 - lr * wd)                                        # decoupled decay
                # lr * m_hat / (sqrt(v_hat) + eps), with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t):
                step_size = lr / (1 - b1 ** t)
                denom = xp.sqrt(v) * (1.0 / math.sqrt(1 - b2 ** t)) + eps
                p.data = p.data - step_size * (m / denom)
