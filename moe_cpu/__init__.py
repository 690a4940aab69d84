"""moe_cpu: CPU Mixture-of-Experts kernels for NumPy (INT4 W4A8 / W4A16, INT8 W8A8 / W8A16, FP8 W8A16, BF16)."""
from .api import *  # noqa: F401,F403
from .api import __all__ as _api_all
from .vllm_compat import *  # noqa: F401,F403
from .vllm_compat import __all__ as _compat_all
from .layer import MoELayer
from .stream import Capture, PendingExperts, Stream

__version__ = "0.1.0"
__all__ = list(_api_all) + list(_compat_all)
__all__ += ["MoELayer", "Stream", "PendingExperts", "Capture"]
