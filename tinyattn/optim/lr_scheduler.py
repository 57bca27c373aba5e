"""Learning-rate schedules, as PyTorch's ``torch.optim.lr_scheduler``: each one sets the
rate of every parameter group of an optimizer, one step() at a time.

    opt = ta.optim.AdamW(model.parameters(), lr=1e-3)
    sched = ta.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for it in range(1000):
        ...; opt.step(); sched.step()        # the scheduler after the optimizer, as in PyTorch

A scheduler counts its steps in ``last_epoch`` (PyTorch's name: an epoch or an iteration,
whichever you call step() for), and keeps each group's starting rate in ``base_lrs`` (and in
the group, as "initial_lr"). Making one takes step 0: the optimizer's rates become the
schedule's first ones. ``get_last_lr()`` is the list of rates it set last, one per group.

Each schedule here is a formula of the step count (PyTorch's closed forms). PyTorch computes
most of them step by step from each group's current rate instead; the rates are the same, to
float rounding, unless something else changes a rate in between (two schedulers driving one
optimizer at once). ReduceLROnPlateau, which reacts to a metric, is the one that keeps state.

``state_dict()`` holds what a scheduler needs to go on from where it is (not the optimizer,
nor functions such as LambdaLR's, which cannot be saved); load the optimizer's state too.
"""
import bisect
import math

from . import Optimizer


class LRScheduler:
    """The base: step() counts one more step and writes ``get_lr()``'s rates into the optimizer.

    ``last_epoch=-1`` starts the schedule. Another value resumes it at that step (the groups
    must hold "initial_lr", from the optimizer's saved state): the rates become that step's,
    and the next step() goes on from there (PyTorch advances one step more here).
    """

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param_groups[{i}] has no 'initial_lr'; to resume at "
                                   f"last_epoch={last_epoch}, load the optimizer's saved state first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = max(last_epoch, 0)
        self._set(self.get_lr())                          # step 0, or the step resumed at

    def get_lr(self):
        """Each group's rate at step ``last_epoch``."""
        raise NotImplementedError

    def step(self):
        self.last_epoch += 1
        self._set(self.get_lr())

    def _set(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self):
        """The rates this scheduler set last, one per parameter group."""
        return self._last_lr

    def state_dict(self):
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


