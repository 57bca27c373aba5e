"""The fingerprint of each teaching file that a fast path depends on, as the library ships it.

Written by ``python -m tinyattn.fast --write``: see checked.py.
"""
FINGERPRINTS = {
    'autograd.py': '8bc0faf760798c64',
    'backend/__init__.py': '7a68319e99a113c8',
    'models/gpt.py': '3ac44bd100ddcb02',
    'nn/attention.py': '3d886611fefe5b8c',
    'nn/flash.py': '6611c819ffe58881',
    'nn/functional.py': 'f1e3cfcf0a00b43a',
    'nn/modules.py': 'b12483edeaed59fe',
    'ops.py': '62f9afc64d070240',
    'optim/__init__.py': 'f9529a05159a362b',
    'tensor.py': '2ac7cf6b8fc6ea02',
}
