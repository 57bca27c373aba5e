"""Neural-network layers: Module, Parameter, Linear, attention, ..."""
from . import functional  # noqa: F401
from . import utils  # noqa: F401
from .modules import (Module, Parameter, Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, ReLU,
                      Sequential, ModuleList)
from .attention import MultiHeadAttention, KVCache

__all__ = ["Module", "Parameter", "Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "ReLU",
           "Sequential", "ModuleList", "MultiHeadAttention", "KVCache", "functional", "utils", "attention"]
