"""rawops for PyTorch: functions with torch.nn.functional's signatures, autograd, torch.library
custom ops (torch.compile) and nn.Modules, one module per kernel family.

The only part of rawops that imports torch. It launches the same kernels as the CuPy API,
straight from tensors' raw pointers on torch's current stream of the tensor's device: no DLPack
round trip, nothing copied for the layouts the kernels take (each family's docstring says what
else costs a copy). Three paths, cheapest first:
  no grad needed, not compiling   launch directly (the elementwise ops, linear_gelu, matmul and
                                  the source network's FusedMLP are C-level entries);
  grad needed, eager              an autograd.Function around the same launches;
  inside torch.compile            the torch.library custom ops `rawops::<op>`, with fake (meta)
                                  kernels and registered autograd, so fullgraph works.
Everything is capturable in torch.cuda.graph: launches only, no allocation outside torch.
"""
from ._common import install_substitutes
from ._losses_linear import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy
from .elementwise import GELU, BiasGELU, ReLU, ReLUScale, add, bias_gelu, gelu, relu, relu_scale, relu_scale_add
from .glu import SwiGLUMLP, geglu, geglu_fused, swiglu, swiglu_fused
from .gemm import LinearGELU, linear_gelu, matmul
from .image import normalize_volume, rgb_to_gray, to_tensor_normalize
from .llama import apply_rawops_to_llama
from .losses import CrossEntropyLoss, cross_entropy
from .mlp import FusedMLP, fused_mlp
from .moe import MoE, moe_grouped_mm, moe_mlp, moe_permute, moe_route, moe_unpermute
from .norm import AddRMSNorm, LayerNorm, RMSNorm, add_rms_norm, layer_norm, rms_norm
from .rotary import apply_rotary_pos_emb, rope
from .softmaxes import LogSoftmax, Softmax, log_softmax, softmax
from .sorting import argsort, sort, topk

install_substitutes()  # last: every family has registered its C-level entries

__all__ = [
    "AddRMSNorm", "BiasGELU", "CrossEntropyLoss", "FusedLinearCrossEntropyLoss", "FusedMLP", "GELU", "LayerNorm",
    "LinearGELU", "LogSoftmax", "MoE", "RMSNorm", "ReLU", "ReLUScale", "Softmax", "SwiGLUMLP", "add", "add_rms_norm",
    "apply_rawops_to_llama", "apply_rotary_pos_emb", "argsort", "bias_gelu", "cross_entropy",
    "fused_linear_cross_entropy", "fused_mlp", "geglu", "geglu_fused", "gelu", "layer_norm", "linear_gelu",
    "log_softmax", "matmul", "moe_grouped_mm", "moe_mlp", "moe_permute", "moe_route", "moe_unpermute",
    "normalize_volume", "relu", "relu_scale", "relu_scale_add", "rgb_to_gray", "rms_norm", "rope", "softmax",
    "sort", "swiglu", "swiglu_fused", "to_tensor_normalize", "topk",
]
