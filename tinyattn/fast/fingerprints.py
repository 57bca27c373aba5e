"""The fingerprint of each teaching file that a fast path depends on, as the library ships it.

Written by ``python -m tinyattn.fast --write``: see checked.py.
"""
FINGERPRINTS = {
    'autograd.py': 'd7a11a001b4e3244',
    'backend/__init__.py': '813f4155ddde2eea',
    'models/gpt.py': '4f05a299089dec60',
    'nn/attention.py': '4547cf3039339267',
    'nn/flash.py': '6611c819ffe58881',
    'nn/functional.py': '270096806e3495e0',
    'nn/modules.py': 'f3a91bdf2bd87fa5',
    'ops.py': 'c9f99eb802c7f82c',
    'optim/__init__.py': '8d59998ce005d1f9',
    'tensor.py': '72d5a0c498a3c2c9',
}
