"""Exercise 20 (EXERCISES.md, "Fine-tune"): the DPO loss.

    python -m exercises dpo
"""
import tinyattn as ta
import tinyattn.nn.functional as F


def sequence_logprobs(model, x, y):
    """log p(answer | prompt) of each row. x (B, T): the ids the model reads; y (B, T): the next
    ids, -1 where the token is not the answer's (the prompt, padding). -> (B,)."""
    raise NotImplementedError


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """The DPO loss, the mean over the pairs. Each argument is (B,): the log-probabilities of
    the chosen and rejected answers under the policy and under the reference. -> 0-d."""
    raise NotImplementedError


def dpo_batch_loss(policy, reference, batch, beta):
    """The DPO loss of a batch of pairs (x_chosen, y_chosen, x_rejected, y_rejected), each (B, T),
    for the model that trains (policy) against the frozen one (reference). -> 0-d."""
    raise NotImplementedError
