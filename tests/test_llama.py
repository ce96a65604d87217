"""apply_rawops_to_llama's contract on a tiny random transformers LlamaForCausalLM: without a GPU, the
structure (module types, the same Parameters and state_dict, nothing global changed, refusals) and
the wiring, with rawops' kernels replaced by torch formulas (the same loss and gradients as the
stock model); with one, the real kernels against the stock model, loss and every parameter's
gradient, each swap alone and all together, float32 and bfloat16."""
import copy
import sys
import types

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from rawops.torch_adapter import glu, llama, norm, rotary  # noqa: E402
from rawops.torch_adapter.glu import SwiGLUMLP  # noqa: E402
from rawops.torch_adapter.llama import apply_rawops_to_llama, loss_chunk_rows  # noqa: E402
from rawops.torch_adapter.norm import RMSNorm  # noqa: E402

LOSS_MODULE = "rawops.torch_adapter._losses_linear"
SWAPS = ("rms_norm", "swiglu", "rope", "fused_linear_cross_entropy")


def config(**kw):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, hidden_act="silu")
    base.update(kw)
    return LlamaConfig(**base)


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return LlamaForCausalLM(config(**kw))


def flags(only=None):
    """Every swap on (only=None), or just `only`."""
    return {name: only is None or name == only for name in SWAPS}


def batch(vocab, batch_size=2, seq=12, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch_size, seq), generator=g)
    labels = ids.clone()
    labels[0, 3] = labels[1, 7] = -100
    labels[0, 5], labels[1, 2] = 0, vocab - 1
    return ids.to(device), labels.to(device)


# ------------------------------------------------------------------- torch stand-ins for the kernels
def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Fakes:
    """rawops' kernels replaced (monkeypatch, this test only) by torch formulas with the same
    contracts, recording how they were called."""

    def __init__(self, monkeypatch):
        self.calls = {"rms_norm": 0, "swiglu": 0, "rope": [], "loss": []}
        monkeypatch.setattr(norm, "rms_norm", self.rms_norm)
        monkeypatch.setattr(glu, "swiglu", self.swiglu)
        # SwiGLUMLP calls the split op's entry with its in-place backward
        monkeypatch.setattr(glu, "_split", lambda base, gate, up, inplace_backward=False: self.swiglu(gate, up))
        monkeypatch.setattr(rotary, "rope", self.rope)
        module = types.ModuleType(LOSS_MODULE)
        module.fused_linear_cross_entropy = self.fused_linear_cross_entropy
        monkeypatch.setitem(sys.modules, LOSS_MODULE, module)

    def rms_norm(self, input, normalized_shape, weight=None, eps=None):
        self.calls["rms_norm"] += 1
        return F.rms_norm(input, normalized_shape, weight, eps)

    def swiglu(self, gate, up):
        self.calls["swiglu"] += 1
        return F.silu(gate) * up

    def rope(self, q, k, cos, sin, layout="neox", qk_layout="bshd"):
        """In place on q and k, as rawops' rope."""
        self.calls["rope"].append((layout, qk_layout, q.is_contiguous(), q._base is not None))
        dim = 1 if qk_layout == "bhsd" else 2
        c, s = cos.unsqueeze(dim), sin.unsqueeze(dim)
        for t in (q, k):
            t.copy_(t * c + rotate_half(t) * s)
        return q, k

    def fused_linear_cross_entropy(self, input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                                   reduction="mean", z_loss=0.0, *, chunk_rows=None, accum_dtype=None):
        self.calls["loss"].append((tuple(input.shape), reduction, ignore_index))
        return F.cross_entropy(F.linear(input, weight, bias).float(), target, ignore_index=ignore_index,
                               reduction=reduction)


@pytest.fixture
def fakes(monkeypatch):
    return Fakes(monkeypatch)


# ------------------------------------------------------------------- structure (no kernel runs)
def _parameters(model):
    return {name: p for name, p in model.named_parameters()}


