# The text preset: python -m train --data FILE trains a character-level model on any text
# file with these settings, nanoGPT's CPU "baby" Shakespeare config. Copy this file, change
# what you like, and run python -m train my_config.py --data FILE; flags after the file
# override it.

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64

batch_size = 12
max_iters = 2000
learning_rate = 1e-3
min_lr = 1e-4            # learning_rate / 10, as nanoGPT has it
warmup_iters = 100
lr_decay_iters = 2000    # max_iters, as nanoGPT has it

eval_interval = 250
eval_iters = 20
out_dir = "out"
