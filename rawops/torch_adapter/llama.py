"""rawops swapped into a transformers Llama model, in place: apply_rawops_to_llama.

apply_rawops_to_llama(model, *, rms_norm=True, swiglu=True, rope=True, fused_linear_cross_entropy=True)
takes a transformers `LlamaForCausalLM` or `LlamaModel` (transformers 5.x) and returns it, changed
in place. Every change is to this model's own modules; nothing in transformers is patched (a model
built afterwards is stock; Liger's apply_liger_kernel_to_llama, by contrast, replaces
modeling_llama's apply_rotary_pos_emb, LlamaRMSNorm and LlamaMLP for every model).

  rms_norm   every LlamaRMSNorm becomes rawops' RMSNorm holding the same `weight` Parameter, eps
             the module's variance_epsilon. Float32 math, as HF's (which also rounds the
             normalised row to the input's dtype before the weight multiply: the two can differ
             in the last bit); weight and input must have one dtype (a model in one dtype, as
             from .to(torch.bfloat16)), where HF would promote.
  swiglu     every LlamaMLP becomes rawops' SwiGLUMLP holding the same gate_proj, up_proj and
             down_proj Linear modules: down_proj(swiglu(gate_proj(x), up_proj(x))). A model whose
             act is not silu (config.hidden_act) is refused (ValueError): set swiglu=False.
  rope       each LlamaAttention's forward is HF's own function (its code object) run with
             apply_rotary_pos_emb bound to rawops' rope, per instance: q and k are rotated in
             place, the layout HF's `unsqueeze_dim` names (see _apply_rotary_pos_emb_in_place).
  fused_linear_cross_entropy
             a LlamaForCausalLM's forward (this instance's) computes the loss with rawops'
             fused_linear_cross_entropy on the last hidden states and lm_head's weight (and bias),
             the logits never materialised, logits=None in the output, when labels are given
             and the model is training (or skip_logits=True is passed), as Liger's lce_forward
             decides; otherwise HF's forward runs unchanged. HF's loss
             semantics: labels shifted left by one (the last position ignored), ignore_index
             -100 (or the ignore_index keyword), mean over the tokens not ignored, or the sum
             divided by num_items_in_batch where the Trainer passes it (shift_labels, passed with
             labels, replace the shifted labels, as in HF); a float32 loss (its value
             as precise as fused_linear_cross_entropy's loss in the model's dtype). The flag may
             be a dict of that function's options instead of True: chunk_rows, accum_dtype.
             chunk_rows defaults here to Liger-Kernel's chunk rule (loss_chunk_rows: the
             next power of two of ceil(tokens / ceil(V / H))), so the loss's peak memory is
             Liger's; {"chunk_rows": 1024} (the function's own default at V = 128256, bf16) trades
             (1024 - 256) x V x 2 bytes more peak for fewer, cheaper grad_weight accumulations
             (bench_llama, H100: 47.9 against 60.6 ms a step, +0.18 GiB). A LlamaModel has no
             loss: the flag does nothing there.

State dict: keys, tensors and Parameters are unchanged (the same Parameter objects), so an optimizer
built before the swap keeps working and a checkpoint saved after it loads into a stock model.
Forward hooks registered on the replaced RMSNorm / MLP modules are not carried over. Calling the
function again on a swapped model changes nothing more.

q / k layouts: transformers' LlamaAttention hands apply_rotary_pos_emb q and k as (B, H, S, D)
views of the projections' (B, S, H, D) outputs (`.view(B, S, H, D).transpose(1, 2)`) with cos / sin
(B, S, D) and unsqueeze_dim=1. rawops.rope's qk_layout="bhsd" reads q and k at their own strides, so
they are rotated where they lie, in the projections' memory, with no copy; the results keep HF's
strides (what the attention kernel would have received from HF's out-of-place formula). The
projections' outputs are not saved by autograd (a Linear saves its input), so rotating them in place
is safe; the rotation's backward rotates the incoming gradients back, in place. unsqueeze_dim=2
((B, S, H, D) q and k) maps to qk_layout="bshd".
"""
import functools
import types

import torch

from . import glu as _glu, norm as _norm, rotary as _rotary

