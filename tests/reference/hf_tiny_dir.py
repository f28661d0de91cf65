#!/usr/bin/env python3
"""tests/reference/hf_tiny_dir.py: a tiny Hugging Face Gemma 2 model directory written
with the Python standard library only (no torch, no transformers), for the CLI tests
tests/test_hf_train.sh and tests/test_cli_hf_bad.sh.

  hf_tiny_dir.py write DIR [bf16|f32] [SHARDS]
      config.json (model_type gemma2, the shape of MODEL_YML below) and the weights:
      model.safetensors when SHARDS is 1 (default), else SHARDS files
      model-0000i-of-0000N.safetensors with model.safetensors.index.json. Values are
      deterministic pseudo-random numbers exactly representable in bfloat16.
  hf_tiny_dir.py yml
      print the meshtrain model file (configs/models/<name>.yml) of the same model.
  hf_tiny_dir.py same CKPT_DIR SRC_DIR
      every tensor of SRC_DIR (any of the layouts above) equals, as float32 values,
      the tensor of the same name in CKPT_DIR/model.safetensors; exit 1 otherwise.
  hf_tiny_dir.py corrupt DIR KIND
      damage DIR/model.safetensors (a single-file directory) in one way:
      truncated, header_long, overlap, out_of_range, unknown_dtype, nan, inf.
      Prints the tensor name the error must mention ("" when the damage is not
      about one tensor).

safetensors layout (huggingface/safetensors, "The format"): u64 little-endian header
length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)}}, data.
"""
import json
import math
import os
import struct
import sys

VOCAB, D, HEADS, KV, HD, MLP, LAYERS = 64, 32, 4, 2, 8, 64, 2
CONFIG = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
    "vocab_size": VOCAB, "hidden_size": D, "intermediate_size": MLP,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
    "head_dim": HD, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "rope_scaling": None,
    "query_pre_attn_scalar": 8, "sliding_window": 4, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "attention_bias": False, "pad_token_id": 0,
    "bos_token_id": 2, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "transformers_version": "4.57.6", "some_future_key": {"ignored": True},
}
MODEL_YML = f"""decoder_block: "gemma2"
vocab_size: {VOCAB}
base_emb_dim: {D}
base_num_query_heads: {HEADS}
base_num_kv_heads: {KV}
head_dim: {HD}
base_mlp_dim: {MLP}
base_num_decoder_layers: {LAYERS}
mlp_activations: ["gelu", "linear"]
normalization_layer_epsilon: 1.0e-6
logits_via_embedding: true
attn_logits_soft_cap: 50.0
final_logits_soft_cap: 30.0
sliding_window_size: 4
sliding_window_pattern: 2
query_pre_attn_scalar: 8
rope_max_timescale: 10000
"""


def tensor_list():
    """(name, shape) of every Gemma 2 parameter, in Hugging Face's names."""
    out = [("model.embed_tokens.weight", [VOCAB, D])]
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [D]),
                (p + "self_attn.q_proj.weight", [HEADS * HD, D]),
                (p + "self_attn.k_proj.weight", [KV * HD, D]),
                (p + "self_attn.v_proj.weight", [KV * HD, D]),
                (p + "self_attn.o_proj.weight", [D, HEADS * HD]),
                (p + "post_attention_layernorm.weight", [D]),
                (p + "pre_feedforward_layernorm.weight", [D]),
                (p + "mlp.gate_proj.weight", [MLP, D]),
                (p + "mlp.up_proj.weight", [MLP, D]),
                (p + "mlp.down_proj.weight", [D, MLP]),
                (p + "post_feedforward_layernorm.weight", [D])]
    out.append(("model.norm.weight", [D]))
    return out


def values(name, n):
    """Deterministic values (LCG seeded by the name), rounded to bfloat16: matrices
    about N(0, 0.15^2)-sized, norm scales about +-0.2."""
    seed = sum((i + 1) * ord(c) for i, c in enumerate(name)) & 0xFFFFFFFF
    out = []
    scale = 0.2 if "norm" in name else 0.15
    for _ in range(n):
        seed = (seed * 1664525 + 1013904223) & 0xFFFFFFFF
        u = seed / 2**32 - 0.5
        bits = struct.unpack("<I", struct.pack("<f", 2 * scale * u * math.sqrt(3)))[0] & 0xFFFF0000
        out.append(struct.unpack("<f", struct.pack("<I", bits))[0])
    return out