@pytest.mark.parametrize("only", [None, *SWAPS])
def test_the_swap_keeps_every_parameter_and_state_dict_entry(fakes, only):
    model = tiny(mlp_bias=True)
    before = _parameters(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert apply_rawops_to_llama(model, **flags(only)) is model
    after = _parameters(model)
    assert list(after) == list(before)
    assert all(after[name] is before[name] for name in before)  # the same Parameter objects
    new_state = model.state_dict()
    assert list(new_state) == list(state)
    assert all(torch.equal(new_state[k], state[k]) and new_state[k].data_ptr() == pointers[k] for k in state)


@pytest.mark.parametrize("only", [None, *SWAPS])
def test_each_swap_replaces_what_its_flag_names_and_nothing_else(fakes, only):
    model = tiny()
    layers = model.config.num_hidden_layers
    on = flags(only)
    apply_rawops_to_llama(model, **on)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(RMSNorm) == (2 * layers + 1 if on["rms_norm"] else 0)
    assert kinds.count(modeling_llama.LlamaRMSNorm) == (0 if on["rms_norm"] else 2 * layers + 1)
    assert kinds.count(SwiGLUMLP) == (layers if on["swiglu"] else 0)
    assert kinds.count(modeling_llama.LlamaMLP) == (0 if on["swiglu"] else layers)
    for layer in model.model.layers:
        assert ("forward" in vars(layer.self_attn)) == on["rope"]
    assert ("forward" in vars(model)) == on["fused_linear_cross_entropy"]


def test_the_modules_carry_the_stock_ones_weights_eps_and_linears():
    model = tiny(rms_norm_eps=3e-5, mlp_bias=True)
    layer = model.model.layers[1]
    old_norm, old_mlp = layer.post_attention_layernorm, layer.mlp
    old_norm.train(False)
    apply_rawops_to_llama(model, fused_linear_cross_entropy=False)
    new_norm, new_mlp = layer.post_attention_layernorm, layer.mlp
    assert isinstance(new_norm, RMSNorm) and new_norm.weight is old_norm.weight and new_norm.eps == 3e-5
    assert new_norm.normalized_shape == (64,) and not new_norm.training
    assert isinstance(new_mlp, SwiGLUMLP)
    assert (new_mlp.gate_proj, new_mlp.up_proj, new_mlp.down_proj) == (old_mlp.gate_proj, old_mlp.up_proj,
                                                                        old_mlp.down_proj)
    assert new_mlp.gate_proj.bias is not None
    assert isinstance(model.model.norm, RMSNorm) and model.model.norm.eps == 3e-5


def test_nothing_in_transformers_is_patched(fakes):
    stock = (modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaAttention.forward,
             modeling_llama.LlamaForCausalLM.forward, modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP)
    apply_rawops_to_llama(tiny())
    assert (modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaAttention.forward,
            modeling_llama.LlamaForCausalLM.forward, modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP) == stock
    fresh = tiny()  # a model built afterwards is stock
    assert not any(isinstance(m, (RMSNorm, SwiGLUMLP)) for m in fresh.modules())
    assert "forward" not in vars(fresh) and "forward" not in vars(fresh.model.layers[0].self_attn)


def test_a_second_call_changes_nothing(fakes):
    model = apply_rawops_to_llama(tiny())
    modules = list(model.modules())
    forward, attention_forward = model.forward, model.model.layers[0].self_attn.forward
    apply_rawops_to_llama(model)
    assert list(model.modules()) == modules
    assert model.forward == forward and model.model.layers[0].self_attn.forward == attention_forward


def test_a_llama_model_takes_every_swap_but_the_loss(fakes):
    torch.manual_seed(0)
    model = LlamaModel(config())
    apply_rawops_to_llama(model)
    assert isinstance(model.norm, RMSNorm) and isinstance(model.layers[0].mlp, SwiGLUMLP)
    assert "forward" in vars(model.layers[0].self_attn) and "forward" not in vars(model)


# ------------------------------------------------------------------- refusals
def test_not_a_llama_model_is_a_type_error():
    with pytest.raises(TypeError, match="model must be a transformers LlamaForCausalLM or LlamaModel"):
        apply_rawops_to_llama(torch.nn.Linear(4, 4))


def test_an_activation_other_than_silu_is_refused_before_any_change(fakes):
    model = tiny(hidden_act="gelu")
    with pytest.raises(ValueError, match="'gelu'.*swiglu=False"):
        apply_rawops_to_llama(model)
    assert not any(isinstance(m, RMSNorm) for m in model.modules()) and "forward" not in vars(model)
    apply_rawops_to_llama(model, swiglu=False)
    assert isinstance(model.model.layers[0].mlp, modeling_llama.LlamaMLP)
    assert isinstance(model.model.norm, RMSNorm)


def test_a_missing_fused_loss_is_an_import_error_only_when_the_loss_swap_is_asked(monkeypatch):
    monkeypatch.setitem(sys.modules, LOSS_MODULE, None)  # the import fails, as where the file is absent
    model = tiny()
    with pytest.raises(ImportError, match="fused_linear_cross_entropy=False"):
        apply_rawops_to_llama(model)
    assert not any(isinstance(m, RMSNorm) for m in model.modules())  # refused before any change
    apply_rawops_to_llama(model, fused_linear_cross_entropy=False)
    assert isinstance(model.model.norm, RMSNorm) and "forward" not in vars(model)


def test_an_lm_head_that_is_not_a_linear_is_refused(fakes):
    model = tiny()
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(TypeError, match="lm_head"):
        apply_rawops_to_llama(model)


@pytest.mark.parametrize("flag,error,match", [
    ("yes", TypeError, "must be a bool or a dict"),
    ({"chunk_rows": 64, "reduction": "sum"}, ValueError, r"unknown options \['reduction'\]"),
])
def test_bad_loss_options_are_refused_before_any_change(fakes, flag, error, match):
    model = tiny()
    with pytest.raises(error, match=match):
        apply_rawops_to_llama(model, fused_linear_cross_entropy=flag)
    assert not any(isinstance(m, RMSNorm) for m in model.modules()) and "forward" not in vars(model)


def test_loss_options_reach_the_fused_loss(fakes, monkeypatch):
    seen = []
    plain = fakes.fused_linear_cross_entropy

    def recording(*args, chunk_rows=None, accum_dtype=None, **kw):
        seen.append((chunk_rows, accum_dtype))
        return plain(*args, chunk_rows=chunk_rows, **kw)
    monkeypatch.setattr(sys.modules[LOSS_MODULE], "fused_linear_cross_entropy", recording)
    model = apply_rawops_to_llama(tiny(), rms_norm=False, swiglu=False, rope=False,
                                  fused_linear_cross_entropy={"chunk_rows": 5, "accum_dtype": torch.float32})
    ids, labels = batch(128)
    model(input_ids=ids, labels=labels)
    apply_rawops_to_llama(model, fused_linear_cross_entropy=True)  # a second call resets them
    model(input_ids=ids, labels=labels)
    tokens, hidden = ids.numel(), model.config.hidden_size
    assert seen == [(5, torch.float32), (loss_chunk_rows(tokens, model.config.vocab_size, hidden), None)]


@pytest.mark.parametrize("tokens, vocab, hidden, rows", [
    (8192, 128256, 2048, 256),   # bench_llama's shape: ceil(8192 / 63) = 131 -> 256, as Liger's
    (8192, 32000, 4096, 1024),   # ceil(32000 / 4096) = 8 -> 1024
    (100, 128256, 2048, 2),      # ceil(100 / 63) = 2
    (3, 10, 64, 3),              # V <= H: one chunk of every token
    (0, 10, 64, 1),
])
def test_the_default_loss_chunk_is_ligers_rule(tokens, vocab, hidden, rows):
    assert loss_chunk_rows(tokens, vocab, hidden) == rows


def test_skip_logits_without_labels_is_a_value_error(fakes):
    model = apply_rawops_to_llama(tiny(), rms_norm=False, swiglu=False, rope=False)
    ids, _ = batch(128)
    with pytest.raises(ValueError, match="skip_logits=True needs labels"):
        model(input_ids=ids, skip_logits=True)


def test_the_in_place_rope_refuses_an_unknown_unsqueeze_dim():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        llama._apply_rotary_pos_emb_in_place(q, q, q[0, 0], q[0, 0], unsqueeze_dim=3)


# ------------------------------------------------------------------- wiring, kernels replaced by torch (CPU)
def _grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def _train_step(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    return out


@pytest.mark.parametrize("only", [None, *SWAPS])
def test_the_swapped_model_trains_as_the_stock_one(fakes, only):
    stock = tiny()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), **flags(only))
    stock.train()
    swapped.train()
    ids, labels = batch(128)
    want, got = _train_step(stock, ids, labels), _train_step(swapped, ids, labels)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want_grads, got_grads = _grads(stock), _grads(swapped)
    assert list(got_grads) == list(want_grads) and len(want_grads) == len(list(stock.parameters()))
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    on = flags(only)
    layers = stock.config.num_hidden_layers
    assert fakes.calls["rms_norm"] == (2 * layers + 1 if on["rms_norm"] else 0)
    assert fakes.calls["swiglu"] == (layers if on["swiglu"] else 0)
    # HF's q, k: (B, H, S, D) views of the projections' (B, S, H, D) outputs, rotated where they lie
    assert fakes.calls["rope"] == ([("neox", "bhsd", False, True)] * layers if on["rope"] else [])
    if on["fused_linear_cross_entropy"]:
        assert fakes.calls["loss"] == [((ids.numel(), 64), "mean", -100)]
        assert got.logits is None
    else:
        assert fakes.calls["loss"] == [] and got.logits is not None


