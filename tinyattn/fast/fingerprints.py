"""The fingerprint of each teaching file that a fast path depends on, as the library ships it.

Written by ``python -m tinyattn.fast --write``: see checked.py.
"""
FINGERPRINTS = {
    'autograd.py': '8a54ee46f1d3ae6b',
    'backend/__init__.py': '0431beb2ddb159bb',
    'models/gpt.py': '4f05a299089dec60',
    'nn/attention.py': '4547cf3039339267',
    'nn/flash.py': '6611c819ffe58881',
    'nn/functional.py': 'c49c390e4c4bc7fe',
    'nn/modules.py': '2579204d81a63247',
    'ops.py': '732d45784c623c96',
    'optim/__init__.py': '3ff4f2b0641ef7f4',
    'tensor.py': '2ac7cf6b8fc6ea02',
}
