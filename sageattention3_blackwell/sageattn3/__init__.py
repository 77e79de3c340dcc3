"""sageattn3: FP4 (NVFP4 microscaling) attention for NVIDIA Blackwell GPUs."""
from .core import sageattn3_blackwell

__version__ = "1.0.0"
__all__ = ["sageattn3_blackwell", "__version__"]
