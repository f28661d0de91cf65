#!/usr/bin/env python3
"""tests/reference/hf_gemma4_config.py: transformers reads a Gemma 4 config.json that
meshtrain wrote as the model of the file it was written from.

  hf_gemma4_config.py ORIGINAL WRITTEN [ORIGINAL WRITTEN ...]

For each pair (ORIGINAL: a config.json transformers wrote, text model nested under
text_config or not; WRITTEN: what meshtrain's mt_hf_config_write made of it, read by
tests/tools/hf_config_check --keep) both are loaded with transformers' own classes
and Gemma4ForCausalLM is built from each text config on the meta device; they must
agree on: the parameter names and shapes, num_parameters(), and per layer the layer
type, sliding window, head_dim, KV groups, MLP width, whether it shares KV and which
layer stores the shared K/V; and on the RoPE inverse frequencies of each layer type
(Gemma4TextRotaryEmbedding built on the CPU), the final soft-cap, the norm epsilon and
the embedding scales. Runs with scripts/setup-hf5-overlay.sh's transformers 5.17.
Exit 1 naming the first difference of each pair."""
import json
import sys

import torch
import transformers
from transformers import Gemma4ForCausalLM
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding


def text_config(path):
    with open(path) as f:
        d = json.load(f)
    cls = transformers.Gemma4Config if d.get("model_type") == "gemma4" else transformers.Gemma4TextConfig
    cfg = cls.from_dict(d)
    return cfg.get_text_config() if cls is transformers.Gemma4Config else cfg


def facts(path):
    cfg = text_config(path)
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = Gemma4ForCausalLM(cfg)
    out = {"shapes": {n: tuple(p.shape) for n, p in model.named_parameters()},
           "num_parameters": model.num_parameters(),
           "final_logit_softcapping": cfg.final_logit_softcapping, "rms_norm_eps": cfg.rms_norm_eps,
           "embed_scale": model.model.embed_tokens.scalar_embed_scale,
           "ple_scale": getattr(model.model, "embed_tokens_per_layer", None) and
           model.model.embed_tokens_per_layer.scalar_embed_scale}
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        out[f"layer {i}"] = (a.layer_type, a.sliding_window, a.head_dim, a.num_key_value_groups, a.scaling,
                             layer.mlp.intermediate_size, a.is_kv_shared_layer, a.store_full_length_kv)
    rope = Gemma4TextRotaryEmbedding(cfg)
    for t in sorted(set(cfg.layer_types)):
        out[f"inv_freq {t}"] = getattr(rope, f"{t}_inv_freq").tolist()
    return out


def main(args):
    if len(args) < 2 or len(args) % 2:
        raise SystemExit("usage: hf_gemma4_config.py ORIGINAL WRITTEN [...]")
    bad = 0
    for orig, written in zip(args[::2], args[1::2]):
        a, b = facts(orig), facts(written)
        diff = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
        if diff:
            k = diff[0]
            va, vb = a.get(k), b.get(k)
            if isinstance(va, dict) and isinstance(vb, dict):  # only the entries that differ
                keys = sorted(set(va) | set(vb))
                va, vb = ({n: d.get(n) for n in keys if va.get(n) != vb.get(n)} for d in (va, vb))
            print(f"FAIL {written}: {k}: {va} (original) vs {vb} (meshtrain's)")
            bad += 1
        else:
            print(f"ok   {written}: transformers {transformers.__version__} reads the same model "
                  f"({a['num_parameters']} parameters, {sum(1 for k in a if k.startswith('layer '))} layers)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
