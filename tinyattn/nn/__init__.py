"""Neural-network layers."""
from . import functional  # noqa: F401
