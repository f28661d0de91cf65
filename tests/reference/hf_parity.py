#!/usr/bin/env python3
"""tests/reference/hf_parity.py: the Hugging Face transformers side of the parity test
(tests/test_hf_parity.sh; meshtrain's side is tests/tools/hf_parity.c).

Runs in the environment made by scripts/setup-hf-venv.sh (pinned there: torch 2.5.1,
transformers 4.57.6, safetensors 0.8.0); the gemma4 family needs transformers 5.17 from
scripts/setup-hf5-overlay.sh first on PYTHONPATH. The models are transformers' own
modelling classes (LlamaForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM, Gemma4ForCausalLM), in float32 with the eager attention
implementation.

  hf_parity.py make ROOT FAMILY...   for each FAMILY (llama3 | gemma | gemma2 | gemma3 |
      gemma3mm, a Gemma3ForConditionalGeneration whose text model meshtrain loads | gemma4):
      a tiny random model saved with save_pretrained (safetensors) to ROOT/FAMILY/hf;
      tokens and next-token labels (int32, -1 = ignored) to ROOT/FAMILY/mt/{tokens,
      labels}.bin; the reference outputs to ROOT/FAMILY/ref: logits.bin (float32
      [B*T, V]), loss.bin (float64 [sum, count]) and grad.<name>.bin (float32,
      gradient of the mean loss). Prints "B T TILES" for the C tool.
  hf_parity.py check ROOT FAMILY...  for each FAMILY: compare ROOT/FAMILY/mt (written by
      `hf_parity run`) with ROOT/FAMILY/ref and print the largest differences; then
      from_pretrained(ROOT/FAMILY/mt/ckpt) (meshtrain's checkpoint) with no missing,
      unexpected or mismatched keys and save_pretrained to ROOT/FAMILY/rt.
      Exit 1 when any family fails.
(One process per command: importing torch + transformers costs seconds.)

Bounds (fp32 on both sides, the same math in another order): two fp32 evaluations
differ by at most 2 lambda sqrt(S) u kappa (tests/reference/bounds.py, the model of
tests/test_bounds.h: u = 2^-24, S the terms on the compared value's chain from the
family's config, counted at its largest head_dim and MLP width, Gemma 4's per-layer
inputs added; kappa the value's condition, evaluated by `make` on a float64 copy of
the model with every parameter times 1 + eta xi), written to ref/bounds.json:
  logits: max|mt - hf| / max|hf| (a tensor-wide relative error: elementwise relative
      error means nothing for entries near zero), kappa in the same measure;
  loss: the mean's relative difference, kappa at least its first-order expectation
      sqrt(sum (p g)^2) / |L| (one draw may cancel);
  gradients: per parameter, max|mt - hf| / max|hf|, kappa per tensor in that measure.
gemma4 is the worst conditioned (attention scale 1.0 on normed q and k: scores of tens,
a sharp softmax): its kappa is the largest. Old tolerances: 1e-4 (logits, loss) and 1e-3
(gradients), from observed differences. MT_HF_PLANT=x moves meshtrain's values by x
bounds (shows the checks can fail).
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bounds  # noqa: E402

B, T, TILES = 2, 13, 3  # 26 rows in 3 tiles (9, 9, 8); no vocabulary below divisible by 3
PLANT = float(os.environ.get("MT_HF_PLANT", "0"))
IGNORE = -1


def family_config(family):
    """The tiny config of each family: GQA everywhere but gemma (MQA, head_dim 256),
    windows shorter than T, soft-caps small enough to be nonlinear, vocabularies
    (67, 61, 53, 59) that the tile count 3 does not divide."""
    common = dict(rms_norm_eps=1e-6, attention_bias=False, attention_dropout=0.0,
                  max_position_embeddings=4096, use_cache=False,
                  # No pad token: transformers builds nn.Embedding(padding_idx=pad_token_id),
                  # which gives that row no gradient from the input lookup; meshtrain
                  # has no pad token and treats every row alike (reported, not tested).
                  pad_token_id=None, bos_token_id=1, eos_token_id=2)
    if family == "llama3":
        return transformers.LlamaConfig(
            vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
            rope_theta=10000.0, tie_word_embeddings=False, mlp_bias=False,
            # Llama 3.1 scaling with a short original context so that all three
            # frequency bands (kept, blended, divided) occur at head_dim 16.
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
            **{**common, "rms_norm_eps": 1e-5})
    if family == "gemma":
        return transformers.GemmaConfig(
            vocab_size=61, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=256,
            hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
            rope_theta=10000.0, tie_word_embeddings=True, **common)
    if family == "gemma2":
        return transformers.Gemma2Config(
            vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0,
            query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5, tie_word_embeddings=True, **common)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            vocab_size=59, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=256,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=5,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_theta=1000000.0, rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            attn_logit_softcapping=None, final_logit_softcapping=None,
            tie_word_embeddings=True, **common)
    if family == "gemma4":
        # Gemma 4 (transformers 5.x, scripts/setup-hf5-overlay.sh): 7 layers, local
        # (head_dim 16, window 5 < T) and global (global_head_dim 32, proportional RoPE
        # with 4 of 16 frequencies) layers [s, s, f, s, s, f, f] (the last is global
        # anyway), the last 3 sharing K/V with layers 3 (local) and 2 (global) and
        # double-wide (96) MLPs, per-layer inputs of 8, a final soft-cap small enough to
        # bend the logits, vocabulary 71 (3 tiles do not divide it). Scale 1.0 and
        # plain-w norms are the model's own.
        return transformers.Gemma4TextConfig(
            vocab_size=71, vocab_size_per_layer_input=71, hidden_size=32, intermediate_size=48,
            num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            global_head_dim=32, hidden_activation="gelu_pytorch_tanh", sliding_window=5,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2 + ["full_attention"],
            num_kv_shared_layers=3, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
            final_logit_softcapping=1.5, tie_word_embeddings=True,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}},
            **common)
    if family == "gemma4mm":
        # Gemma 4 as published (Gemma4ForConditionalGeneration, model_type gemma4, the
        # text model under text_config and model.language_model.*, tiny vision and audio
        # towers beside it): meshtrain loads the text weights only. The multimodal
        # forward needs a pad token (0, as published): nn.Embedding(padding_idx=0) gives
        # row 0 no lookup gradient, so the inputs avoid token 0 (tokens_and_labels low).
        text = family_config("gemma4").to_dict()
        text["pad_token_id"] = 0
        return transformers.Gemma4Config(
            text_config=text,
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=64),
            audio_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              subsampling_conv_channels=[8, 4], output_proj_dims=16))
    if family == "gemma3mm":
        # Gemma 3 as published (Gemma3ForConditionalGeneration, model_type gemma3, the
        # text model under text_config, a SigLIP vision tower): meshtrain loads the text
        # weights only, and text-only input runs the same decoder.
        text = family_config("gemma3").to_dict()
        return transformers.Gemma3Config(
            text_config=text,
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, image_size=28, patch_size=14),
            mm_tokens_per_image=4, image_token_index=58, boi_token_index=56, eoi_token_index=57)
    raise SystemExit(f"hf_parity.py: unknown family {family!r}")


MODEL_CLASSES = {
    "llama3": "LlamaForCausalLM", "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
    "gemma3mm": "Gemma3ForConditionalGeneration", "gemma4": "Gemma4ForCausalLM",
    "gemma4mm": "Gemma4ForConditionalGeneration",
}
PLAIN_NORMS = ("llama3", "gemma4", "gemma4mm")  # RMSNorm scale w (the others: 1 + w)


def text_name(name):
    """The Gemma3ForCausalLM name of a Gemma3ForConditionalGeneration text parameter."""
    return "model." + name[len("model.language_model."):] if name.startswith("model.language_model.") else name


def randomize(model, family, gen):
    """Weights that put every nonlinearity away from its linear regime: matrices
    N(0, 0.16^2), norm scales moved off their init (Llama and Gemma 4 w = 1 + N(0, 0.2^2);
    Gemma 1-3, whose norms scale by 1 + w, w = N(0, 0.2^2)); Gemma 4's layer_scalar
    buffers U(0.5, 1.5)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim == 2:
                p.copy_(0.16 * noise)
            elif family in PLAIN_NORMS:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen, dtype=torch.float32))


