"""End-to-end benchmark: a transformers LlamaForCausalLM trained a few steps stock, with Liger-Kernel's
apply_liger_kernel_to_llama and with rawops' apply_rawops_to_llama, in one run on one GPU.

The model (issue 29): random init, no download; 4 layers, hidden 2048, intermediate 5632, 16 heads
and 8 key/value heads (head dim 128), vocabulary 128256, rope theta 500000 (Llama 3), untied
lm_head, bf16 parameters, SDPA attention; batch 4 x sequence 2048 (8192 tokens a step). Training:
AdamW (lr 2e-4, fused), the same seed (the same initial weights) and the same batch every step for
every configuration (a fixed batch: the loss falls step by step, so the curves say something),
WARMUP steps then STEPS timed ones. Each step is forward with labels (HF's causal-LM loss),
backward, optimizer step, zero_grad; timed with CUDA events and synchronised after each (a loop
that logs its loss does so), median over the timed steps. Tokens/s = 8192 / median step. Peak
memory: torch.cuda.max_memory_allocated over the timed steps (weights, gradients and AdamW states
included), reset after the warm-up.

Each configuration runs in a fresh Python process (this script with --config): Liger patches
transformers' modeling_llama globally (its rope function, and the classes) and compiles Triton
kernels, so neither leaks into the others, and each process's peak memory is its own. Liger is
applied to the built model (apply_liger_kernel_to_llama(model=...)), rawops with every swap on
(apply_rawops_to_llama(model): the fused loss in chunks of Liger's own rule, 256 tokens' logits at
this shape, so its peak memory is Liger's); "rawops-chunk1024" is the same with chunks of 1024 tokens
(fused_linear_cross_entropy={"chunk_rows": 1024}, fused_linear_cross_entropy's own default here): the
speed the loss's memory buys back. If rawops' fused linear cross-entropy is missing, the rawops
configurations run without the loss swap and say so.

Bars (issue 29), for the default rawops configuration (the others: their step and loss curve): its
step faster than stock's and Liger's; its peak memory no higher than Liger's; its loss curve equal to
stock's within bf16 noise, taken as: at every step |rawops - stock| <= max(2 x the largest
|Liger - stock|, 0.5% of the stock loss).

    python bench/bench_llama.py [--out bench/results] [--configs stock liger rawops rawops-chunk1024]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODEL = dict(vocab_size=128256, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=8, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
BATCH, SEQ = 4, 2048
WARMUP, STEPS = 3, 10
LR = 2e-4
SEED, DATA_SEED = 0, 1234
RAWOPS_LOSS = {"rawops": True, "rawops-chunk1024": {"chunk_rows": 1024}}  # fused_linear_cross_entropy=
CONFIGS = ("stock", "liger", *RAWOPS_LOSS)
CHILD_TIMEOUT_S = 300
SHAPE = f"{BATCH}x{SEQ} L{MODEL['num_hidden_layers']} H{MODEL['hidden_size']} V{MODEL['vocab_size']}"
NOISE_VS_LIGER, NOISE_FLOOR = 2.0, 0.005


# ------------------------------------------------------------------- one configuration (child process)
def build(config):
    """The model of `config` (same seed, same weights for all) and a note on what was applied."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**MODEL))
    model = model.to(torch.bfloat16).train()
    note = "transformers as it is"
    if config == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(model=model)  # rope, rms_norm, swiglu, fused linear cross-entropy (defaults)
        note = "apply_liger_kernel_to_llama(model=model): rope, rms_norm, swiglu, fused linear cross-entropy"
    elif config in RAWOPS_LOSS:
        from rawops.torch_adapter.llama import apply_rawops_to_llama

        loss = RAWOPS_LOSS[config]
        try:
            apply_rawops_to_llama(model, fused_linear_cross_entropy=loss)
            note = f"apply_rawops_to_llama(model, fused_linear_cross_entropy={loss}): every swap"
        except ImportError as error:
            apply_rawops_to_llama(model, fused_linear_cross_entropy=False)
            note = f"apply_rawops_to_llama(model, fused_linear_cross_entropy=False): {error}"
    return model, note


