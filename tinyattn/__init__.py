"""tinyattn: a small tensor library with reverse-mode autodiff, attention and a GPT."""
from .errors import TensorError, DtypeError, IndexRangeError
from .backend import float16, float32, float64, int32, int64, bool_, cuda_is_available
from .autograd import Function, no_grad, enable_grad, inference_mode, set_grad_enabled, is_grad_enabled, grad
from .tensor import (Tensor, tensor, zeros, ones, empty, full, arange, randn, rand, multinomial,
                     zeros_like, ones_like, full_like, randn_like, rand_like, manual_seed)
from .ops import matmul, dot, cat, stack, split, where, sum_to, gather, topk

__version__ = "0.1.0"


def exp(x): return x.exp()
def log(x): return x.log()
def sqrt(x): return x.sqrt()
def tanh(x): return x.tanh()
def sigmoid(x): return x.sigmoid()
def relu(x): return x.relu()
def tril(x, diagonal=0): return x.tril(diagonal)
def triu(x, diagonal=0): return x.triu(diagonal)
def clamp(x, min=None, max=None): return x.clamp(min, max)
def clip(x, min=None, max=None): return x.clamp(min, max)
def masked_fill(x, mask, value): return x.masked_fill(mask, value)
def chunk(x, chunks, dim=0): return x.chunk(chunks, dim)


from .gradcheck import gradcheck, gradgradcheck, GradcheckError  # noqa: E402
from . import nn, optim, models  # noqa: E402,F401
from .anomaly import detect_anomaly  # noqa: E402
from .profiler import profile  # noqa: E402
from . import viz  # noqa: E402,F401
from . import distributed  # noqa: E402,F401
from .safetensors import save_safetensors, load_safetensors, read_safetensors, SafetensorsError, save, load  # noqa: E402
from .fast import get_num_threads, set_num_threads, set_flush_denormal  # noqa: E402  (the fast layer, last)
from .fast.compiled import compile  # noqa: E402,A001  (ta.compile: above the models)
from .fast import checked as _checked  # noqa: E402
_checked.note()         # the library's code as imported: what each compiled call compares it with