def test_num_items_in_batch_divides_the_summed_loss(fakes):
    stock = tiny()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), rms_norm=False, swiglu=False, rope=False)
    ids, labels = batch(128)
    items = torch.tensor(40)
    want = _train_step(stock, ids, labels, num_items_in_batch=items)
    got = _train_step(swapped, ids, labels, num_items_in_batch=items)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    assert fakes.calls["loss"][-1][1] == "sum"
    torch.testing.assert_close(swapped.lm_head.weight.grad, stock.lm_head.weight.grad, rtol=1e-4, atol=1e-7)


def test_shift_labels_and_ignore_index_reach_the_loss(fakes):
    stock = tiny()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), rms_norm=False, swiglu=False, rope=False)
    ids, labels = batch(128)
    shift = torch.roll(labels, -1, dims=1)
    shift[:, -1] = 7
    shift[shift == -100] = 7  # ignore_index 7 replaces -100
    want = stock(input_ids=ids, labels=labels, shift_labels=shift, ignore_index=7).loss
    got = swapped(input_ids=ids, labels=labels, shift_labels=shift, ignore_index=7).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert fakes.calls["loss"][-1][2] == 7


def test_without_labels_or_in_eval_the_stock_forward_runs(fakes):
    stock = tiny()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), rms_norm=False, swiglu=False, rope=False)
    ids, labels = batch(128)
    torch.testing.assert_close(swapped(input_ids=ids).logits, stock(input_ids=ids).logits)
    stock.eval()
    swapped.eval()
    with torch.no_grad():
        want, got = stock(input_ids=ids, labels=labels), swapped(input_ids=ids, labels=labels)
        assert got.logits is not None and fakes.calls["loss"] == []
        torch.testing.assert_close(got.loss, want.loss)
        forced = swapped(input_ids=ids, labels=labels, skip_logits=True)  # eval, fused on request
    assert forced.logits is None and len(fakes.calls["loss"]) == 1
    torch.testing.assert_close(forced.loss, want.loss, rtol=1e-5, atol=1e-6)