def tokens_and_labels(vocab, gen, low=0):
    tokens = torch.randint(low, vocab, (B, T), generator=gen, dtype=torch.int64)
    labels = torch.empty_like(tokens)
    labels[:, :-1] = tokens[:, 1:]
    labels[:, -1] = torch.randint(0, vocab, (B,), generator=gen)
    labels[0, 3] = IGNORE
    labels[0, T - 1] = IGNORE
    labels[1, 5] = IGNORE
    return tokens, labels


def write(path, array):
    np.ascontiguousarray(array).tofile(path)


def cmd_make(family, root):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed({"llama3": 11, "gemma": 12, "gemma2": 13, "gemma3": 14, "gemma3mm": 15,
                                         "gemma4": 16, "gemma4mm": 17}[family])
    cfg = family_config(family)
    cls = getattr(transformers, MODEL_CLASSES[family])
    model = cls(cfg).to(torch.float32)
    model.config._attn_implementation = "eager"
    randomize(model, family, gen)
    model.eval()
    hf_dir, mt_dir, ref_dir = (os.path.join(root, d) for d in ("hf", "mt", "ref"))
    for d in (mt_dir, ref_dir):
        os.makedirs(d, exist_ok=True)
    model.save_pretrained(hf_dir, safe_serialization=True)
    if family == "gemma4mm":
        add_shared_kv(hf_dir, cfg.get_text_config(), gen)
    # The same weights as transformers shards them (model.safetensors.index.json), and
    # in bfloat16 / float16 next to their exact float32 values: meshtrain must load
    # each pair to bitwise the same parameters (tests/tools/hf_parity same).
    model.save_pretrained(os.path.join(root, "hf_sharded"), safe_serialization=True, max_shard_size="40KB")
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        low = cls(cfg).to(torch.float32)
        low.load_state_dict(model.state_dict())
        low = low.to(dt)
        low.save_pretrained(os.path.join(root, f"hf_{tag}"), safe_serialization=True)
        low.to(torch.float32).save_pretrained(os.path.join(root, f"hf_{tag}_f32"), safe_serialization=True)

    vocab = cfg.get_text_config().vocab_size
    tokens, labels = tokens_and_labels(vocab - 3 if family == "gemma3mm" else vocab, gen,
                                       1 if family == "gemma4mm" else 0)  # no image tokens, no pad token
    write(os.path.join(mt_dir, "tokens.bin"), tokens.numpy().astype("<i4"))
    write(os.path.join(mt_dir, "labels.bin"), labels.numpy().astype("<i4"))

    model.zero_grad(set_to_none=True)
    logits = model(input_ids=tokens, use_cache=False).logits  # [B, T, V], final soft-cap applied
    flat = logits.reshape(B * T, -1)
    loss_sum = torch.nn.functional.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
    count = int((labels != IGNORE).sum())
    (loss_sum / count).backward()
    write(os.path.join(ref_dir, "logits.bin"), flat.detach().numpy().astype("<f4"))
    write(os.path.join(ref_dir, "loss.bin"), np.array([loss_sum.item(), count], dtype="<f8"))
    names = []
    for name, p in model.named_parameters():
        if p.grad is None:  # the vision tower of gemma3mm: no text input reaches it
            continue
        write(os.path.join(ref_dir, f"grad.{text_name(name)}.bin"), p.grad.numpy().astype("<f4"))
        names.append(text_name(name))
    with open(os.path.join(ref_dir, "params.json"), "w") as f:
        json.dump({"family": family, "names": names, "vocab": vocab}, f)
    write_bounds(model, cls, cfg, tokens, labels, count, ref_dir)


