"""The checks of exercise 20 of EXERCISES.md: the DPO loss."""
import numpy as np

import tinyattn as ta
import tinyattn.nn.functional as F

from .common import ExerciseFailure, attempt, autodiff_gradcheck, compare, double, need, rand, rng_


def np_logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def np_dpo_loss(pc, pr, rc, rr, beta):
    return np.mean(-np_logsigmoid(beta * ((pc - rc) - (pr - rr))))


def tiny_gpt(seed=0):
    from tinyattn.models import GPT, GPTConfig
    ta.manual_seed(seed)
    return double(GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8))).eval()


def pair_batch(rng, b=3, t=8):
    """(x_chosen, y_chosen, x_rejected, y_rejected): x random ids; y is x shifted by one on the
    answer (2 to 5 tokens after a prompt of 3), -1 elsewhere."""
    out = []
    for _ in range(2):
        x = rng.integers(0, 11, (b, t))
        y = np.full((b, t), -1)
        for i in range(b):
            n = rng.integers(2, 6)
            y[i, 2:2 + n] = x[i, 3:3 + n]
        out += [ta.tensor(x), ta.tensor(y)]
    return tuple(out)


def np_log_softmax(model, x):
    logits = model(ta.tensor(x))[0].numpy()                           # (B, T, V)
    logp = logits - logits.max(-1, keepdims=True)
    return logp - np.log(np.exp(logp).sum(-1, keepdims=True))


def np_sequence_logprobs(model, x, y):
    """The sum of log p(target) over the positions whose target is not -1: (B,)."""
    picked = np.take_along_axis(np_log_softmax(model, x), np.maximum(y, 0)[..., None], -1)[..., 0]   # (B, T)
    return np.where(y >= 0, picked, 0.0).sum(-1)


def np_whole_sequence_logprobs(model, x):
    """The sum of log p(next token) over every position, the prompt's too: (B,)."""
    return np.take_along_axis(np_log_softmax(model, x)[:, :-1], x[:, 1:, None], -1)[..., 0].sum(-1)


def library_sequence_logprobs(model, x, y):
    """The reference solution's sequence_logprobs, with the library's ops: (B,)."""
    logits, _ = model(x)
    return F.token_logprobs(logits, y, ignore_index=-1).sum(-1)


def parameter_grads(loss_of, model):
    """{name: the gradient of loss_of(model) for that parameter (a host array, or None)}."""
    names, params = zip(*model.named_parameters())
    grads = ta.grad(loss_of(model), list(params), allow_unused=True)
    return {n: None if g is None else g.numpy() for n, g in zip(names, grads)}


def compare_parameter_grads(model, expected, what, hint=""):
    """Each parameter's .grad against expected[name]; the first one that differs fails, by name."""
    for name, p in model.named_parameters():
        e = expected[name]
        if e is None:
            continue
        if p.grad is None:
            raise ExerciseFailure(f"{what}: {name} got no gradient. {hint}".strip())
        compare(p.grad, e, f"{what}: the gradient of {name}", tol=1e-8, hint=hint)


def dpo_policy_grads(batch, beta, held=()):
    """The gradient of the DPO loss for the policy's parameters (tiny_gpt(0); the reference tiny_gpt(1)),
    computed as the reference solution does. The policy's log-probabilities named in ``held`` ("chosen",
    "rejected") are taken as constants: what a typical slip gives."""
    reference, (xc, yc, xr, yr) = tiny_gpt(1), batch
    with ta.no_grad():
        ref_chosen, ref_rejected = (library_sequence_logprobs(reference, x, y) for x, y in ((xc, yc), (xr, yr)))

    def loss(policy):
        chosen, rejected = (library_sequence_logprobs(policy, x, y) for x, y in ((xc, yc), (xr, yr)))
        chosen = chosen.detach() if "chosen" in held else chosen
        rejected = rejected.detach() if "rejected" in held else rejected
        return -F.logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected))).mean()
    return parameter_grads(loss, tiny_gpt(0))


def same_grads(model, grads):
    return all((g is None) == (p.grad is None) and (g is None or np.allclose(p.grad.numpy(), g, rtol=1e-7,
                                                                             atol=1e-10))
               for (name, p), g in zip(model.named_parameters(), grads.values()))


def dpo_sequence_logprobs(mod):
    sequence_logprobs, rng = need(mod, "sequence_logprobs"), rng_()
    model = tiny_gpt()
    x, y = pair_batch(rng)[:2]
    got = sequence_logprobs(model, x, y)
    want = np_sequence_logprobs(model, x.numpy(), y.numpy())
    if got.shape == want.shape and np.allclose(got.numpy(), np_whole_sequence_logprobs(model, x.numpy()), atol=1e-8):
        raise ExerciseFailure("sequence_logprobs sums over the prompt's tokens too: only the answer's count "
                              "(the positions whose target is not -1)")
    compare(got, want, "sequence_logprobs(a GPT, x (3, 8), y (3, 8) with -1 off the answer)",
            tol=1e-9, hint="log softmax of the logits at each target, summed over the positions whose target "
                           "is not -1 (F.token_logprobs with ignore_index=-1, then .sum(-1))")
    u = ta.tensor(rng.standard_normal(3), dtype="float64")                       # a random weight per row
    what = "the gradient of <u, sequence_logprobs(a GPT, x, y)> for the model's parameters"
    attempt(what, lambda: (sequence_logprobs(model, x, y) * u).sum().backward())
    expected = parameter_grads(lambda m: (library_sequence_logprobs(m, x, y) * u).sum(), tiny_gpt())
    compare_parameter_grads(model, expected, what, hint="A piece computed on raw arrays (.numpy(), numpy "
                            "functions, .data) or under ta.no_grad() is a constant to autodiff, and its share of "
                            "the gradient is lost: write every step with tinyattn ops (F.log_softmax or "
                            "F.token_logprobs)")


