# Tiny Shakespeare, character by character (nanoGPT's shakespeare_char), with the text
# preset's model and schedule (config/text.py). From the repository root:
#   python data/shakespeare_char.py                      # fetches the text, once
#   python -m train config/train_shakespeare_char.py
#   python -m train.sample --out_dir out-shakespeare-char --start "ROMEO:"
# A setting given here counts as a flag given: flags after the file override it.

data = "data/shakespeare_char/input.txt"
out_dir = "out-shakespeare-char"
