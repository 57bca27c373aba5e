"""Experiments that check the attention lesson's claims, one script per claim.

    python -m train.experiments.scaling    why scores are divided by sqrt(d_k)
    python -m train.experiments.causal     the causal mask: the past never sees the future
    python -m train.experiments.heads      different heads learn different patterns
    python -m train.experiments.quadratic  attention costs O(N^2) time and memory
    python -m train.experiments.sinks      attention piles up on the first token and delimiters
    python -m train.experiments.seeds      the "it" result over many seeds, not one lucky run

Each takes --out_dir DIR (a checkpoint folder, or where plots go) and --tiny
(a small, fast run), prints its result as a sentence and then one JSON line,
and has a run(...) -> dict function that the tests call.
"""