def dpo_loss_formula(mod):
    dpo_loss, rng = need(mod, "dpo_loss"), rng_()
    pc, pr, rc, rr = (rng.normal(-15, 6, 7) for _ in range(4))
    for beta in (0.1, 0.5, 2.0):
        got = dpo_loss(*(ta.tensor(a, dtype="float64") for a in (pc, pr, rc, rr)), beta)
        one_side = np.mean(-np_logsigmoid(beta * (pc - rc) - (pr - rr)))
        if np.shape(got.numpy()) == () and abs(float(got.numpy()) - one_side) < 1e-9:
            raise ExerciseFailure(f"dpo_loss with beta {beta}: beta multiplies only the chosen answer's log-ratio; "
                                  "it scales the difference of the two: beta * ((pc - rc) - (pr - rr))")
        compare(got, np_dpo_loss(pc, pr, rc, rr, beta), f"dpo_loss of 7 pairs, beta {beta}", tol=1e-9,
                hint="-logsigmoid(beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))), "
                     "the mean over the pairs")
    big = np.array([400.0, -400.0])
    got = dpo_loss(*(ta.tensor(a, dtype="float64") for a in (big, -big, np.zeros(2), np.zeros(2))), 1.0)
    compare(got, np_dpo_loss(big, -big, np.zeros(2), np.zeros(2), 1.0), "dpo_loss with margins of +-800",
            hint="F.logsigmoid is stable for large margins; log(sigmoid(x)) is not")


def dpo_loss_gradcheck(mod):
    dpo_loss, rng = need(mod, "dpo_loss"), rng_()
    inputs = [rand(rng, 5, grad=True) for _ in range(4)]
    autodiff_gradcheck("the gradients of dpo_loss(4 x (5,), beta 0.7)", lambda *a: dpo_loss(*a, 0.7), inputs,
                       ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected"))


def dpo_reference_is_frozen(mod):
    dpo_batch_loss, rng = need(mod, "dpo_batch_loss"), rng_()
    policy, reference = tiny_gpt(0), tiny_gpt(1)
    batch = pair_batch(rng)
    xc, yc, xr, yr = (t.numpy() for t in batch)
    loss = dpo_batch_loss(policy, reference, batch, 0.5)
    want = np_dpo_loss(np_sequence_logprobs(policy, xc, yc), np_sequence_logprobs(policy, xr, yr),
                       np_sequence_logprobs(reference, xc, yc), np_sequence_logprobs(reference, xr, yr), 0.5)
    compare(loss, want, "dpo_batch_loss(policy, reference, a batch of 3 pairs, beta 0.5)", tol=1e-9,
            hint="the policy's and the reference's sequence_logprobs of each answer, into dpo_loss")
    loss.backward()
    if any(p.grad is not None for p in reference.parameters()):
        raise ExerciseFailure("the reference got a gradient: it is frozen, so compute its log-probabilities under "
                              "ta.no_grad() (trained along, its log-ratio would cancel the policy's)")
    if all(p.grad is None for p in policy.parameters()):
        raise ExerciseFailure("the policy got no gradient: compute its log-probabilities with gradients on")


HELD_WRONG = {
    "rejected": "the policy's log-probability of the rejected answer carries no gradient (computed under "
                "ta.no_grad(), indented into the reference's block?): the loss then only raises the chosen "
                "answer and never pushes the rejected one down. Only the reference's two log-probabilities go "
                "under ta.no_grad()",
    "chosen": "the policy's log-probability of the chosen answer carries no gradient (computed under "
              "ta.no_grad(), indented into the reference's block?): the loss then only pushes the rejected "
              "answer down and never raises the chosen one. Only the reference's two log-probabilities go "
              "under ta.no_grad()",
}


def dpo_policy_gradient(mod):
    """The policy's gradient, every parameter, against the reference solution's on the same batch: the
    chosen and the rejected answers' log-probabilities must both carry it."""
    dpo_batch_loss, rng = need(mod, "dpo_batch_loss"), rng_(3)
    policy, reference, batch = tiny_gpt(0), tiny_gpt(1), pair_batch(rng)
    what = "the policy's gradient of dpo_batch_loss(policy, reference, a batch of 3 pairs, beta 0.5)"
    attempt(what, lambda: dpo_batch_loss(policy, reference, batch, 0.5).backward())
    expected = dpo_policy_grads(batch, 0.5)
    if not same_grads(policy, expected):
        for held, message in HELD_WRONG.items():
            if same_grads(policy, dpo_policy_grads(batch, 0.5, (held,))):
                raise ExerciseFailure(f"{what}: {message}")
    compare_parameter_grads(policy, expected, f"{what} (against the reference solution's)",
                            hint="Both answers' log-probabilities under the policy carry the gradient; the "
                                 "reference's carry none.")


CHECKS = [dpo_sequence_logprobs, dpo_loss_formula, dpo_loss_gradcheck, dpo_reference_is_frozen, dpo_policy_gradient]
