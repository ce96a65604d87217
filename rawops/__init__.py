"""rawops: prebuilt CUDA kernels for CuPy, PyTorch and any `__cuda_array_interface__` /
DLPack producer, zero-copy, with no build or import dependency on torch.

    import cupy, rawops
    y = rawops.gelu(cupy.random.randn(1 << 20, dtype=cupy.float32))

torch users: `rawops.torch_adapter` (autograd, torch.compile, nn.Modules).
"""
from . import config
from ._launch import NoDeviceError, as_array, release_captured_scratch
from .elementwise import (
    add,
    bias_gelu,
    bias_gelu_backward,
    column_sum,
    gelu,
    gelu_backward,
    relu,
    relu_backward,
    relu_scale,
    relu_scale_add,
    relu_scale_add_backward,
    relu_scale_backward,
)
from .glu import (
    geglu,
    geglu_backward,
    geglu_fused,
    geglu_fused_backward,
    swiglu,
    swiglu_backward,
    swiglu_fused,
    swiglu_fused_backward,
)
from .gemm import linear_gelu, linear_gelu_backward, matmul
from .image import normalize_volume, rgb_to_gray, to_tensor_normalize
from .losses import cross_entropy, cross_entropy_backward, fused_linear_cross_entropy
from .mlp import fused_mlp, fused_mlp_backward, fused_mlp_forward
from .norm import (
    add_rms_norm,
    add_rms_norm_backward,
    add_rms_norm_forward,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)
from .moe import (moe_grouped_mm, moe_grouped_mm_backward_weight, moe_permute, moe_permute_backward, moe_route,
                  moe_route_backward, moe_unpermute, moe_unpermute_backward)
from .rotary import rope, rope_backward
from .softmaxes import log_softmax, log_softmax_backward, softmax, softmax_backward
from .sorting import argsort, sort, topk

__version__ = "0.1.0"

__all__ = [
    "NoDeviceError",
    "add",
    "add_rms_norm",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "argsort",
    "as_array",
    "bias_gelu",
    "bias_gelu_backward",
    "column_sum",
    "config",
    "cross_entropy",
    "cross_entropy_backward",
    "fused_linear_cross_entropy",
    "fused_mlp",
    "fused_mlp_backward",
    "fused_mlp_forward",
    "geglu",
    "geglu_backward",
    "geglu_fused",
    "geglu_fused_backward",
    "gelu",
    "gelu_backward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "linear_gelu",
    "linear_gelu_backward",
    "log_softmax",
    "log_softmax_backward",
    "matmul",
    "moe_grouped_mm",
    "moe_grouped_mm_backward_weight",
    "moe_permute",
    "moe_permute_backward",
    "moe_route",
    "moe_route_backward",
    "moe_unpermute",
    "moe_unpermute_backward",
    "normalize_volume",
    "relu",
    "relu_backward",
    "relu_scale",
    "relu_scale_add",
    "relu_scale_add_backward",
    "relu_scale_backward",
    "release_captured_scratch",
    "rgb_to_gray",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
    "rope",
    "rope_backward",
    "softmax",
    "softmax_backward",
    "sort",
    "swiglu",
    "swiglu_backward",
    "swiglu_fused",
    "swiglu_fused_backward",
    "to_tensor_normalize",
    "topk",
]
