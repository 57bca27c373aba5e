"""Reference solution: the DPO loss (exercise 20 of EXERCISES.md)."""
import tinyattn as ta
import tinyattn.nn.functional as F


def sequence_logprobs(model, x, y):
    logits, _ = model(x)                                              # (B, T, V)
    return F.token_logprobs(logits, y, ignore_index=-1).sum(-1)       # (B,): the answer's tokens only


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)    # (B,)
    return -F.logsigmoid(beta * margin).mean()


def dpo_batch_loss(policy, reference, batch, beta):
    x_chosen, y_chosen, x_rejected, y_rejected = batch
    with ta.no_grad():                                                # the reference never trains
        ref_chosen = sequence_logprobs(reference, x_chosen, y_chosen)
        ref_rejected = sequence_logprobs(reference, x_rejected, y_rejected)
    return dpo_loss(sequence_logprobs(policy, x_chosen, y_chosen), sequence_logprobs(policy, x_rejected, y_rejected),
                    ref_chosen, ref_rejected, beta)
