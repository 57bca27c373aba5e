# Tiny Shakespeare, character by character, with the modern block: Llama's choices in place of
# GPT-2's, on the text preset's model size and schedule (config/text.py: 4 layers, 4 heads,
# 128 channels, block 64, 2000 iterations). From the repository root:
#   python data/shakespeare_char.py                      # fetches the text, once
#   python -m train config/llama_shakespeare.py
#   python -m train.sample --out_dir out-llama-shakespeare --start "ROMEO:"
#   python -m train.export_hf --out_dir out-llama-shakespeare --to llama-shakespeare   # a LlamaForCausalLM
# A setting given here counts as a flag given: flags after the file override it (--n_kv_head 4
# for plain multi-head attention, --qk_norm true to add QK-norm, which Llama cannot express).

data = "data/shakespeare_char/input.txt"
out_dir = "out-llama-shakespeare"

pos = "rope"              # rotary position embeddings, no position table
norm = "rmsnorm"
mlp = "swiglu"            # 8 n_embd / 3 = 341 wide: about the weights of GELU's 4 n_embd
n_kv_head = 2             # grouped-query attention: 2 key/value heads for the 4 query heads
bias = False
tie_embeddings = False
