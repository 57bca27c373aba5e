"""The machinery behind the exercises: each exercise's checks (a module each), what they share
(common.py), the learner's progress (progress.py, ``python -m exercises``) and the swap of
passing pieces into the library (swap.py, ``python -m train --use_exercises``)."""
