"""Module, Parameter and the layers built on them."""
import math
from collections import OrderedDict

from .. import autograd as _engine
from ..tensor import Tensor, ones, rand, randn, tensor, zeros
from ..backend import dtype_of_host, get_backend, is_device
from ..errors import TensorError
from . import functional as F


def _dtype_or_none(target):
    """``target`` as a dtype, or None when it names none (then it may be a device)."""
    try:
        return dtype_of_host(target)
    except TypeError:
        return None


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable (requires_grad by default)."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


def _note_call(module, args, out):
    """Note on the output's op which module made it, from which inputs, so that
    ``ta.viz.graph(t, depth=1)`` can draw a module as one box. One tuple per
    call; with no graph (no_grad, eval) there is nothing to note."""
    if type(out) is tuple:
        for t in out:
            _note_call(module, args, t)
        return
    ctx = getattr(out, "grad_fn", None)
    if ctx is None or any(out is a for a in args):   # a module that hands its input back (Dropout(0)) made
        return                                       # nothing; noting it would tie out to itself, a cycle
    ctx.module_call = (module, args, ctx.__dict__.get("module_call"))   # (its inputs; a call noted before)


changes = 0     # how many times an attribute of any module was set: what ta.compile decided about a
                # model's layers is decided again after a change (a layer replaced, keep_weights set)


class Module:
    """Base class of layers. Assign Parameters and Modules as attributes; they
    are registered in order, so ``parameters()`` always comes in the same order."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        global changes
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() first")
        changes += 1
        for table in (self._parameters, self._modules, self._buffers):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, tensor):
        """A tensor that belongs to the module's state but is not trained."""
        setattr(self, name, tensor)
        self._buffers[name] = tensor

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        if _engine.hooks is not None:             # ta.detect_anomaly checks the parameters first
            _engine.hooks.module_called(self)
        layers = _engine.compiled.layers                      # in a compiled model's call: its fast layers
        fast = layers.get(self) if layers else None
        out = self.forward(*args, **kwargs) if fast is None else fast(self, args, kwargs)
        _note_call(self, args, out)
        return out

    # --- walking the tree ---
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (m for _, m in self.named_modules())

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix=""):
        """(name, parameter) pairs; a parameter shared by two modules comes once."""
        seen = set()
        for mod_name, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        for mod_name, module in self.named_modules():
            for name, b in module._buffers.items():
                yield (f"{mod_name}.{name}" if mod_name else name), b

    # --- state ---
    def state_dict(self):
        """Name -> Tensor for every parameter and buffer, in registration order."""
        state = OrderedDict(self.named_parameters())
        state.update(self.named_buffers())
        return state

    def load_state_dict(self, state, strict=True):
        """Copy values in. Missing, unexpected or wrongly shaped keys are an error
        that lists them (with strict=False only shapes are checked)."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        wrong = [f"size mismatch for {k}: {tuple(state[k].shape)} in the state dict, {own[k].shape} in the model"
                 for k in own if k in state and tuple(state[k].shape) != own[k].shape]
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys {unexpected}")
        if wrong:
            problems.append("; ".join(wrong))
        if problems:                                    # (PyTorch: a RuntimeError; this is one, and a ValueError)
            raise TensorError(f"load_state_dict for {type(self).__name__}: " + ", ".join(problems))
        for name, t in own.items():
            if name in state:
                value = state[name]
                value = value.numpy() if isinstance(value, Tensor) else value
                t.data = tensor(value, dtype=t.dtype, device=t.device).data
        return missing, unexpected

    # --- modes, devices, gradients ---
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def to(self, target):
        """Move every parameter and buffer to a device (``model.to("cuda")``), or cast the float
        ones to a float dtype (``model.to(ta.float64)``; integer and bool buffers keep theirs, as
        in PyTorch), in place. Gradients are dropped: they belonged to the old arrays."""
        dtype = None if isinstance(target, str) and is_device(target) else _dtype_or_none(target)
        if dtype is None:
            get_backend(target)                 # an unknown device name is an error that says so
        elif dtype.kind != "f":
            raise ValueError(f"Module.to: parameters are cast to a float dtype (float32, float64), not {dtype}")
        for _, t in list(self.named_parameters()) + list(self.named_buffers()):
            if dtype is None and t.device != target:
                t.set_(t.to(target))
            elif dtype is not None and t.dtype.kind == "f" and t.dtype != dtype:
                t.set_(t.detach().to(dtype))
            else:
                continue
            t.grad = None
        return self

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def __repr__(self):
        return self._tree()

    def _tree(self, note=None):
        """The layers as a tree (what print shows). ``note(layer)``, if given, adds its text to each
        layer's line (ta.compile's print says so how each layer runs); a layer with a __repr__ of
        its own shows that."""
        lines = [f"  ({name}): " + (m._tree(note) if type(m).__repr__ is Module.__repr__ else repr(m)).replace(
            "\n", "\n  ") for name, m in self._modules.items()]
        extra = ", ".join(text for text in (self.extra_repr(), note and note(self)) if text)
        if not lines:
            return f"{type(self).__name__}({extra})"
        return f"{type(self).__name__}({extra}\n" + "\n".join(lines) + "\n)"

    def extra_repr(self):
        return ""


# ---------------------------------------------------------------- layers
def expect_shape(module, x, pattern, words):
    """Check a module's input: a Tensor whose shape fits ``pattern`` (ints must match, None is
    any size, a leading ... any number of dims). Else an error such as
    ``MultiHeadAttention expects (B, T, C) with C = 8, got (5, 8)``."""
    if pattern[0] is ... and len(pattern) == 2 and isinstance(x, Tensor) and x.shape[-1:] == pattern[1:]:
        return                                           # (..., n): the common case, checked at once
    name = type(module).__name__
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a Tensor {words}, got {type(x).__name__}")
    dims = pattern[1:] if pattern[0] is ... else pattern
    shape = x.shape[len(x.shape) - len(dims):] if pattern[0] is ... else x.shape
    if len(shape) != len(dims) or not all([d is None or d == n for d, n in zip(dims, shape)]):
        sizes = ", ".join(f"{w.strip('. ')} = {d}" for w, d in zip(words.strip("()").split(", ")[-len(dims):], dims)
                          if d is not None)
        raise TensorError(f"{name} expects {words}{' with ' + sizes if sizes else ''}, got {x.shape}")


class Linear(Module):
    """y = x W^T + b, W (out_features, in_features); init U(-1/sqrt(in), 1/sqrt(in)) as in PyTorch."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(rand(out_features, in_features) * (2 * bound) - bound)
        self.bias = Parameter(rand(out_features) * (2 * bound) - bound) if bias else None

    def forward(self, x):                       # (..., in) -> (..., out)
        expect_shape(self, x, (..., self.in_features), "(..., in_features)")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A (num_embeddings, embedding_dim) table looked up by integer ids; init N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(randn(num_embeddings, embedding_dim))

    def forward(self, idx):                     # (...) int -> (..., C)
        return F.embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, bias=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(ones(*self.normalized_shape))
        self.bias = Parameter(zeros(*self.normalized_shape)) if bias else None

    def forward(self, x):                       # (..., C) -> (..., C)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dims (F.rms_norm): LayerNorm without
    the mean and the bias. ``eps=None``: the machine epsilon of the input's dtype."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(ones(*self.normalized_shape)) if elementwise_affine else None

    def forward(self, x):                       # (..., C) -> (..., C)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Sequential(Module):
    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)
