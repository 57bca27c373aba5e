"""Your solutions to EXERCISES.md.

Part one (extend the model): write rmsnorm.py, rope.py, gqa.py, swiglu.py here.
Part two (build the core): fill in the starter files sum_to.py ... kv_cache.py.
Part three (fine-tune): write lora.py here; and the tokenizer: fill in bpe.py.
Part four (the assistant): fill in loss_mask.py, dpo.py and group_advantages.py.
``python -m exercises`` shows your progress; ``python -m train --use_exercises``
trains the GPT with every passing piece of yours swapped in. The checks are in
checking/, one module per exercise.
"""