# ------------------------------------------------------------------- the pieces swapped in
def _apply_rotary_pos_emb_in_place(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb (q*cos + rotate_half(q)*sin) on rawops' rope ("neox", HF's
    rotate_half), q and k rotated IN PLACE and returned: only for callers that do not read q and k
    again, as LlamaAttention.forward (rawops.torch_adapter.rotary.apply_rotary_pos_emb is the
    out-of-place drop-in). unsqueeze_dim 1: q, k (B, H, S, D); 2: (B, S, H, D); cos / sin (B, S, D)
    or (1, S, D), cast to q's dtype where they differ (a float32 table under autocast)."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 (q of shape (B, H, S, D)) or 2 ((B, S, H, D)), got {unsqueeze_dim}")
    if cos.dtype != q.dtype:
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return _rotary.rope(q, k, cos, sin, "neox", "bhsd" if unsqueeze_dim == 1 else "bshd")


def _with_rope(forward):
    """A copy of `forward` (HF's LlamaAttention.forward) whose global apply_rotary_pos_emb is
    rawops' in-place rope; everything else it reads from its module as before."""
    code = forward.__code__
    if "apply_rotary_pos_emb" not in code.co_names:
        raise RuntimeError(f"{forward.__qualname__} does not call apply_rotary_pos_emb in this transformers "
                           "version: pass rope=False")
    scope = dict(forward.__globals__)
    scope["apply_rotary_pos_emb"] = _apply_rotary_pos_emb_in_place
    copy = types.FunctionType(code, scope, forward.__name__, forward.__defaults__, forward.__closure__)
    copy.__kwdefaults__ = forward.__kwdefaults__
    return functools.update_wrapper(copy, forward)


def _rms_norm_of(module):
    """rawops' RMSNorm holding module's weight Parameter (a LlamaRMSNorm: weight, variance_epsilon)."""
    weight = module.weight
    new = _norm.RMSNorm(tuple(weight.shape), eps=float(module.variance_epsilon), elementwise_affine=False,
                        device="meta")
    new.elementwise_affine = True
    new.weight = weight
    return new.train(module.training)


def _silu(mlp):
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act is not None:
        return act in ("silu", "swish")
    return isinstance(mlp.act_fn, torch.nn.SiLU) or type(mlp.act_fn).__name__ == "SiLUActivation"


def _swiglu_mlp_of(mlp):
    """rawops' SwiGLUMLP holding mlp's three Linear modules (a LlamaMLP)."""
    new = _glu.SwiGLUMLP(mlp.hidden_size, mlp.intermediate_size, bias=mlp.gate_proj.bias is not None, device="meta")
    new.gate_proj, new.up_proj, new.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return new.train(mlp.training)


def _fused_loss():
    try:
        from ._losses_linear import fused_linear_cross_entropy
    except ImportError as error:
        raise ImportError("fused_linear_cross_entropy=True needs rawops.torch_adapter._losses_linear, which this "
                          "rawops lacks (or cannot import): pass fused_linear_cross_entropy=False") from error
    return fused_linear_cross_entropy


LOSS_OPTIONS = ("chunk_rows", "accum_dtype")


def _loss_options(flag):
    """The fused loss's keyword options of apply_rawops_to_llama's flag, checked: None for off
    (False, None), {} for True, the dict's options."""
    if flag is None or flag is False:
        return None
    if flag is True:
        return {}
    if not isinstance(flag, dict):
        raise TypeError(f"fused_linear_cross_entropy must be a bool or a dict of options {LOSS_OPTIONS}, got "
                        f"{type(flag).__name__}")
    unknown = sorted(set(flag) - set(LOSS_OPTIONS))
    if unknown:
        raise ValueError(f"fused_linear_cross_entropy: unknown options {unknown}; it takes {LOSS_OPTIONS}")
    return dict(flag)


