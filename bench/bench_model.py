"""A whole training step (issue 26, item 6): a small transformer block stack built from stock torch
modules, and the same stack with rawops' modules swapped in, float32 and bf16, step time and peak
memory side by side.

The model: token embedding (vocabulary VOCAB) and a learned position embedding, LAYERS pre-norm
blocks of width WIDTH (LayerNorm; attention: one Linear to q, k, v, F.scaled_dot_product_attention
causal over HEADS heads, an output Linear; residual; LayerNorm; MLP: Linear WIDTH -> 4 WIDTH, GELU
(erf), Linear back; residual), a final LayerNorm, an untied Linear head and the cross-entropy of the
next token, batch BATCH x sequence SEQ. Training: AdamW (fused), the same seed (so the same initial
weights: rawops' stack loads stock's state_dict) and the same batch every step for every
configuration, WARMUP steps then STEPS timed ones; each step is forward, loss, backward, optimizer
step, zero_grad, timed with CUDA events and synchronised after each; the median step. Peak memory:
torch.cuda.max_memory_allocated over the timed steps (weights, gradients and AdamW states included),
reset after the warm-up.

Configurations, each in a fresh Python process (so each peak is its own), per dtype:
  stock    the torch modules as above;
  blocks   rawops.torch_adapter.LayerNorm for every LayerNorm and LinearGELU for each MLP's first
           Linear + GELU (the blocks swapped, torch's head and loss);
  rawops   blocks, and FusedLinearCrossEntropyLoss for the head's Linear + cross-entropy (no logits
           kept: the head's weight goes in as the loss's).
Attention (SDPA), the q/k/v and output Linears, the MLP's second Linear, the embeddings and AdamW
are torch's in every configuration. float32 is float32 in all of them (torch's matmuls without
TF32; rawops' float32 GEMMs at float32's accuracy, 3xTF32 on sm_90).

Bars (issue 26, item 6): rawops' step faster than stock's at both dtypes; reported beside it: peak
memory and the loss curve against stock's (the same weights and data: the curves agree to the
dtype's rounding).

    python bench/bench_model.py [--out bench/results] [--configs stock-f32 rawops-f32 ...]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VOCAB, WIDTH, HEADS, LAYERS = 32768, 1024, 16, 4
BATCH, SEQ = 8, 1024
WARMUP, STEPS = 3, 10
LR = 3e-4
SEED, DATA_SEED = 0, 1234
KINDS = ("stock", "blocks", "rawops")
DTYPE_NAMES = ("f32", "bf16")
CONFIGS = tuple(f"{kind}-{dt}" for dt in DTYPE_NAMES for kind in KINDS)
CHILD_TIMEOUT_S = 240
SHAPE = f"{BATCH}x{SEQ} L{LAYERS} D{WIDTH} H{HEADS} V{VOCAB}"


# ------------------------------------------------------------------- the model (child process)
def build_model(kind, dtype):
    """The stack of `kind` in `dtype` on the GPU: stock's weights (seed SEED) in every kind."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    ta = None
    if kind != "stock":
        from rawops import torch_adapter as ta

    norm = ta.LayerNorm if ta else nn.LayerNorm

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = norm(WIDTH), norm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            # stock: fc1 then act; rawops: both in fc1 (LinearGELU), act the identity: same state_dict keys
            self.fc1 = ta.LinearGELU(WIDTH, 4 * WIDTH) if ta else nn.Linear(WIDTH, 4 * WIDTH)
            self.act = nn.Identity() if ta else nn.GELU()
            self.fc2 = nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = norm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            self.fused_loss = ta.FusedLinearCrossEntropyLoss() if kind == "rawops" else None

        def forward(self, ids, targets):
            x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
            for block in self.blocks:
                x = block(x)
            x = self.ln_f(x).flatten(0, 1)
            if self.fused_loss is not None:
                return self.fused_loss(x, self.head.weight, targets.flatten())
            return F.cross_entropy(self.head(x), targets.flatten())

    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = Stack()
    if kind != "stock":  # stock's initial weights, exactly: its stack from the same seed, its state_dict
        model.load_state_dict(build_model("stock", torch.float32).state_dict())
    return model.to(dtype)