def encode(vals, dtype):
    raw = struct.pack("<%df" % len(vals), *vals)
    if dtype == "F32":
        return raw
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))  # top half: bf16


def write_file(path, tensors, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in tensors:
        blob = encode(values(name, math.prod(shape)), dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def cmd_write(d, dtype="bf16", shards=1):
    dtype = {"bf16": "BF16", "f32": "F32"}[dtype]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    ts = tensor_list()
    if shards == 1:
        write_file(os.path.join(d, "model.safetensors"), ts, dtype)
        return
    wmap, per = {}, -(-len(ts) // shards)
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = ts[s * per:(s + 1) * per]
        write_file(os.path.join(d, fname), part, dtype)
        wmap.update({n: fname for n, _ in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f, indent=2)


def read_file(path):
    """{name: (dtype, shape, [float, ...])} of a safetensors file (F32 / BF16)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[base + b:base + end]
        if e["dtype"] == "BF16":
            raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        elif e["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {e['dtype']} not handled here")
        out[name] = (e["dtype"], e["shape"], struct.unpack("<%df" % (len(raw) // 4), raw))
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_file(os.path.join(d, "model.safetensors"))
    out = {}
    for fname in sorted(set(json.load(open(idx))["weight_map"].values())):
        out.update(read_file(os.path.join(d, fname)))
    return out


def cmd_same(ckpt, src):
    a, b = read_dir(ckpt), read_dir(src)
    bad = [n for n in b if n not in a or a[n][1] != b[n][1] or a[n][2] != b[n][2]]
    extra = [n for n in a if n not in b]
    if bad or extra:
        print(f"hf_tiny_dir: {ckpt} differs from {src}: different {bad[:4]}, extra {extra[:4]}")
        return 1
    return 0


def cmd_corrupt(d, kind):
    path = os.path.join(d, "model.safetensors")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    victim = names[3]  # model.layers.0.self_attn.k_proj.weight (insertion order)
    e = header[victim]
    if kind == "truncated":  # the last tensor's data cut short
        victim = max(names, key=lambda k: header[k]["data_offsets"][1])
        data = data[:-7]
    elif kind == "header_long":  # header length beyond the end of the file
        data[:8] = struct.pack("<Q", len(data) + 100)
        victim = ""
    elif kind in ("overlap", "out_of_range", "unknown_dtype"):
        if kind == "overlap":  # shift one tensor onto its neighbour, same size
            b, end = e["data_offsets"]
            e["data_offsets"] = [b - 8, end - 8]
        elif kind == "out_of_range":
            b, end = e["data_offsets"]
            e["data_offsets"] = [b + 10**9, end + 10**9]
        else:
            e["dtype"] = "Q4_K"
        hj = json.dumps(header).encode()
        hj += b" " * (-len(hj) % 8)
        data = struct.pack("<Q", len(hj)) + hj + data[8 + n:]
    elif kind in ("nan", "inf"):  # one element of one tensor
        b = e["data_offsets"][0] + 2 * 5  # element 5 (BF16)
        bits = 0x7FC0 if kind == "nan" else 0x7F80
        data[8 + n + b:8 + n + b + 2] = struct.pack("<H", bits)
    else:
        raise SystemExit(f"hf_tiny_dir: unknown damage {kind!r}")
    with open(path, "wb") as f:
        f.write(data)
    print(victim)
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "write":
        cmd_write(argv[2], argv[3] if len(argv) > 3 else "bf16", int(argv[4]) if len(argv) > 4 else 1)
        return 0
    if len(argv) == 2 and argv[1] == "yml":
        sys.stdout.write(MODEL_YML)
        return 0
    if len(argv) == 4 and argv[1] == "same":
        return cmd_same(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "corrupt":
        return cmd_corrupt(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
