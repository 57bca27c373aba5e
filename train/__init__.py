"""The training program: python -m train."""
