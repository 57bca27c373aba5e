"""Who hears when the library's code is replaced while a program runs.

The fast layer (``tinyattn/fast``) runs faster code in place of some of the
library's functions and methods, but only while they are the code its kernels
were checked against. A learner may replace one at run time:

    gpt.Block.forward = my_forward          # a method of a class
    ops.stable_exp = my_stable_exp          # a function of a module

``Watched`` is the metaclass of ``Function``, ``Module`` and ``Optimizer``, and
``WatchedModule`` the type the fast layer gives the library's own modules: each
tells the listeners which name of which class or module was set or deleted, at
the moment it happens. Nothing is checked when the code is called.
"""
import types

listeners = []          # functions (owner, name) -> None, called after each change


def changed(owner, name):
    for listen in listeners:
        listen(owner, name)


class _Reports:
    """__setattr__ and __delattr__ that report the change, once done."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        changed(self, name)

    def __delattr__(self, name):
        super().__delattr__(name)
        changed(self, name)


class Watched(_Reports, type):
    """A class whose attributes, set or deleted after it was made, are reported to the listeners."""


class WatchedModule(_Reports, types.ModuleType):
    """A module whose attributes, set or deleted from outside (``ops.softmax = f``), are reported.
    (The module's own code assigning its globals does not go through here.)"""
