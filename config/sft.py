# Supervised fine-tuning: python -m train config/sft.py --init_from BASE --data CONVERSATIONS
# (a folder of python -m data.prepare CONVS.jsonl --tokenizer_from BASE). The model's shape comes
# from BASE; these are the training settings. Whole conversations make a row each, so a batch
# of 32 rows of about 40 tokens is about as many tokens as the text preset's 12 windows of 64.

batch_size = 32
max_iters = 1500
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
lr_decay_iters = 1500

eval_interval = 250
eval_iters = 20

# To keep the base's knowledge of its text, mix some of it into each batch (docs/sft.md,
# "Forgetting"): --mix_data input.txt --mix_fraction 0.1 --batch_size 36
