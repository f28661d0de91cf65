#!/usr/bin/python3
"""Independent PyTorch (float64) reference for meshtrain's decoder.

Written from Hugging Face transformers semantics (modeling_llama.py, modeling_gemma.py,
modeling_gemma2.py, modeling_gemma3.py, modeling_rope_utils.py), not from meshtrain's C
code: rotate_half RoPE, repeat_kv for GQA/MQA, eager softmax attention over a full
[T, T] score matrix with a causal (and sliding-window) mask, RMSNorm in high precision,
gated MLP, tied or untied unembedding, torch autograd for the gradients and
torch.optim.AdamW for the optimizer.

Usage: torch_decoder.py DUMPDIR   (written by tests/tools/model_dump)

Compares with what the C code wrote and exits non-zero on a mismatch. "Relative
difference" of a tensor is max|c - ref| / max|ref| over the whole tensor (ref = this
script, float64); it is printed for every tensor.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bounds  # noqa: E402

torch.set_default_dtype(torch.float64)

# Bounds (tests/reference/bounds.py, the model-level error model of tests/test_bounds.h).
# The C side computes in float32 (u = 2^-24), this script in float64 (its own error
# ~1e-16 relative, negligible), so each bound covers the fp32 side only:
# lambda sqrt(S) u kappa, S the terms on the compared value's chain (from the config),
# kappa its condition evaluated here in float64 (every parameter times 1 + eta xi):
#   logits: S to a logit, kappa = max|z' - z| / max|z| / eta (the report's measure);
#   loss: S plus the cross-entropy's V + 2 terms, kappa the loss's relative change, at
#     least its first-order expectation sqrt(sum (p g)^2) / |L| (one draw may cancel);
#   each gradient: S to a gradient summed over B T rows, kappa per tensor in max|.|;
#   the losses of the AdamW steps: step s's loss has s - 1 gradients more on its chain,
#     plus lambda sqrt(sum (g_s dp_(s-1))^2) / |L| for the parameter difference dp that
#     the earlier steps' gradient differences leave through AdamW (bounds.adam_update_diff:
#     elementwise, from this run's gradient history; weight decay shrinks differences).
# Old tolerances: 1e-4 (every tensor) and 1e-5 (losses), from "observed ~1e-6".
# MT_REF_PLANT=x moves every C value by x times its bound (shows the checks can fail).
PLANT = float(os.environ.get("MT_REF_PLANT", "0"))

def load(dirpath, name, dtype, shape):
    a = np.fromfile(os.path.join(dirpath, name), dtype=dtype)
    n = int(np.prod(shape)) if len(shape) else 1
    if a.size != n:
        raise SystemExit(f"{name}: {a.size} elements, expected {n} for shape {shape}")
    return a.reshape(shape)


# ---------------------------------------------------------------------------------
# The model, HF style


def rms_norm(x, w, eps, unit_offset):
    # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w;  GemmaRMSNorm: ... * (1 + w)
    var = x.pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    return y * ((1.0 + w) if unit_offset else w)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    # q, k [B, heads, T, Dh]; cos, sin [T, Dh]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_inv_freq(base, dim, rope_type, cfg):
    # _compute_default_rope_parameters
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    if rope_type == "linear":
        # _compute_linear_scaling_rope_parameters
        inv_freq = inv_freq / cfg["rope_factor"]
    elif rope_type == "llama3":
        # _compute_llama3_parameters
        factor = cfg["rope_factor"]
        low_freq_factor = cfg["rope_low_freq_factor"]
        high_freq_factor = cfg["rope_high_freq_factor"]
        old_context_len = cfg["rope_original_max_position"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, inv_freq_llama)
    elif rope_type != "default":
        raise SystemExit(f"unknown rope_type {rope_type}")
    return inv_freq


def cos_sin(inv_freq, T):
    pos = torch.arange(T, dtype=torch.float64)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    # [B, Hkv, T, Dh] -> [B, Hkv * n_rep, T, Dh]
    if n_rep == 1:
        return x
    b, hkv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, d).reshape(b, hkv * n_rep, t, d)


def is_sliding(cfg, layer):
    # gemma2: sliding on even layers (pattern 2); gemma3: (layer + 1) % pattern != 0
    if cfg["sliding_window_size"] <= 0:
        return False
    pattern = cfg["sliding_window_pattern"]
    if pattern <= 0:
        # meshtrain's config.h: without a pattern, a window on a llama/gemma block makes
        # every layer sliding (Mistral style); gemma2/3 then have only global layers
        return cfg["decoder_block"] in ("llama2", "gemma")
    return bool((layer + 1) % pattern)


class Decoder:
    def __init__(self, cfg, params):
        self.cfg = cfg
        self.p = params
        self.gemma = cfg["decoder_block"] != "llama2"
        self.eps = cfg["normalization_layer_epsilon"]

    def norm(self, x, name):
        return rms_norm(x, self.p[name], self.eps, self.gemma)

    def linear(self, x, name):
        return x @ self.p[name].t()  # nn.Linear, weight [out, in], no bias

    def attention(self, x, l, Bsz, T):
        c = self.cfg
        H, Hkv, Dh = c["base_num_query_heads"], c["base_num_kv_heads"], c["head_dim"]
        pre = f"model.layers.{l}.self_attn."
        q = self.linear(x, pre + "q_proj.weight").view(Bsz, T, H, Dh)
        k = self.linear(x, pre + "k_proj.weight").view(Bsz, T, Hkv, Dh)
        v = self.linear(x, pre + "v_proj.weight").view(Bsz, T, Hkv, Dh)
        if c["use_qk_norm"]:  # Gemma3Attention: q_norm / k_norm on [.., Dh] before RoPE
            q = self.norm(q, pre + "q_norm.weight")
            k = self.norm(k, pre + "k_norm.weight")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        sliding = is_sliding(c, l)
        if sliding and c["local_rope_max_timescale"] > 0:
            inv = rope_inv_freq(c["local_rope_max_timescale"], Dh, "default", c)
        else:
            inv = rope_inv_freq(c["rope_max_timescale"], Dh, c["rope_type"], c)
        cos, sin = cos_sin(inv, T)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, H // Hkv)
        v = repeat_kv(v, H // Hkv)
        qpas = c["query_pre_attn_scalar"]
        scaling = (qpas if qpas > 0 else Dh) ** -0.5
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling
        cap = c["attn_logits_soft_cap"]
        if cap > 0:  # Gemma2: tanh soft-capping of the attention logits
            scores = torch.tanh(scores / cap) * cap
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if sliding:
            allowed = allowed & (i - j < c["sliding_window_size"])
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(Bsz, T, H * Dh)
        return self.linear(out, pre + "o_proj.weight")

    def mlp(self, x, l):
        pre = f"model.layers.{l}.mlp."
        act = self.cfg["mlp_activations"][0]
        g = self.linear(x, pre + "gate_proj.weight")
        if act == "silu":
            a = F.silu(g)
        elif act == "gelu":  # gelu_pytorch_tanh
            a = F.gelu(g, approximate="tanh")
        else:
            raise SystemExit(f"unknown activation {act}")
        return self.linear(a * self.linear(x, pre + "up_proj.weight"), pre + "down_proj.weight")

    def hidden(self, tokens):
        c = self.cfg
        Bsz, T = tokens.shape
        h = F.embedding(tokens, self.p["model.embed_tokens.weight"])
        if self.gemma:
            h = h * torch.tensor(c["base_emb_dim"] ** 0.5, dtype=h.dtype)
        for l in range(c["base_num_decoder_layers"]):
            pre = f"model.layers.{l}."
            if c["use_post_attn_norm"]:
                # Gemma2DecoderLayer
                r = h
                a = self.attention(self.norm(h, pre + "input_layernorm.weight"), l, Bsz, T)
                h = r + self.norm(a, pre + "post_attention_layernorm.weight")
                r = h
                mo = self.mlp(self.norm(h, pre + "pre_feedforward_layernorm.weight"), l)
                if c["use_post_ffw_norm"]:
                    mo = self.norm(mo, pre + "post_feedforward_layernorm.weight")
                h = r + mo
            else:
                # LlamaDecoderLayer / GemmaDecoderLayer
                h = h + self.attention(self.norm(h, pre + "input_layernorm.weight"), l, Bsz, T)
                mo = self.mlp(self.norm(h, pre + "post_attention_layernorm.weight"), l)
                if c["use_post_ffw_norm"]:
                    mo = self.norm(mo, pre + "post_feedforward_layernorm.weight")
                h = h + mo
        return self.norm(h, "model.norm.weight")

    def logits(self, tokens):
        c = self.cfg
        h = self.hidden(tokens)
        w = self.p["model.embed_tokens.weight"] if c["logits_via_embedding"] else self.p["lm_head.weight"]
        z = h @ w.t()
        cap = c["final_logits_soft_cap"]
        if cap > 0:
            z = torch.tanh(z / cap) * cap
        return z


def mean_loss(model, tokens, labels, ignore):
    z = model.logits(tokens)
    V = z.shape[-1]
    return F.cross_entropy(z.reshape(-1, V), labels.reshape(-1), ignore_index=ignore, reduction="mean")


# ---------------------------------------------------------------------------------


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return diff, (diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: torch_decoder.py DUMPDIR")
    d = sys.argv[1]
    with open(os.path.join(d, "manifest.json")) as f:
        man = json.load(f)
    cfg = man["config"]
    Bsz, T = man["batch"], man["seq"]
    V = cfg["vocab_size"]
    ignore = man["ignore_label"]
    tokens = torch.from_numpy(load(d, "tokens.bin", np.int32, [Bsz, T]).astype(np.int64))
    labels = torch.from_numpy(load(d, "labels.bin", np.int32, [Bsz, T]).astype(np.int64))

    names = [p["name"] for p in man["params"]]
    shapes = {p["name"]: p["shape"] for p in man["params"]}
    params = {n: torch.from_numpy(load(d, f"param.{n}.bin", np.float32, shapes[n]).astype(np.float64))
              .requires_grad_(True) for n in names}
    model = Decoder(cfg, params)
    failures = []
    ratios = []

    def report(what, a, b, tol):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if PLANT:
            a = a + PLANT * tol * np.max(np.abs(b)) * np.where(b < 0, -1.0, 1.0)
        diff, r = rel(a, b)
        ok = r <= tol
        ratios.append(r / tol if tol > 0 else (0.0 if r == 0 else math.inf))
        print(f"  {what:60s} rel {r:.3e}  bound {tol:.2e}  ratio {ratios[-1]:.3f}  {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(what)

    print(f"[{man['preset']}] {cfg['decoder_block']} V={V} D={cfg['base_emb_dim']} "
          f"H={cfg['base_num_query_heads']}/{cfg['base_num_kv_heads']} Dh={cfg['head_dim']} "
          f"L={cfg['base_num_decoder_layers']} B={Bsz} T={T} tiles={man['num_vocab_tiling']}")

    # the chains (tests/test_bounds.h tu_chain_terms)
    post = int(bool(cfg.get("use_post_attn_norm"))) + int(bool(cfg.get("use_post_ffw_norm")))
    shape = dict(D=cfg["base_emb_dim"], H=cfg["base_num_query_heads"], Hk=cfg["base_num_kv_heads"],
                 Dh=cfg["head_dim"], F=cfg["base_mlp_dim"], V=V, L=cfg["base_num_decoder_layers"], T=T,
                 qk_norm=bool(cfg.get("use_qk_norm")), post_norms=post, attn_cap=cfg["attn_logits_soft_cap"] > 0,
                 final_cap=cfg["final_logits_soft_cap"] > 0)
    S_logit = bounds.chain_terms(**shape)
    S_loss = S_logit + V + 2
    S_grad = bounds.chain_terms(**shape, backward=True, N=Bsz * T)

    def evaluate(pp):
        """logits, loss and gradients (float64) at parameters pp (a dict of leaves)."""
        mdl = Decoder(cfg, pp)
        with torch.no_grad():
            zz = mdl.logits(tokens).reshape(Bsz * T, V).numpy()
        ll = mean_loss(mdl, tokens, labels, ignore)
        ll.backward()
        gg = {n: (pp[n].grad if pp[n].grad is not None else torch.zeros_like(pp[n])).numpy().copy() for n in names}
        return zz, ll.item(), gg

    # conditions: every parameter times 1 + eta xi
    pert = {n: (params[n].detach() * (1.0 + bounds.ETA * torch.from_numpy(bounds.signs(shapes[n], 1000 + i))))
            .requires_grad_(True) for i, n in enumerate(names)}
    z1, L1, g1 = evaluate(pert)

    # logits
    with torch.no_grad():
        z = model.logits(tokens).reshape(Bsz * T, V).numpy()
    kz = np.max(np.abs(z1 - z)) / np.max(np.abs(z)) / bounds.ETA
    report("logits", load(d, "logits.bin", np.float32, [Bsz * T, V]), z, bounds.bound(S_logit, kz))

    # loss and gradients
    loss = mean_loss(model, tokens, labels, ignore)
    loss.backward()
    count = int((labels != ignore).sum())
    if count != man["count"]:
        failures.append("count")
        print(f"  labelled tokens: C {man['count']} vs reference {count}  FAIL")
    g0 = {n: (params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).numpy().copy()
          for n in names}
    k_an = math.sqrt(sum(float(np.sum((params[n].detach().numpy() * g0[n]) ** 2)) for n in names)) / abs(loss.item())
    kl = max(k_an, abs(L1 - loss.item()) / abs(loss.item()) / bounds.ETA)
    report("loss", [man["loss"]], [loss.item()], bounds.bound(S_loss, kl))
    kM = {}
    for n in names:
        gmax = float(np.max(np.abs(g0[n])))
        kM[n] = float(np.max(np.abs(g1[n] - g0[n]))) / gmax / bounds.ETA if gmax > 0 else 0.0
        report("grad " + n, load(d, f"grad.{n}.bin", np.float32, shapes[n]), g0[n], bounds.bound(S_grad, kM[n]))

    # 5 AdamW steps from the same initial parameters
    opt_cfg = man["adamw"]
    for n in names:
        params[n].grad = None
    groups = [
        {"params": [params[p["name"]] for p in man["params"] if p["weight_decay"]],
         "weight_decay": opt_cfg["weight_decay"]},
        {"params": [params[p["name"]] for p in man["params"] if not p["weight_decay"]], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=opt_cfg["lr"], betas=(opt_cfg["b1"], opt_cfg["b2"]), eps=opt_cfg["eps"])
    # The bound of each step's loss, built along the run: its chain, plus the loss's
    # response g . dp to the parameter difference dp the earlier steps leave; the
    # elements' differences come from independent roundings (different sums), so the
    # signed sum adds in quadrature: lambda sqrt(sum (g dp)^2) (the model of bounds.py).
    # A step-m gradient element moves by at most
    # D = lambda sqrt(m S) u kappa max|g| (its tensor's rounding) + 2 max|r| (the
    # response r = g(p + xi dp) - g(p) of the gradient to the earlier parameter
    # difference, evaluated here in float64 with random signs xi; 2: one draw), the
    # direction by bounds.adam_update_diff of the largest D so far, the parameter by lr
    # times that (weight decay shrinks differences: 1 - lr wd <= 1).
    lr, eps, b1, b2 = opt_cfg["lr"], opt_cfg["eps"], opt_cfg["b1"], opt_cfg["b2"]
    dp = {n: np.zeros(shapes[n]) for n in names}
    Dmax = {n: np.zeros(shapes[n]) for n in names}
    v = {n: np.zeros(shapes[n]) for n in names}
    ref_losses, lbounds = [], []
    for m in range(opt_cfg["steps"]):
        opt.zero_grad()
        loss = mean_loss(model, tokens, labels, ignore)
        loss.backward()
        g = {n: (params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).numpy().copy()
             for n in names}
        ref_losses.append(loss.item())
        extra = bounds.LAMBDA * math.sqrt(sum(float(np.sum((g[n] * dp[n]) ** 2)) for n in names)) / abs(loss.item())
        lbounds.append(bounds.bound(S_loss + m * S_grad, kl) + extra)
        r = {n: np.zeros(shapes[n]) for n in names}
        if m > 0:
            shifted = {n: (params[n].detach() + torch.from_numpy(bounds.signs(shapes[n], 2000 + 100 * m + i) * dp[n]))
                       .requires_grad_(True) for i, n in enumerate(names)}
            _, _, gs = evaluate(shifted)
            r = {n: gs[n] - g[n] for n in names}
        C = bounds.adam_factor(b1, b2, m + 1)
        for n in names:
            D = bounds.bound(S_grad * (m + 1), kM[n]) * float(np.max(np.abs(g[n]))) + 2 * float(np.max(np.abs(r[n])))
            Dmax[n] = np.maximum(Dmax[n], D)
            v[n] = b2 * v[n] + (1 - b2) * g[n] ** 2
            sv = np.sqrt(v[n] / (1 - b2 ** (m + 1)))
            dp[n] = dp[n] + lr * bounds.adam_update_diff(Dmax[n], sv, C, eps)
        opt.step()
    c_losses = man["losses"]
    print("  losses C:   " + " ".join(f"{x:.8f}" for x in c_losses))
    print("  losses ref: " + " ".join(f"{x:.8f}" for x in ref_losses))
    for m, (x, y) in enumerate(zip(c_losses, ref_losses)):
        report(f"loss after {m} AdamW steps", [x], [y], lbounds[m])
    # the C side wrote the losses as float32 too: one rounding, 2^-24 relative
    report("losses.bin vs manifest", load(d, "losses.bin", np.float32, [len(c_losses)]), c_losses, 2.0 ** -24)
    print(f"  worst ratio to the bounds {max(ratios):.3g}")

    if failures:
        print(f"[{man['preset']}] FAILED: " + ", ".join(failures))
        return 1
    print(f"[{man['preset']}] all within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