def _per_group(name, optimizer, value):
    """A value for each parameter group: a list or tuple of them, or one for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"expected {len(optimizer.param_groups)} values for {name} (one per parameter "
                             f"group), got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class LambdaLR(LRScheduler):
    """base_lr * lr_lambda(step): one function, or one per group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group("lr_lambda", optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base_lr * f(self.last_epoch) for f, base_lr in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self):
        """Without the functions (they cannot be saved; load_state_dict keeps this scheduler's own)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "lr_lambdas")}


class StepLR(LRScheduler):
    """base_lr * gamma ** (step // step_size): gamma times smaller every step_size steps."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """base_lr * gamma ** (the number of milestones reached): gamma times smaller at each milestone."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        reached = bisect.bisect_right(self.milestones, self.last_epoch)
        return [base_lr * self.gamma ** reached for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """base_lr times a factor that goes in a straight line from start_factor to end_factor over
    total_iters steps, then stays (a warmup, with the defaults: a third of the rate up to all of it)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        done = min(self.total_iters, self.last_epoch) / self.total_iters         # 0 -> 1, then 1
        factor = self.start_factor + (self.end_factor - self.start_factor) * done
        return [base_lr * factor for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) (1 + cos(pi step / T_max)) / 2: half a cosine from base_lr
    down to eta_min over T_max steps (and, past T_max, back up: the cosine goes on)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        shape = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2         # 1 -> 0
        return [self.eta_min + (base_lr - self.eta_min) * shape for base_lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """Several schedules one after another: schedulers[0] until milestones[0], then schedulers[1],
    counting its own steps from 0 there, and so on (a warmup, then a decay)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler, got none")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"SequentialLR: scheduler {i} is a ReduceLROnPlateau, whose step() needs a metric")
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} ({type(s).__name__}) belongs to another optimizer")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        i = bisect.bisect_right(self._milestones, self.last_epoch)                # which scheduler runs now
        scheduler = self._schedulers[i]
        scheduler.last_epoch = self.last_epoch - (self._milestones[i - 1] if i else 0)   # its own step count
        return scheduler.get_lr()

    def state_dict(self):
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        for s, saved in zip(self._schedulers, state.pop("_schedulers"), strict=True):
            s.load_state_dict(saved)
        self.__dict__.update(state)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith and Topin): the rate rises from max_lr / div_factor to max_lr over
    the first pct_start of total_steps, then falls to max_lr / (div_factor * final_div_factor);
    the momentum (SGD's, or Adam's first beta) does the opposite, between max_momentum and
    base_momentum. anneal_strategy "cos" or "linear" shapes each phase; three_phase rises,
    falls back to the start, then falls to the end. Stepping past total_steps is an error."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
            if epochs <= 0 or steps_per_epoch <= 0:
                raise ValueError(f"OneCycleLR: epochs and steps_per_epoch must be positive, got {epochs} and "
                                 f"{steps_per_epoch}")
            total_steps = epochs * steps_per_epoch
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"OneCycleLR: total_steps must be a positive int, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy, self.cycle_momentum = total_steps, anneal_strategy, cycle_momentum
        # each phase: the step it ends at, and the group's keys it goes from and to (rate, momentum)
        up = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr", "base_momentum",
                            "max_momentum"),
                           (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, _per_group("max_lr", optimizer, max_lr)):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("OneCycleLR: cycle_momentum needs an optimizer with momentum or betas")
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for group, top, bottom in zip(optimizer.param_groups,
                                              _per_group("max_momentum", optimizer, max_momentum),
                                              _per_group("base_momentum", optimizer, base_momentum)):
                    group["max_momentum"], group["base_momentum"] = top, bottom
                    self._set_momentum(group, top)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        """From start (pct 0) to end (pct 1): half a cosine, or a straight line."""
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _set_momentum(self, group, momentum):
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def get_lr(self):
        """The rate of each group at this step; with cycle_momentum, sets its momentum too."""
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {t} times; the schedule has {self.total_steps} steps")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr_from, lr_to, m_from, m_to) in enumerate(self.phases):
                if t <= end or i == len(self.phases) - 1:                        # the phase this step is in
                    pct = (t - start) / (end - start)
                    lrs.append(self._anneal(group[lr_from], group[lr_to], pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[m_from], group[m_to], pct))
                    break
                start = end
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """Rates times ``factor`` (down to ``min_lr``) once a metric has not improved for more than
    ``patience`` steps: step(metric), after each evaluation.

    mode "min" (a loss) or "max" (an accuracy). An improvement must beat the best so far by
    ``threshold``: relative (best * (1 -+ threshold)) or absolute (best -+ threshold), by
    ``threshold_mode``. After a reduction, ``cooldown`` steps count no bad steps. A reduction
    smaller than ``eps`` is skipped. The rates are the groups' own (not a formula of the step).
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1, got {factor}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        self.min_lrs = _per_group("min_lr", optimizer, min_lr)
        self.mode, self.factor, self.patience, self.cooldown, self.eps = mode, factor, patience, cooldown, eps
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0                       # steps since the last improvement
        self.cooldown_counter = 0                     # steps left to wait after a reduction
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def is_better(self, a, best):
        if self.threshold_mode == "rel":
            return a < best * (1 - self.threshold) if self.mode == "min" else a > best * (1 + self.threshold)
        return a < best - self.threshold if self.mode == "min" else a > best + self.threshold

    def step(self, metrics):
        current = float(metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0                   # bad steps in a cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
                new_lr = max(group["lr"] * self.factor, min_lr)
                if group["lr"] - new_lr > self.eps:
                    group["lr"] = new_lr
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "LinearLR", "CosineAnnealingLR", "SequentialLR",
           "OneCycleLR", "ReduceLROnPlateau"]
