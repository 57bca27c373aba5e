# The DPO preset: python -m train --stage dpo --init_from SFT_RUN --data PAIRS takes these on top
# of the text preset (the model's own shape comes from --init_from). A small learning rate and a
# short run: DPO nudges a model that already answers; it does not teach it the task.

batch_size = 16          # pairs: each step reads 16 chosen and 16 rejected answers
max_iters = 300
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 20
lr_decay_iters = 300

eval_interval = 50
eval_iters = 10
sample_tokens = 0

stage = "dpo"           # so that python -m train config/dpo.py --init_from SFT --data PAIRS runs DPO
dpo_beta = 0.1
dpo_nll = 0.0