def test_return_dict_false_gives_a_tuple_led_by_the_loss(fakes):
    stock = tiny()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), rms_norm=False, swiglu=False, rope=False)
    ids, labels = batch(128)
    got = swapped(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(got, tuple)
    torch.testing.assert_close(got[0], stock(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- the real kernels (GPU)
def _gpu_model(dtype):
    cfg = config(vocab_size=1000, hidden_size=128, intermediate_size=344, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device="cuda", dtype=dtype)


def _relative(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


# float32: the kernels' float32 math against torch's (summation order, fused GEMMs);
# bfloat16: one rounding per kernel against HF's several, over two layers and the backward.
GPU_TOL = {torch.float32: (1e-4, 2e-3), torch.bfloat16: (1e-2, 5e-2)}  # (loss relative, gradient relative norm)


def _needs(on):
    if on["fused_linear_cross_entropy"]:
        pytest.importorskip(LOSS_MODULE, reason="rawops' fused linear cross-entropy is not in this tree")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("only", [None, *SWAPS])
def test_gpu_loss_and_every_gradient_match_the_stock_model(dtype, only):
    on = flags(only)
    _needs(on)
    stock = _gpu_model(dtype)
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), **on)
    stock.train()
    swapped.train()
    ids, labels = batch(1000, batch_size=2, seq=48, device="cuda")
    want, got = _train_step(stock, ids, labels), _train_step(swapped, ids, labels)
    loss_tol, grad_tol = GPU_TOL[dtype]
    assert torch.isfinite(got.loss)
    assert abs(got.loss.item() - want.loss.item()) <= loss_tol * abs(want.loss.item()), (got.loss, want.loss)
    assert (got.logits is None) == on["fused_linear_cross_entropy"]
    want_grads, got_grads = _grads(stock), _grads(swapped)
    assert list(got_grads) == list(want_grads) and len(want_grads) == len(list(stock.parameters()))
    bad = {}
    for name, g in want_grads.items():
        assert torch.isfinite(got_grads[name]).all(), name
        assert g.abs().max() > 0, name  # a zero reference gradient would compare trivially
        error = _relative(got_grads[name], g)
        if error > grad_tol:
            bad[name] = error
    assert not bad, f"gradients off by more than {grad_tol} (relative norm): {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gpu_inference_logits_match_the_stock_model(dtype):
    stock = _gpu_model(dtype).eval()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock), fused_linear_cross_entropy=False).eval()
    ids, _ = batch(1000, batch_size=2, seq=48, device="cuda")
    with torch.no_grad():
        want = stock(input_ids=ids, use_cache=True).logits
        got = swapped(input_ids=ids, use_cache=True).logits
    assert torch.isfinite(got).all()
    assert _relative(got, want) <= GPU_TOL[dtype][1] / 5


@pytest.mark.gpu
def test_gpu_num_items_in_batch_as_the_trainer_passes_it():
    _needs(flags())
    stock = _gpu_model(torch.float32).train()
    swapped = apply_rawops_to_llama(copy.deepcopy(stock)).train()
    ids, labels = batch(1000, batch_size=2, seq=48, device="cuda")
    items = (labels[:, 1:] != -100).sum() * 2  # as for two accumulated micro-batches
    want = _train_step(stock, ids, labels, num_items_in_batch=items)
    got = _train_step(swapped, ids, labels, num_items_in_batch=items)
    assert abs(got.loss.item() - want.loss.item()) <= 1e-4 * abs(want.loss.item())
    assert _relative(swapped.lm_head.weight.grad, stock.lm_head.weight.grad) <= 2e-3
