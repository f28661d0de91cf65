#!/usr/bin/env python3
"""tests/reference/gemma4_param_counts.py: transformers' own figures for the Gemma 4
model files, the source of the constants in tests/test_gemma4_config.c.

Run with the transformers 5.x overlay (scripts/setup-hf5-overlay.sh):
  PYTHONPATH=.venv-hf5-overlay .venv-hf/bin/python tests/reference/gemma4_param_counts.py
For each configs/models/gemma4-*.yml it builds Gemma4ForCausalLM on the meta device
(no memory) from a Gemma4TextConfig with the yml's values and prints
model.num_parameters(), then per layer: head_dim, MLP width and the KV donor
(-1 for a layer with its own K/V), read from the built modules."""
import glob
import os

import torch
import yaml
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def text_config(y):
    L, pattern = y["base_num_decoder_layers"], y["sliding_window_pattern"]
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]
    return Gemma4TextConfig(
        vocab_size=y["vocab_size"], hidden_size=y["base_emb_dim"], intermediate_size=y["base_mlp_dim"],
        num_hidden_layers=L, num_attention_heads=y["base_num_query_heads"],
        num_key_value_heads=y["base_num_kv_heads"], head_dim=y["head_dim"], global_head_dim=y["global_head_dim"],
        layer_types=types, sliding_window=y["sliding_window_size"],
        num_kv_shared_layers=y["num_kv_shared_layers"], use_double_wide_mlp=y["use_double_wide_mlp"],
        hidden_size_per_layer_input=y["per_layer_input_dim"], vocab_size_per_layer_input=y["vocab_size"],
        final_logit_softcapping=float(y["final_logits_soft_cap"]) or None, rms_norm_eps=y["normalization_layer_epsilon"],
        tie_word_embeddings=y["logits_via_embedding"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": float(y["local_rope_max_timescale"])},
            "full_attention": {"rope_type": "proportional", "rope_theta": float(y["rope_max_timescale"]),
                               "partial_rotary_factor": float(y["rope_partial_rotary_factor"])}})


for path in sorted(glob.glob(os.path.join(ROOT, "configs", "models", "gemma4-*.yml"))):
    with open(path) as f:
        y = yaml.safe_load(f)
    with torch.device("meta"):
        model = Gemma4ForCausalLM(text_config(y))
    layers = model.model.layers
    donors = {}
    for i, layer in enumerate(layers):
        if layer.self_attn.store_full_length_kv:
            donors[layer.self_attn.layer_type] = i
    print(os.path.basename(path), "num_parameters", model.num_parameters())
    for i, layer in enumerate(layers):
        a = layer.self_attn
        print(f"  layer {i:2d} {a.layer_type:17s} head_dim {a.head_dim} mlp {layer.mlp.intermediate_size} "
              f"donor {donors[a.layer_type] if a.is_kv_shared_layer else -1}")