def run_config(config):
    import torch
    from timing import training_steps

    kind, dt = config.rsplit("-", 1)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (torch's default; said aloud)
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(kind, dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(DATA_SEED)).cuda()
    ids, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    timed = training_steps(lambda: model(ids, targets), optimizer, WARMUP, STEPS, BATCH * SEQ)
    return {"config": config, **timed, "parameters": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__}


# ------------------------------------------------------------------- the run (parent process)
def sections(results):
    rows, notes = [], {}
    for dt in DTYPE_NAMES:
        stock = results.get(f"stock-{dt}", {})
        for kind in KINDS:
            r = results.get(f"{kind}-{dt}")
            if r is None:
                continue
            row = {"op": f"train step ({kind})", "dtype": dt, "shape": SHAPE, "config": kind,
                   "rawops us": None, "torch us": None, "notes": r.get("error", "")}
            if "error" not in r:
                row.update({k: r[k] for k in ("step ms", "tokens/s", "peak GiB", "warm-up s")})
                row["final loss"] = f"{r['losses'][-1]:.4f}"
                if "step ms" in stock:
                    row["x stock"] = stock["step ms"] / r["step ms"]
                    row["peak x stock"] = r["peak GiB"] / stock["peak GiB"]
                    gap = max(abs(a - b) for a, b in zip(r["losses"], stock["losses"]))
                    row["largest loss gap to stock"] = f"{gap:.2e}"
                    if kind != "stock":  # the history line: this configuration's step against stock's
                        row["rawops us"], row["torch us"] = r["step ms"] * 1e3, stock["step ms"] * 1e3
            rows.append(row)
        ours = results.get(f"rawops-{dt}", {})
        if "step ms" in ours and "step ms" in stock:
            notes[f"{dt}: rawops' step faster than stock's"] = "yes" if ours["step ms"] < stock["step ms"] else "NO"
        else:
            notes[f"{dt}: rawops' step faster than stock's"] = "not measured (a configuration failed)"
    params = next((r["parameters"] for r in results.values() if "parameters" in r), None)
    size = f", {params / 1e6:.1f} M parameters" if params else ""
    notes = {"model": f"{LAYERS} pre-norm blocks, width {WIDTH}, {HEADS} heads (SDPA, causal), MLP 4x with GELU "
                      f"(erf), vocabulary {VOCAB}, untied head{size}",
             "training": f"batch {BATCH} x seq {SEQ}, AdamW lr {LR} fused, {WARMUP} warm-up + {STEPS} timed steps, the "
                         "same batch each step, one fresh process per configuration, float32 without TF32 in torch",
             "configurations": "stock: torch modules; blocks: rawops LayerNorm + LinearGELU (MLP's first Linear + "
                               "GELU), torch's head and loss; rawops: blocks + FusedLinearCrossEntropyLoss",
             "bar": "rawops' step < stock's at f32 and at bf16", **notes}
    header = ["dtype", "config", "step ms", "tokens/s", "x stock", "peak GiB", "peak x stock", "final loss",
              "largest loss gap to stock", "warm-up s", "notes"]
    steps = max((len(r.get("losses", [])) for r in results.values()), default=0)
    curve = []
    for dt in DTYPE_NAMES:
        for i in range(steps):
            row = {"op": "loss", "dtype": dt, "shape": SHAPE, "step": i, "rawops us": None, "torch us": None,
                   "phase": "timed" if i >= WARMUP else "warm-up"}
            for kind in KINDS:
                losses = results.get(f"{kind}-{dt}", {}).get("losses")
                if losses and i < len(losses):
                    row[kind] = f"{losses[i]:.4f}"
            curve.append(row)
    return [("Training step, one GPU", header, rows, notes),
            ("Loss curve (every step, warm-up included)", ["dtype", "step", "phase", *KINDS], curve,
             {"data": "one fixed random batch; targets are the next tokens"})]


def main():
    from timing import per_process_main

    return per_process_main(__doc__.splitlines()[0], __file__, "model", CONFIGS, run_config, sections, CHILD_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main())
