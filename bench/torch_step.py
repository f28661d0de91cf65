#!/usr/bin/python3
"""PyTorch baseline for bench/cpu_vs_torch.sh: one training step of a llama-shaped
decoder on the CPU (forward, full-logits cross-entropy, backward, AdamW), written the
way a PyTorch user writes it.

MODE (optional 11th argument, comma-separated, default "fp32"):
  fp32     float32 everywhere (the default)
  bf16     torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss
           (bf16 matmuls through oneDNN, AMX where the CPU has it; fp32 master weights)
  sdpa     F.scaled_dot_product_attention(is_causal=True) instead of matmul + masked
           softmax (torch >= 2.0; torch 1.13 has neither it nor torch.compile)
  compile  torch.compile the model's forward (inductor; the first steps compile, only
           the steps after the warm-up are timed, the compile time is reported apart)
Prints one JSON line: {"impl": "pytorch", "mode": ..., "step_ms": [...], "peak_rss_mib": ...}.
Usage: torch_step.py d_model layers heads kv_heads mlp seq batch vocab threads steps [MODE]
"""
import json
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Layer(torch.nn.Module):
    def __init__(self, d, heads, kv, mlp):
        super().__init__()
        self.h, self.kv, self.dh = heads, kv, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = torch.nn.Linear(d, heads * self.dh, bias=False)
        self.k = torch.nn.Linear(d, kv * self.dh, bias=False)
        self.v = torch.nn.Linear(d, kv * self.dh, bias=False)
        self.o = torch.nn.Linear(heads * self.dh, d, bias=False)
        self.gate = torch.nn.Linear(d, mlp, bias=False)
        self.up = torch.nn.Linear(d, mlp, bias=False)
        self.down = torch.nn.Linear(mlp, d, bias=False)

    def forward(self, x, cos, sin, mask, sdpa=False):
        B, T, D = x.shape
        n = self.n1(x)
        q = self.q(n).view(B, T, self.h, self.dh).transpose(1, 2)
        k = self.k(n).view(B, T, self.kv, self.dh).transpose(1, 2)
        v = self.v(n).view(B, T, self.kv, self.dh).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.h // self.kv
        if rep > 1:  # as transformers' repeat_kv: no copy when every head has its own kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.dh) + mask
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        n = self.n2(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class Model(torch.nn.Module):
    def __init__(self, d, L, H, KV, MLP, V, sdpa):
        super().__init__()
        self.emb = torch.nn.Embedding(V, d)
        self.layers = torch.nn.ModuleList([Layer(d, H, KV, MLP) for _ in range(L)])
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, V, bias=False)
        self.sdpa = sdpa

    def forward(self, tok, cos, sin, mask):
        x = self.emb(tok)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, self.sdpa)
        return self.head(self.norm(x))


def main():
    d, L, H, KV, MLP, T, B, V, threads, steps = map(int, sys.argv[1:11])
    mode = sys.argv[11] if len(sys.argv) > 11 else "fp32"
    opts = set(mode.split(","))
    bf16, sdpa, comp = "bf16" in opts, "sdpa" in opts, "compile" in opts
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Model(d, L, H, KV, MLP, V, sdpa)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    fwd = torch.compile(model) if comp else model
    dh = d // H
    inv = 1.0 / (10000.0 ** (torch.arange(0, dh, 2).float() / dh))
    ang = torch.outer(torch.arange(T).float(), inv)
    cos = torch.cat((ang.cos(), ang.cos()), -1)
    sin = torch.cat((ang.sin(), ang.sin()), -1)
    mask = torch.full((T, T), float("-inf")).triu(1)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    times = []
    warm = 2 if comp else 1  # compile: the first two steps trace and compile
    for _ in range(steps + warm):
        t0 = time.perf_counter()
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = fwd(tokens[:, :-1], cos, sin, mask)
                loss = F.cross_entropy(logits.view(-1, V).float(), tokens[:, 1:].reshape(-1))
        else:
            logits = fwd(tokens[:, :-1], cos, sin, mask)
            loss = F.cross_entropy(logits.view(-1, V), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "mode": mode, "threads": threads,
                      "step_ms": times[warm:], "warmup_ms": times[:warm], "loss": float(loss),
                      "peak_rss_mib": rss}))


if __name__ == "__main__":
    main()
