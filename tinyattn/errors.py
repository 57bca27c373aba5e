"""The errors tinyattn raises where PyTorch raises its catch-all ``RuntimeError``.

Python names the kind of mistake (``ValueError`` for a bad shape or value,
``TypeError`` for a bad dtype, ``IndexError`` for an index out of range);
PyTorch raises ``RuntimeError`` for most of them. Each class below is both, so
that code written for either catches it::

    try:
        a @ b
    except RuntimeError:        # PyTorch's habit; `except ValueError:` works too
        ...

A bad dim is an ``IndexError``, as PyTorch's "Dimension out of range" is.
"""


class TensorError(ValueError, RuntimeError):
    """A shape or a value that an op cannot take: shapes that do not broadcast, a matmul
    whose inner sizes differ, a view that the strides do not allow, ..."""


class DtypeError(TypeError, RuntimeError):
    """A dtype that an op does not take (a bool tensor to subtract, an integer tensor to
    average). PyTorch raises ``RuntimeError``, or its subclass ``NotImplementedError`` where
    it has no kernel for the dtype; this is not a NotImplementedError, which in Python means
    "not written yet" (as the exercises' stubs raise it): the dtype is refused on purpose."""


class IndexRangeError(IndexError, RuntimeError):
    """An index tensor that points past the end of a dim (``gather``), which PyTorch
    reports as a RuntimeError."""
