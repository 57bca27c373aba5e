"""Weights laid out for the products they go into, while ta.inference_mode() holds them still.

A Linear layer computes x @ W^T with W stored (out, in), as in PyTorch. BLAS
takes the transposed W as it is, but some BLAS builds run that product
several times slower than the same product with W^T stored contiguous when x
has few rows, as when a model decodes a token or two at a time (OpenBLAS 0.3
on AVX-512, 8 rows: about 4x; docs/benchmarks.md). Copying W^T for every
call would cost more than it saves; inside ``ta.inference_mode()`` the
weights do not change, so the copy is made once per block and kept.

It is made for every product of at most ``MAX_ROWS`` rows, on every machine,
up to ``BUDGET_BYTES`` of copies in all (then the view). Not timed: BLAS sums
in another order with the copy than with the view, so a choice by a
measurement would give other numbers from one run to the next.
"""
import threading

import numpy as np

from ..autograd import inference_block

BUDGET_BYTES = 64 << 20          # the most that copies of weights may take
MAX_ROWS = 256                   # more rows than this: the product is long enough that the layout hardly matters

_lock = threading.Lock()
_block = None                    # the inference_mode block the copies belong to
_copies = {}                     # id(weight) -> (weight, W^T contiguous)
_chosen = {}                     # (id(weight), rows) -> (weight, what transposed gives)
_kept_bytes = 0


def transposed(weight, rows):
    """W^T for ``rows`` rows of x times it: a contiguous copy kept for this inference_mode block
    (up to MAX_ROWS rows, within the budget), else the transposed view. ``weight`` (out, in) numpy."""
    global _block, _kept_bytes
    block = inference_block()
    if block is None or rows > MAX_ROWS or type(weight) is not np.ndarray:
        return weight.T
    key = (id(weight), rows)
    chosen = _chosen.get(key)
    if chosen is not None and chosen[0] is weight and block is _block:   # (the usual case, without the lock)
        return chosen[1]
    with _lock:
        if block is not _block:                              # a new block: the weights may have changed since
            _block, _kept_bytes = block, 0
            _copies.clear()
            _chosen.clear()
        view = weight.T
        kept = _copies.get(id(weight))
        if kept is not None and kept[0] is weight:
            result = kept[1]
        elif _kept_bytes + weight.nbytes <= BUDGET_BYTES:
            result = np.ascontiguousarray(view)
            _copies[id(weight)] = (weight, result)           # (the weight kept too, so its id stays its own)
            _kept_bytes += weight.nbytes
        else:
            result = view
        _chosen[key] = (weight, result)
        return result