def chain_terms(cfg, backward):
    """bounds.chain_terms for a transformers config, at its largest head_dim and MLP
    width (an overcount on the other layers), Gemma 4's per-layer inputs added (their
    projection and norm, 2 x their width + D per layer)."""
    t = cfg.get_text_config()

    def top(name, default=0):
        """the largest value of attribute name over the layers (transformers 5 keeps some
        per layer and refuses the global read)"""
        try:
            return getattr(t, name, default) or default
        except Exception:
            return max(getattr(c, name, default) or default for c in t.per_layer_config)
    D, H, Hk, L, V = t.hidden_size, top("num_attention_heads"), top("num_key_value_heads"), t.num_hidden_layers, \
        t.vocab_size
    Dh = max(top("head_dim") or D // H, top("global_head_dim"))
    F = top("intermediate_size") * (2 if top("use_double_wide_mlp", False) else 1)
    mt = t.model_type
    S = bounds.chain_terms(D, H, Hk, Dh, F, V, L, T, qk_norm=mt in ("gemma3_text", "gemma4_text"),
                           post_norms=2 if mt in ("gemma2", "gemma3_text", "gemma4_text") else 0,
                           attn_cap=bool(getattr(t, "attn_logit_softcapping", None)),
                           final_cap=bool(getattr(t, "final_logit_softcapping", None)), backward=backward, N=B * T)
    return S + L * (2 * (getattr(t, "hidden_size_per_layer_input", 0) or 0) + D if mt == "gemma4_text" else 0)


def write_bounds(model, cls, cfg, tokens, labels, count, ref_dir):
    """ref/bounds.json: the two-sided fp32 bounds of logits, loss and each gradient,
    each with its condition evaluated on float64 copies of model (the docstring)."""
    def run(p_scale):
        m = cls(cfg).to(torch.float64)
        m.load_state_dict({k: v.to(torch.float64) for k, v in model.state_dict().items()})
        m.config._attn_implementation = "eager"
        m.eval()
        with torch.no_grad():
            for i, (name, p) in enumerate(m.named_parameters()):
                if p_scale:
                    p.mul_(1.0 + bounds.ETA * torch.from_numpy(bounds.signs(tuple(p.shape), 3000 + i)))
        lg = m(input_ids=tokens, use_cache=False).logits.reshape(B * T, -1)
        loss = torch.nn.functional.cross_entropy(lg, labels.reshape(-1), ignore_index=IGNORE, reduction="sum") / count
        loss.backward()
        grads = {text_name(n): p.grad.detach().numpy().copy() for n, p in m.named_parameters() if p.grad is not None}
        pg = sum(float(np.sum((p.detach().numpy() * p.grad.numpy()) ** 2))
                 for _, p in m.named_parameters() if p.grad is not None)
        return lg.detach().numpy(), loss.item(), grads, pg
    z0, l0, g0, pg = run(False)
    z1, l1, g1, _ = run(True)
    S_logit, S_grad = chain_terms(cfg, False), chain_terms(cfg, True)
    S_loss = S_logit + cfg.get_text_config().vocab_size + 2
    kz = float(np.max(np.abs(z1 - z0)) / np.max(np.abs(z0))) / bounds.ETA
    kl = max(np.sqrt(pg) / abs(l0), abs(l1 - l0) / abs(l0) / bounds.ETA)
    out = {"S": [S_logit, S_loss, S_grad], "logits": bounds.bound(S_logit, kz, sides=2),
           "loss": bounds.bound(S_loss, kl, sides=2), "grads": {}}
    for n, g in g0.items():
        gm = float(np.max(np.abs(g)))
        k = float(np.max(np.abs(g1[n] - g))) / gm / bounds.ETA if gm > 0 else 0.0
        out["grads"][n] = bounds.bound(S_grad, k, sides=2)
    with open(os.path.join(ref_dir, "bounds.json"), "w") as f:
        json.dump(out, f)


def add_shared_kv(hf_dir, text, gen):
    """The published Gemma 4 files carry k_proj / v_proj / k_norm for the KV-sharing
    layers too (transformers ignores them on load): add random ones to the saved file,
    which meshtrain must ignore as well."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(hf_dir, "model.safetensors")
    tensors = load_file(path)
    L, shared = text.num_hidden_layers, text.num_kv_shared_layers
    for i in range(L - shared, L):
        dh = text.per_layer_config[i].head_dim  # transformers 5.17: head_dim is per layer
        kvd = text.per_layer_config[i].num_key_value_heads * dh
        pre = f"model.language_model.layers.{i}.self_attn."
        tensors[pre + "k_proj.weight"] = torch.randn((kvd, text.hidden_size), generator=gen)
        tensors[pre + "v_proj.weight"] = torch.randn((kvd, text.hidden_size), generator=gen)
        tensors[pre + "k_norm.weight"] = torch.randn((dh,), generator=gen)
    save_file(tensors, path, metadata={"format": "pt"})


def rel(a, b):
    """max|a - b| / max|b| (float64)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    scale = np.max(np.abs(b))
    return float(np.max(np.abs(a - b)) / scale) if scale > 0 else float(np.max(np.abs(a)))


def cmd_compare(root):
    mt_dir, ref_dir = os.path.join(root, "mt"), os.path.join(root, "ref")
    with open(os.path.join(ref_dir, "params.json")) as f:
        meta = json.load(f)
    with open(os.path.join(ref_dir, "bounds.json")) as f:
        bnd = json.load(f)
    family, ok = meta["family"], True
    worst_ratio = 0.0
    hf_logits = np.fromfile(os.path.join(ref_dir, "logits.bin"), dtype="<f4")
    mt_logits = np.fromfile(os.path.join(mt_dir, "logits.bin"), dtype="<f4")
    if hf_logits.shape != mt_logits.shape:
        print(f"FAIL {family}: logits sizes {mt_logits.shape} (meshtrain) vs {hf_logits.shape} (transformers)")
        return 1
    mt_logits = mt_logits + PLANT * bnd["logits"] * np.max(np.abs(hf_logits)) * np.where(hf_logits < 0, -1, 1)
    r_logits = rel(mt_logits, hf_logits)
    hf_loss = np.fromfile(os.path.join(ref_dir, "loss.bin"), dtype="<f8")
    mt_loss = np.fromfile(os.path.join(mt_dir, "loss.bin"), dtype="<f8")
    if hf_loss[1] != mt_loss[1]:
        print(f"FAIL {family}: labelled token counts differ: {mt_loss[1]} vs {hf_loss[1]}")
        ok = False
    hf_mean, mt_mean = hf_loss[0] / hf_loss[1], mt_loss[0] / mt_loss[1]
    mt_mean += PLANT * bnd["loss"] * abs(hf_mean)
    r_loss = abs(mt_mean - hf_mean) / abs(hf_mean)
    worst_grad, worst_name = 0.0, ""
    for name in meta["names"]:
        g_hf = np.fromfile(os.path.join(ref_dir, f"grad.{name}.bin"), dtype="<f4")
        path = os.path.join(mt_dir, f"grad.{name}.bin")
        if not os.path.exists(path):
            print(f"FAIL {family}: meshtrain has no gradient for {name}")
            ok = False
            continue
        g_mt = np.fromfile(path, dtype="<f4")
        if g_mt.shape != g_hf.shape:
            print(f"FAIL {family}: gradient {name} sizes {g_mt.shape} vs {g_hf.shape}")
            ok = False
            continue
        tol = bnd["grads"][text_name(name)]
        g_mt = g_mt + PLANT * tol * np.max(np.abs(g_hf)) * np.where(g_hf < 0, -1, 1)
        r = rel(g_mt, g_hf)
        worst_ratio = max(worst_ratio, r / tol if tol > 0 else (0.0 if r == 0 else np.inf))
        if r > tol:
            print(f"FAIL {family}: gradient {name}: max rel diff {r:.3e} > {tol:.2e}")
            ok = False
        if r >= worst_grad:
            worst_grad, worst_name = r, name
    extra = sorted(f[5:-4] for f in os.listdir(mt_dir) if f.startswith("grad.") and f[5:-4] not in meta["names"])
    if extra:
        print(f"FAIL {family}: meshtrain gradients transformers does not have: {extra}")
        ok = False
    if r_logits > bnd["logits"]:
        print(f"FAIL {family}: logits max rel diff {r_logits:.3e} > {bnd['logits']:.2e}")
        ok = False
    if r_loss > bnd["loss"]:
        print(f"FAIL {family}: loss {mt_mean:.9f} vs {hf_mean:.9f}, rel diff {r_loss:.3e} > {bnd['loss']:.2e}")
        ok = False
    worst_ratio = max(worst_ratio, r_logits / bnd["logits"], r_loss / bnd["loss"])
    print(f"{'ok  ' if ok else 'FAIL'} {family}: loss {hf_mean:.6f}, logits rel {r_logits:.2e} (bound "
          f"{bnd['logits']:.1e}), loss rel {r_loss:.2e} (bound {bnd['loss']:.1e}), worst gradient rel "
          f"{worst_grad:.2e} ({worst_name}), gradient bounds {min(bnd['grads'].values()):.1e} to "
          f"{max(bnd['grads'].values()):.1e}; worst ratio to the bounds {worst_ratio:.3g}; "
          f"transformers {transformers.__version__}, torch {torch.__version__}")
    return 0 if ok else 1


def cmd_roundtrip(src, dst):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        src, output_loading_info=True, dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print(f"FAIL roundtrip: transformers loaded {src} with {bad}")
        return 1
    model.save_pretrained(dst, safe_serialization=True)
    print(f"ok   roundtrip: {type(model).__name__} loaded meshtrain's checkpoint with no missing/unexpected/"
          f"mismatched keys, saved it again")
    return 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "make":
        for fam in argv[3:]:
            cmd_make(fam, os.path.join(argv[2], fam))
        print(B, T, TILES)
        return 0
    if len(argv) >= 4 and argv[1] == "check":
        status = 0
        for fam in argv[3:]:
            d = os.path.join(argv[2], fam)
            if not os.path.exists(os.path.join(d, "mt", "logits.bin")):
                print(f"FAIL {fam}: no meshtrain outputs in {d}/mt")
                status = 1
                continue
            status |= cmd_compare(d)
            status |= cmd_roundtrip(os.path.join(d, "mt", "ckpt"), os.path.join(d, "rt"))
        return status
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