def run_config(config):
    import torch
    from timing import training_steps

    model, note = build(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    ids = torch.randint(0, MODEL["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(DATA_SEED))
    ids = ids.cuda()
    labels = ids.clone()

    timed = training_steps(lambda: model(input_ids=ids, labels=labels, use_cache=False).loss, optimizer, WARMUP,
                           STEPS, BATCH * SEQ)
    return {"config": config, "note": note, **timed, "attention": model.config._attn_implementation,
            "torch": torch.__version__}


# ------------------------------------------------------------------- the run (parent process)
def noise_bar(results, config):
    """(the largest |config - stock| loss over the steps, the bound it must stay under), or None."""
    stock, liger, ours = (results.get(c, {}).get("losses") for c in ("stock", "liger", config))
    if not stock or not ours:
        return None
    liger_dev = max((abs(a - b) for a, b in zip(liger, stock)), default=0.0) if liger else 0.0
    bound = max(NOISE_VS_LIGER * liger_dev, NOISE_FLOOR * max(abs(x) for x in stock))
    return max(abs(a - b) for a, b in zip(ours, stock)), bound


def sections(results):
    stock, liger = results.get("stock", {}), results.get("liger", {})
    rows = []
    for config in CONFIGS:
        r = results.get(config)
        if r is None:
            continue
        row = {"op": "llama train step", "dtype": "bf16", "shape": SHAPE, "config": config,
               "rawops us": None, "torch us": None, "notes": r.get("error") or r["note"]}
        if "error" not in r:
            row.update({k: r[k] for k in ("step ms", "tokens/s", "peak GiB", "warm-up s")})
            row["final loss"], row["losses"] = f"{r['losses'][-1]:.4f}", r["losses"]
            if "step ms" in stock:
                row["x stock"] = stock["step ms"] / r["step ms"]
            if "step ms" in liger:
                row["x liger"] = liger["step ms"] / r["step ms"]
            if config in RAWOPS_LOSS and "step ms" in stock:  # the history line: rawops' step vs stock's
                row["rawops us"], row["torch us"] = r["step ms"] * 1e3, stock["step ms"] * 1e3
                row["op"] = f"llama train step ({config})"
        rows.append(row)
    header = ["config", "step ms", "tokens/s", "peak GiB", "x stock", "x liger", "warm-up s", "final loss", "notes"]

    meets = {}
    for config in RAWOPS_LOSS:
        ours = results.get(config, {})
        if "step ms" in ours:
            others = [results[c]["step ms"] for c in ("stock", "liger") if "step ms" in results.get(c, {})]
            meets[f"{config}: step faster than stock and Liger"] = (
                ours["step ms"] < min(others) if len(others) == 2 else "not measured (a configuration failed)")
            if config == "rawops":  # the others buy speed with memory, on purpose
                meets[f"{config}: peak memory <= Liger's"] = (
                    ours["peak GiB"] <= liger["peak GiB"] if "peak GiB" in liger else "not measured (Liger failed)")
        noise = noise_bar(results, config)
        if noise is not None:
            meets[f"{config}: loss curve within bf16 noise"] = (
                f"{'yes' if noise[0] <= noise[1] else 'NO'}: max |{config} - stock| {noise[0]:.4g}, bound "
                f"{noise[1]:.4g}")
    notes = {"model": "LlamaForCausalLM " + ", ".join(f"{k}={v}" for k, v in MODEL.items()),
             "training": f"batch {BATCH} x seq {SEQ}, AdamW lr {LR} fused, {WARMUP} warm-up + {STEPS} timed steps, "
                         "the same batch each step, one fresh process per configuration",
             "attention": ", ".join(sorted({r.get("attention", "?") for r in results.values() if "attention" in r})),
             "bars": "each rawops configuration: step < stock's and Liger's; rawops: peak GiB <= Liger's; every step "
                     f"|rawops - stock| <= max({NOISE_VS_LIGER} x max |Liger - stock|, {NOISE_FLOOR} x stock loss)",
             **{k: (v if isinstance(v, str) else "yes" if v else "NO") for k, v in meets.items()}}

    steps = max((len(r.get("losses", [])) for r in results.values()), default=0)
    curve = []
    for i in range(steps):
        row = {"op": "loss", "dtype": "bf16", "shape": SHAPE, "step": i, "rawops us": None, "torch us": None,
               "phase": "timed" if i >= WARMUP else "warm-up"}
        for config in CONFIGS:
            losses = results.get(config, {}).get("losses")
            if losses:
                row[config] = f"{losses[i]:.4f}"
                if config != "stock" and results.get("stock", {}).get("losses"):
                    row[f"{config} - stock"] = f"{losses[i] - results['stock']['losses'][i]:+.2e}"
        curve.append(row)
    curve_header = ["step", "phase", *CONFIGS, *(f"{c} - stock" for c in CONFIGS[1:])]
    return [("Training step, bf16, one GPU", header, rows, notes),
            ("Loss curve (every step, warm-up included)", curve_header, curve,
             {"data": "one fixed random batch, labels = input_ids (HF shifts them)"})]


def main():
    from timing import per_process_main

    return per_process_main(__doc__.splitlines()[0], __file__, "llama", CONFIGS, run_config, sections, CHILD_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
