"""dloss: exact, fused distributed losses for PyTorch."""

from .errors import Error
