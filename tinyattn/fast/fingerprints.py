"""The fingerprint of each teaching file that a fast path depends on, as the library ships it.

Written by ``python -m tinyattn.fast --write``: see checked.py.
"""
FINGERPRINTS = {
    'autograd.py': '4afb534645c70a62',
    'backend/__init__.py': '265b87fa94606bd9',
    'models/gpt.py': 'c3508663c50113b0',
    'nn/attention.py': 'fb60e636872b7ec6',
    'nn/flash.py': '3b4a7eb657f440ce',
    'nn/functional.py': '5b601684ab99bf79',
    'nn/modules.py': '2845028d993947d2',
    'ops.py': 'fcddccd548c0b701',
    'optim/__init__.py': '57f1c142db7401b6',
    'tensor.py': '591ac0b3d6569cbb',
}
