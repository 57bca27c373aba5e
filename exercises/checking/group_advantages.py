"""The checks of exercise 21 (EXERCISES.md): the group-mean advantage."""
import numpy as np

from .common import ExerciseFailure, compare, need

REWARDS = np.array([[1, 0, 0, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=float)   # (P, K) = (3, 5)


def formula(rewards, normalize=False):
    advantages = rewards - rewards.mean(1, keepdims=True)
    if normalize:
        std = rewards.std(1, keepdims=True)
        advantages = advantages / np.where(std > 0, std, 1.0)
    return advantages


def advantages_of(mod, rewards, normalize=False):
    got = need(mod, "group_advantages")(rewards.copy(), normalize=normalize)
    if got is None:
        raise ExerciseFailure("group_advantages returned None: return the (P, K) array of advantages")
    kind = np.asarray(got).dtype
    if kind.kind == "f" and kind.itemsize < 8:
        raise ExerciseFailure(f"group_advantages returned {kind} advantages: work in float64 (convert the "
                              f"rewards with rewards.astype(np.float64)); {kind} keeps about "
                              f"{np.finfo(kind).precision} digits, so 1 - 0.4 comes out "
                              f"{float(kind.type(1) - kind.type(0.4)):.9g}")
    got = np.asarray(got, dtype=np.float64)
    if got.shape != rewards.shape:
        raise ExerciseFailure(f"group_advantages of rewards {rewards.shape} gave shape {got.shape}: one advantage "
                              "per answer, (P, K) (keepdims=True keeps each group's mean broadcastable)")
    return got


def advantages_subtract_each_groups_mean(mod):
    got = advantages_of(mod, REWARDS)
    what = "group_advantages of 0/1 rewards (3 questions, 5 answers each, the second question's all right)"
    if np.allclose(got, REWARDS):
        raise ExerciseFailure(f"{what} are the rewards themselves: subtract each question's mean reward (the "
                              "baseline), or every right answer is pushed up alike, however easy its question")
    if np.allclose(got, REWARDS - REWARDS.mean()):
        raise ExerciseFailure(f"{what}: you subtract the mean over the whole batch; subtract the mean of each "
                              "question's own answers (axis 1): an easy question's right answers are no news")
    if np.allclose(got, REWARDS - REWARDS.mean(0, keepdims=True)):
        raise ExerciseFailure(f"{what}: you subtract the mean over the questions (axis 0); a group is the K "
                              "answers to one question, a row (axis 1)")
    if np.allclose(got, REWARDS - np.floor(REWARDS.mean(1, keepdims=True))):
        raise ExerciseFailure(f"{what}: each question's mean is rounded down (// is integer division): "
                              "work in floats, the mean of 1, 0, 0, 1, 0 is 0.4")
    compare(got, formula(REWARDS), what, hint="reward minus the mean reward of its row")
    if np.abs(got[1]).max() > 0:
        raise ExerciseFailure("a question whose answers all scored 1 must give advantages of 0: nothing to learn")


def advantages_take_integer_rewards(mod):
    rewards = np.array([[1, 0, 0], [0, 0, 1]])                                 # ints, as a reward function gives
    compare(advantages_of(mod, rewards), formula(rewards.astype(float)),
            "group_advantages of integer rewards (2 questions, 3 answers each, one right)",
            hint="work in floats: integer division or an integer array cuts 1/3 to 0")


FLOAT64_TOLERANCE = ("float64 rounds these few sums and one division to about 1e-16, so 1e-10 is room for any "
                     "order of operations; an eps added to the std, as GRPO code adds 1e-8, passes where it shrinks "
                     "each group's advantages by less than 0.1%, and this is not that")


def shrunk_by_a_small_eps(got, rewards):
    """Is ``got`` each group's advantages over its std with a small eps in the denominator (std + eps,
    sqrt(var + eps)): every row the right one times a factor between 0.999 and 1?

    GRPO code adds such an eps (1e-8 to 1e-4) so that no group divides by 0: a group whose answers all
    scored the same still gets 0, and the others change by eps / std, far below what training notices.
    It is accepted; anything else must match the formula as float64 computes it (FLOAT64_TOLERANCE).
    """
    expected = formula(rewards, normalize=True)
    norm2 = (expected * expected).sum(1, keepdims=True)                       # 0 for a group of std 0
    factor = np.where(norm2 > 0, (got * expected).sum(1, keepdims=True) / np.where(norm2 > 0, norm2, 1.0), 1.0)
    return bool(np.all((factor > 1 - 1e-3) & (factor <= 1 + 1e-12))
                and np.allclose(got, factor * expected, rtol=1e-10, atol=1e-12))


def normalized_advantages_divide_by_the_groups_std(mod):
    got = advantages_of(mod, REWARDS, normalize=True)
    what = "group_advantages(rewards, normalize=True)"
    if not np.all(np.isfinite(got)):
        raise ExerciseFailure(f"{what} holds NaN or Inf: a group whose answers all scored the same has std 0; "
                              "leave its advantages at 0 (divide by 1 there)")
    if np.allclose(got, formula(REWARDS)):
        raise ExerciseFailure(f"{what} did not divide by the group's std")
    ddof1 = (REWARDS - REWARDS.mean(1, keepdims=True)) / np.where(REWARDS.std(1, ddof=1, keepdims=True) > 0,
                                                                 REWARDS.std(1, ddof=1, keepdims=True), 1.0)
    if np.allclose(got, ddof1):
        raise ExerciseFailure(f"{what}: you divide by the std with ddof=1; this exercise takes np.std's "
                              "(ddof=0), the std of the group's rewards as they are")
    if shrunk_by_a_small_eps(got, REWARDS):
        return
    compare(got, formula(REWARDS, normalize=True), what, why=FLOAT64_TOLERANCE,
            hint="Divide each row by its own std (axis 1).")


def a_policy_learns_with_your_advantages(mod):
    """A policy over 4 answers, the right one answer 2: sampled, scored, your advantages,
    the library's policy-gradient loss, SGD. The right answer must become the likely one."""
    import tinyattn as ta
    import tinyattn.nn.functional as F
    from train.rl import policy_gradient_loss
    group_advantages = need(mod, "group_advantages")
    rng = np.random.default_rng(0)
    logits = ta.tensor(np.zeros(4), dtype="float64", requires_grad=True)        # (V,): uniform to start
    for _ in range(60):
        probs = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum()
        answers = rng.choice(4, size=(4, 8), p=probs)                            # (P, K)
        advantages = np.asarray(group_advantages((answers == 2).astype(float)), dtype=np.float64)
        logp = F.log_softmax(logits, -1)[ta.tensor(answers.reshape(-1))].view(32, 1)    # (N, 1)
        loss = policy_gradient_loss(logp, ta.tensor(advantages.reshape(-1), dtype="float64"),
                                    ta.tensor(np.ones((32, 1)), dtype="float64"))
        logits.grad = None
        loss.backward()
        logits.data = (logits - 2.0 * logits.grad).data
    p_right = float(np.exp(logits.numpy()[2]) / np.exp(logits.numpy()).sum())
    if not p_right > 0.9:
        raise ExerciseFailure(f"after 60 steps of REINFORCE with your advantages the right answer has probability "
                              f"{p_right:.3f} (expected above 0.9)")


CHECKS = [advantages_subtract_each_groups_mean, advantages_take_integer_rewards,
          normalized_advantages_divide_by_the_groups_std, a_policy_learns_with_your_advantages]