def loss_chunk_rows(tokens, vocab, hidden):
    """Liger-Kernel's fused linear cross-entropy chunk (its chunk_size): the next power of two of
    ceil(tokens / ceil(vocab / hidden)), at most `tokens` (and at least 1): a chunk's logits take about
    as much memory as the hidden states, so the loss's peak is Liger's."""
    rows = -(-tokens // -(-vocab // hidden)) if tokens else 1
    return max(1, min(1 << (rows - 1).bit_length(), tokens))


def _causal_lm_loss(hidden_states, lm_head, labels, shift_labels=None, num_items_in_batch=None, ignore_index=-100,
                    options=None):
    """HF's ForCausalLMLoss on lm_head(hidden_states) without the logits: labels padded with
    ignore_index and shifted left by one (unless shift_labels is given), mean over the targets not
    ignored, or their sum / num_items_in_batch."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    target = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    options = dict(options or {})
    if options.get("chunk_rows") is None:
        options["chunk_rows"] = loss_chunk_rows(hidden.shape[0], lm_head.weight.shape[0], hidden.shape[-1])
    # float32, as HF's loss (computed on logits.float()): the division below and the value handed back
    loss = _fused_loss()(hidden, lm_head.weight, target, bias=lm_head.bias, ignore_index=ignore_index,
                         reduction=reduction, **options).float()
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, skip_logits=None,
                       **kwargs):
    """LlamaForCausalLM.forward with the loss of rawops' fused_linear_cross_entropy (bound per
    instance by apply_rawops_to_llama): the module docstring says when it runs."""
    shift_labels = kwargs.get("shift_labels")
    has_labels = labels is not None or shift_labels is not None
    if skip_logits and not has_labels:
        raise ValueError("skip_logits=True needs labels (or shift_labels): without them there is no loss to compute")
    if not (has_labels and (self.training if skip_logits is None else skip_logits)):
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                  use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    hidden_states = outputs.last_hidden_state
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):  # HF's slice; 0 keeps every position
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = hidden_states[:, keep, :]
    loss = _causal_lm_loss(hidden_states, self.lm_head, labels, shift_labels, kwargs.get("num_items_in_batch"),
                           kwargs.get("ignore_index", -100), self._rawops_loss_options)
    output = CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                    hidden_states=outputs.hidden_states, attentions=outputs.attentions)
    return output if return_dict else output.to_tuple()


# ------------------------------------------------------------------- the swap
def _modeling_llama():
    try:
        from transformers.models.llama import modeling_llama
    except ImportError as error:
        raise ImportError("apply_rawops_to_llama needs transformers (a Llama model comes from it)") from error
    return modeling_llama


def _replace(model, path, new):
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, name, new)


def apply_rawops_to_llama(model, *, rms_norm=True, swiglu=True, rope=True, fused_linear_cross_entropy=True):
    """Swap rawops into a transformers LlamaForCausalLM / LlamaModel in place and return it: RMSNorm,
    the SwiGLU MLP, rope (per attention instance) and the causal-LM loss (fused linear
    cross-entropy, no logits), each on its flag. The module docstring gives each swap's contract.

    Raises TypeError when model is not a Llama model, ValueError when swiglu=True and its act is
    not silu, TypeError / ValueError for a fused_linear_cross_entropy that is neither a bool nor
    a dict of LOSS_OPTIONS, ImportError when fused_linear_cross_entropy=True and rawops' fused linear
    cross-entropy is missing; all before anything is changed."""
    ml = _modeling_llama()
    if not isinstance(model, (ml.LlamaForCausalLM, ml.LlamaModel)):
        raise TypeError(f"model must be a transformers LlamaForCausalLM or LlamaModel, got {type(model).__name__}")
    norms = [(p, m) for p, m in model.named_modules() if isinstance(m, ml.LlamaRMSNorm)] if rms_norm else []
    mlps = [(p, m) for p, m in model.named_modules() if isinstance(m, ml.LlamaMLP)] if swiglu else []
    for path, mlp in mlps:
        if not _silu(mlp):
            act = getattr(getattr(mlp, "config", None), "hidden_act", type(mlp.act_fn).__name__)
            raise ValueError(f"{path or 'model'}: its activation is {act!r}; rawops' SwiGLUMLP computes silu(gate) * "
                             "up: pass swiglu=False")
    attentions = [m for _, m in model.named_modules() if isinstance(m, ml.LlamaAttention)] if rope else []
    forwards = {cls: _with_rope(cls.forward) for cls in {type(a) for a in attentions}}
    options = _loss_options(fused_linear_cross_entropy)
    causal_lm = options is not None and isinstance(model, ml.LlamaForCausalLM)
    if causal_lm:
        _fused_loss()
        if not isinstance(model.lm_head, torch.nn.Linear):
            raise TypeError(f"model.lm_head is a {type(model.lm_head).__name__}; the fused loss reads a Linear's "
                            "weight and bias: pass fused_linear_cross_entropy=False")
    # checks done: change the model
    for path, module in norms:
        _replace(model, path, _rms_norm_of(module))
    for path, mlp in mlps:
        _replace(model, path, _swiglu_mlp_of(mlp))
    for attention in attentions:
        if not getattr(attention, "_rawops_rope", False):
            attention.forward = types.MethodType(forwards[type(attention)], attention)
            attention._rawops_rope = True
    if causal_lm:
        model._rawops_loss_options = options  # a second call may change them
        if not getattr(model, "_rawops_fused_loss", False):
            model.forward = types.MethodType(_causal_lm_forward, model)
            model._rawops_fused_loss = True
    return model
