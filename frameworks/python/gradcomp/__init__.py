"""gradcomp: collective communication with gradient compression for distributed training.

Subpackages: ``gradcomp.codec`` (inspect the codecs on your own arrays); the NumPy and
PyTorch adapters build on the same native core.
"""
from gradcomp._core import GradcompError

__all__ = ["GradcompError"]
__version__ = "0.1.0"
