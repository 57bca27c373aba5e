"""Your solutions to EXERCISES.md: rmsnorm.py, rope.py, gqa.py, swiglu.py."""
