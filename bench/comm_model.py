#!/usr/bin/env python3
"""bench/comm_model.py: the communication cost of multi-GPU layouts on paper
(docs/multi_gpu.md is its output, explained).

Bytes per rank per step are the trainer's own accounting, written out again here from
its formulas: parallel/zero1.h (mt_grad_sync_step_bytes: gradient reduce-scatter,
ZeRO-1 / fsdp all-gather, tensor-group gradient all-reduce), train/step.c
(tensor_model_bytes: the Megatron all-reduces and the vocab-parallel loss; the step's
scalars) and models/model_shard.c (mt_model_fsdp_gather_floats: the fsdp layer all-gathers),
with parallel/comm.h's ring accounting (all-reduce 2 (n-1)/n S, reduce-scatter and
all-gather S_total - S_own, integer divisions as the code does them). Times use
nccl-tests' bus bandwidth (doc/PERFORMANCE.md): for those three collectives the bytes
one rank sends under the ring are exactly busbw x time, so time = bytes / busbw.

  bench/comm_model.py                       the tables of docs/multi_gpu.md (markdown)
  bench/comm_model.py --rate 550e12         ... at another achieved FLOP/s (e.g. the one
                                            bench/gpu_check.sh measures); also --nvlink,
                                            --nic (bytes/s), --peak (FLOP/s)
  bench/comm_model.py --plan BIN            also run `BIN plan` for every case and print
                                            its peak (the memory each case needs) and
                                            parameter count next to this script's
  bench/comm_model.py --estimate BIN        second route for the bytes: `BIN estimate`'s
                                            modelled step (989 TFLOP/s, 50 GB/s, serial)
                                            against this script's at the same constants
  bench/comm_model.py --check BUILD [--np N] third route: run tests/tools/mpi_layout
                                            under mpirun for tiny llamas in the three
                                            layout families and compare every rank's
                                            measured bytes with this script's per-rank
                                            bytes (CPU backend; ~1 min on 2 cores)
The script's cases keep every tensor the tensor axis would communicate to recompute
(out_proj; no sequence or context axis) and use layer windows, so the trainer's
remat-dependent terms (models/model_shard.c mtm_layer_recomputes) and weight windows
(param_window_unit=weight) are not modelled here; --estimate and --check would show a
case that needed them.
Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- the model ----


def read_model(name, path=None):
    """configs/models/<name>.yml: the few keys the byte formulas need (Llama-type
    decoder: no QK-norm, no post-norms; tied when logits_via_embedding)."""
    path = path or os.path.join(ROOT, "configs", "models", name + ".yml")
    kv = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if ":" in line:
                k, v = line.split(":", 1)
                kv[k.strip()] = v.strip().strip('"')
    m = dict(V=int(kv["vocab_size"]), D=int(kv["base_emb_dim"]), H=int(kv["base_num_query_heads"]),
             Hkv=int(kv["base_num_kv_heads"]), Dh=int(kv["head_dim"]), F=int(kv["base_mlp_dim"]),
             L=int(kv["base_num_decoder_layers"]), tied=kv.get("logits_via_embedding", "false") == "true")
    if kv.get("decoder_block", "llama2") != "llama2":
        raise SystemExit("comm_model.py: Llama-type decoders only (decoder_block llama2)")
    return m


def layout_sizes(m):
    """Flat parameter layout (models/model.c): embedding [0, emb), L layer blocks of
    layer_numel, then the tail (final norm, and lm_head when untied)."""
    D, QD, KVD, F = m["D"], m["H"] * m["Dh"], m["Hkv"] * m["Dh"], m["F"]
    layer = 2 * D + 2 * QD * D + 2 * KVD * D + 3 * F * D
    emb = m["V"] * D
    tail = D + (0 if m["tied"] else m["V"] * D)
    return layer, emb, tail, emb + m["L"] * layer + tail


def flops_per_token(m, seq):
    """train/metrics.c mt_flops_per_token: 6 (N - N_emb) + 6 V D + 12 L H Dh T, N_emb the
    embedding and untied lm_head tables (the logits matmul counted once, tied or not)."""
    _, emb, tail, numel = layout_sizes(m)
    n_emb = emb if m["tied"] else 2 * emb
    return 6.0 * (numel - n_emb) + 6.0 * emb + 12.0 * m["L"] * m["H"] * m["Dh"] * seq


# Forward FLOPs per token and layer of recomputing each remat name (train/estimate.c
# recompute_flops), and the names each policy keeps (docs/memory.md).
def recompute_flops(m, seq, kept):
    D, QD, KVD, F = m["D"], m["H"] * m["Dh"], m["Hkv"] * m["Dh"], m["F"]
    cost = dict(query_proj=2 * D * QD, key_proj=2 * D * KVD, value_proj=2 * D * KVD, context=4.0 * seq * QD,
                out_proj=2 * QD * D, mlpwi_0=2 * D * F, mlpwi_1=2 * D * F)
    return m["L"] * sum(c for t, c in cost.items() if t not in kept)


POLICY_KEPT = {
    "minimal_with_context": {"query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1"},
    "minimal": {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1"},
    "save_dot_except_mlp": {"query_proj", "key_proj", "value_proj", "out_proj"},
    "save_qkv_proj": {"query_proj", "key_proj", "value_proj"},
    "full": set(),
}

# ------------------------------------------------------------ the layouts ----


def ar(S, n):
    """parallel/comm.h: bytes one rank sends in an all-reduce of S bytes on n ranks."""
    return 2 * (n - 1) * S // n if n > 1 else 0


def coords(dims, r):
    """parallel/mesh.h: r = ((data * F + fsdp) * C + context) * T + tensor."""
    D, F, C, T = dims
    return dict(tensor=r % T, context=(r // T) % C, fsdp=(r // (T * C)) % F, data=r // (T * C * F))


def vocab_chunked(m, T):
    """Whether num_vocab_chunks auto cuts the vocabulary (models/model.h, under fsdp): no
    tensor axis and V D above the largest layer weight."""
    D, QD, KVD, F = m["D"], m["H"] * m["Dh"], m["Hkv"] * m["Dh"], m["F"]
    return T == 1 and m["V"] * D > max(QD * D, KVD * D, F * D)


def rank_bytes(m, case, r):
    """Bytes world rank r sends in one step, by (collective, group), exactly as
    mt_trainer_step_bytes' formula (which tests/test_mpi_layouts.sh holds equal to the
    measured bytes). Only what the six cases use: context 1, no sequence
    parallelism, grad_dtype float32, gradient_accumulation_reduce once."""
    Dd, F, C, T = case["dims"]
    assert C == 1 and not case.get("sp")
    K, B, S, tiles = case.get("K", 1), case["B"], case["seq"], case.get("tiles", 1)
    layer, emb, tail, numel = layout_sizes(m)
    L = m["L"]
    c = coords(case["dims"], r)
    n = Dd * F * C
    zero1 = case["zero1"] or F > 1
    direct = K <= 1
    window_rs = F > 1 or (zero1 and direct)          # parallel/zero1.h gradient paths
    per_mb = (not direct) and window_rs
    G = 4 * numel
    out = {}
    # data x fsdp x context group (parallel/zero1.h "Bytes per rank per step")
    if n > 1:
        if not zero1:
            out["grad all-reduce | grad"] = ar(G, n)
        else:
            fper = -(-numel // F)
            rep = n // F
            per = -(-fper // rep)
            flo, fhi = min(c["fsdp"] * fper, numel), min((c["fsdp"] + 1) * fper, numel)
            j = c["data"] * C + c["context"]
            lo, hi = min(flo + j * per, fhi), min(flo + (j + 1) * per, fhi)
            own = 4 * (hi - lo)
            out["grad reduce-scatter | grad"] = (K if per_mb else 1) * (G - own)
            ag = (4 * (fhi - flo) if F > 1 else G) - own
            if ag:
                out["param all-gather | " + ("replica" if F > 1 else "grad")] = ag
        out["scalars all-reduce | grad"] = (3 if zero1 else 2) * ar(8, n)
    if T > 1:
        # the tensor group's sum of the (global-layout) gradient before the data reduction
        out["grad all-reduce | tensor"] = (K if per_mb else 1) * ar(G, T)
        # train/step.c tensor_model_bytes: o_proj / down_proj outputs and the two
        # column-parallel input gradients per layer, dh of the loss, per tile the row
        # maxima and the sum-exp / label logits
        N = B * S // C
        ND4 = 4 * N * m["D"]
        act = 4 * L * ar(ND4, T) + ar(ND4, T)
        kt = min(tiles, N)
        for k in range(kt):
            R = (k + 1) * N // kt - k * N // kt
            act += ar(4 * R, T) + ar(16 * R, T)
        out["activation all-reduce | tensor"] = K * act
    if F > 1:
        # models/model_shard.c mt_model_fsdp_gather_floats: the embedding and the tail at the
        # start of every forward, each layer before its forward, and again before its
        # backward for all but the last two layers (their window slots were reused)
        fper = -(-numel // F)
        f = c["fsdp"]

        def own(a, b):
            lo, hi = max(f * fper, a), min(min((f + 1) * fper, numel), b)
            return max(hi - lo, 0)
        tail_off = emb + L * layer
        fl = (emb - own(0, emb)) + (numel - tail_off - own(tail_off, numel))
        # with the vocabulary in chunks (num_vocab_chunks auto: fsdp without a tensor axis,
        # ceil(V D / the largest layer weight) > 1, models/model.h) the chunked loss
        # gathers each unembedding chunk in each of its three passes: twice more
        if vocab_chunked(m, T):
            D = m["D"]
            u0 = 0 if m["tied"] else numel - m["V"] * D
            fl += 2 * (m["V"] * D - own(u0, u0 + m["V"] * D))
        for l in range(L):
            a = emb + l * layer
            w = layer - own(a, a + layer)
            fl += w + (w if l + 2 < L else 0)
        out["param all-gather | fsdp"] = K * 4 * fl
    return out


def avg_bytes(m, case):
    """rank_bytes averaged over the world (fsdp gathers and uneven shards differ by rank)."""
    world = 1
    for d in case["dims"]:
        world *= d
    acc = {}
    step = max(1, world // 64)
    ranks = range(0, world, step)
    for r in ranks:
        for k, v in rank_bytes(m, case, r).items():
            acc[k] = acc.get(k, 0) + v
    return {k: v / len(ranks) for k, v in acc.items()}


def group_nodes(case, group, gpus_per_node=8):
    """Ranks per node of rank 0's `group` and whether it spans nodes (world rank order of
    parallel/mesh.h, nodes of gpus_per_node consecutive ranks)."""
    Dd, F, C, T = case["dims"]
    world = Dd * F * C * T
    c0 = coords(case["dims"], 0)
    fixed = dict(tensor=["data", "fsdp", "context"], fsdp=["data", "context", "tensor"],
                 grad=["tensor"], replica=["fsdp", "tensor"])[group]
    members = [r for r in range(world) if all(coords(case["dims"], r)[a] == c0[a] for a in fixed)]
    nodes = {r // gpus_per_node for r in members}
    return len(members) // len(nodes), len(nodes) > 1


def coll_time(nbytes, case, group, bw):
    """Seconds of one rank's collective bytes on `group`: within a node bytes / busbw;
    across nodes (ring per NIC) g ranks per node use g NICs, so bytes / (g x nic), but
    their NVLink hops still carry (g-1)/g of the bytes; 'flat': every byte at nic."""
    g, spans = group_nodes(case, group)
    if not spans:
        return nbytes / bw["nvlink"], nbytes / bw["nvlink"], "intra"
    ring = max(nbytes / (g * bw["nic"]), nbytes * (g - 1) / g / bw["nvlink"])
    return ring, nbytes / bw["nic"], "inter, %d/node" % g


# -------------------------------------------------------------- the cases ----

def cases(m):
    """The six cases of docs/multi_gpu.md: the same global batch per step in every layout
    of a size (16 sequences of 8192 on 8 GPUs, 128 on 64), one micro-batch."""
    seq = 8192
    return [
        dict(name="(a) ZeRO-1 data 8", dims=(8, 1, 1, 1), zero1=True, B=2, seq=seq, dtype="bfloat16",
             remat="minimal_with_context"),
        dict(name="(b) fsdp 8", dims=(1, 8, 1, 1), zero1=True, B=2, seq=seq, dtype="float32",
             remat="minimal_with_context"),
        dict(name="(c) tensor 2 x data 4", dims=(4, 1, 1, 2), zero1=True, B=4, seq=seq, dtype="float32",
             remat="save_dot_except_mlp"),
        dict(name="(a) ZeRO-1 data 64", dims=(64, 1, 1, 1), zero1=True, B=2, seq=seq, dtype="bfloat16",
             remat="minimal_with_context"),
        dict(name="(b) fsdp 8 x data 8", dims=(8, 8, 1, 1), zero1=True, B=2, seq=seq, dtype="float32",
             remat="minimal_with_context"),
        dict(name="(c) tensor 2 x data 32", dims=(32, 1, 1, 2), zero1=True, B=4, seq=seq, dtype="float32",
             remat="save_dot_except_mlp"),
    ]


def cli_args(case, model="llama3.1-8b"):
    Dd, F, C, T = case["dims"]
    a = ["dataset_path=/none", "model_name=" + model, "num_devices=%d" % (Dd * F * C * T),
         "ici_data_parallelism=%d" % Dd, "ici_fsdp_parallelism=%d" % F, "ici_context_parallelism=%d" % C,
         "ici_tensor_parallelism=%d" % T, "per_device_batch_size=%d" % case["B"],
         "max_target_length=%d" % case["seq"], "dtype=" + case["dtype"], "weight_dtype=float32",
         "remat_policy=" + case["remat"]]
    if case["zero1"] and F == 1:
        a.append("shard_optimizer_over_data=true")
    return a


# --------------------------------------------------------------- the model ----

def step_model(m, case, bw, rate, peak):
    """Compute, communication and step times of one case (docs/multi_gpu.md, "Overlap")."""
    Dd, F, C, T = case["dims"]
    layer, emb, tail, numel = layout_sizes(m)
    L = m["L"]
    tokens = case["B"] * case["seq"] / T                 # per GPU: a tensor pair splits its batch's work
    model_fl = flops_per_token(m, case["seq"]) * tokens
    re_fl = recompute_flops(m, case["seq"], POLICY_KEPT[case["remat"]]) * tokens
    c_fwd, c_bwd = model_fl / 3 / rate, (2 * model_fl / 3 + re_fl) / rate
    comp = c_fwd + c_bwd
    b = avg_bytes(m, case)
    rows = []
    for key, nbytes in sorted(b.items(), key=lambda kv: -kv[1]):
        kind, group = [s.strip() for s in key.split("|")]
        t_ring, t_flat, where = coll_time(nbytes, case, group, bw)
        rows.append(dict(kind=kind, group=group, bytes=nbytes, t=t_ring, t_flat=t_flat, where=where))

    def times(field):
        tot = sum(r[field] for r in rows)
        get = {(r["kind"], r["group"]): r[field] for r in rows}
        # split each collective into the part the schedule can hide and the part it cannot
        gw = get.get(("grad reduce-scatter", "grad"), 0) + get.get(("grad all-reduce", "tensor"), 0)
        # the windows the backward waits for at once: layer 0's last two parameters
        # (v_proj, then input_layernorm: a layer's gradient goes over one parameter at a
        # time, two windows alternating) and the embedding's
        last_two = (m["Hkv"] * m["Dh"] * m["D"] + m["D"] + emb) / numel
        g_ov, g_exposed = gw * (1 - last_two), gw * last_two
        fs = get.get(("param all-gather", "fsdp"), 0)
        un2 = 2 * m["V"] * m["D"] if F > 1 and vocab_chunked(m, T) else 0  # the chunked loss's 2 more
        per_win = fs / (emb + tail + un2 + L * layer + (L - 2) * layer)
        # global window + layer 0 (+ the chunked loss's further lm_head gathers): nothing
        # to hide behind
        fs_first = per_win * (emb + tail + un2 + layer)
        fs_fwd = per_win * (L - 1) * layer
        fs_bwd = per_win * (L - 2) * layer
        serial = comp + tot
        # as scheduled (parallel/comm.h: a blocking NCCL call makes the compute stream wait
        # for it at once): the fsdp layer prefetch hides behind the previous layer, and
        # (overlap_grad_reduce=true; every case here reduce-scatters per window) the layer
        # parameters' reduce-scatters behind the next parameter's backward (parallel/zero1.c
        # mt_grad_sync_window_wait); the tail's, layer 0's last two parameters' and the
        # embedding's are waited for at once, and the tensor all-reduce in the window
        # sink is blocking
        rs = get.get(("grad reduce-scatter", "grad"), 0)
        rs_hidden = rs * (L * layer - m["Hkv"] * m["Dh"] * m["D"] - m["D"]) / numel
        today = (comp + (tot - fs_fwd - fs_bwd - rs_hidden) + max(0, fs_fwd - c_fwd)
                 + max(0, fs_bwd + rs_hidden - c_bwd))
        # full overlap: gradient windows behind the later layers' backward, fsdp gathers
        # behind the layer before; exposed: TP activation all-reduces (the next op needs
        # them), the first fsdp gathers, the last two gradient windows, the optimizer's
        # all-gather and the scalars
        exposed = tot - g_ov - fs_fwd - fs_bwd
        ideal = exposed + max(c_fwd, fs_fwd) + max(c_bwd, fs_bwd + g_ov)
        return tot, serial, today, ideal, exposed
    res = dict(rows=rows, comp=comp, model_fl=model_fl, re_fl=re_fl, bytes=sum(b.values()))
    for field, tag in (("t", ""), ("t_flat", "_flat")):
        tot, serial, today, ideal, exposed = times(field)
        res["comm" + tag] = tot
        res["exposed" + tag] = exposed
        for name, t in (("serial", serial), ("today", today), ("ideal", ideal)):
            res[name + tag] = t
            res["mfu_" + name + tag] = model_fl / (t * peak)
    return res


# ---------------------------------------------------------------- printing ----

def gb(x):
    return "%.2f" % (x / 1e9)


def print_tables(m, bw, rate, peak, plan_bin=None):
    """The tables of docs/multi_gpu.md, in its order."""
    layer, emb, tail, numel = layout_sizes(m)
    print("numel %d (one layer %d, embedding %d, final norm + lm_head %d); FLOPs/token at seq 8192: %.5g" %
          (numel, layer, emb, tail, flops_per_token(m, 8192)))
    print("rates: compute %.0f TFLOP/s achieved (peak %.0f), NVLink busbw %.0f GB/s, NIC %.0f GB/s per GPU\n" %
          (rate / 1e12, peak / 1e12, bw["nvlink"] / 1e9, bw["nic"] / 1e9))
    res = [(c, step_model(m, c, bw, rate, peak)) for c in cases(m)]
    print("| case | per_device_batch_size | dtype | remat_policy | plan peak GiB |")
    print("|---|---:|---|---|---:|")
    for c, _ in res:
        peak_gib = ""
        if plan_bin:
            cmd = [plan_bin, "plan", os.path.join(ROOT, "configs", "base.yml")] + cli_args(c) + ["--json"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                peak_gib = "exit %d: %s" % (p.returncode, p.stderr.strip())
            else:
                d = json.loads(p.stdout)
                assert d["num_params"] == numel, (d["num_params"], numel)
                peak_gib = "%.2f" % (d["peak_bytes"] / 2**30)
        print("| %s | %d | %s | %s | %s |" % (c["name"], c["B"], c["dtype"], c["remat"], peak_gib))
    print("\n| case | collective | group | nodes | GB/rank/step | s |")
    print("|---|---|---|---|---:|---:|")
    for c, r in res:
        for row in r["rows"]:
            if row["bytes"] < 1e6:
                continue
            t = "%.3f" % row["t"] if row["t"] == row["t_flat"] else "%.3f (flat %.3f)" % (row["t"], row["t_flat"])
            print("| %s | %s | %s | %s | %s | %s |" % (c["name"], row["kind"], row["group"], row["where"],
                                                       gb(row["bytes"]), t))
    print("\n| case | GB/rank/step | comm s | compute s | MFU serial | MFU as scheduled | MFU overlapped |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c, r in res:
        comm = "%.3f" % r["comm"] if r["comm"] == r["comm_flat"] else "%.3f (flat %.3f)" % (r["comm"], r["comm_flat"])
        print("| %s | %s | %s | %.3f | %.1f%% | %.1f%% | %.1f%% |" % (
            c["name"], gb(r["bytes"]), comm, r["comp"], 100 * r["mfu_serial"], 100 * r["mfu_today"],
            100 * r["mfu_ideal"]))
    print("\nflat inter-node model (every byte of a cross-node group at the NIC rate), cases that cross:\n")
    print("| case | comm s | MFU serial | MFU as scheduled | MFU overlapped |")
    print("|---|---:|---:|---:|---:|")
    for c, r in res:
        if r["comm_flat"] != r["comm"]:
            print("| %s | %.3f | %.1f%% | %.1f%% | %.1f%% |" % (
                c["name"], r["comm_flat"], 100 * r["mfu_serial_flat"], 100 * r["mfu_today_flat"],
                100 * r["mfu_ideal_flat"]))
    print("\nper GPU per step: model FLOPs, recompute FLOPs, exposed communication when overlapped:\n")
    for c, r in res:
        print("  %-24s model %.4g  recompute %.4g  exposed %.3f s (flat %.3f s)" %
              (c["name"], r["model_fl"], r["re_fl"], r["exposed"], r["exposed_flat"]))


def check_estimator(m, est_bin):
    """`meshtrain estimate` models a step as FLOPs / 989e12 + bytes / 50e9 (serial), its
    bytes rank 0's by the trainer's own formula. Run it with each case's layout, batch
    and policy fixed and compare its collective_bytes with this script's rank 0 bytes
    (the per-rank average beside it: fsdp ranks differ), and its FLOPs with this
    script's model + recompute FLOPs; the step time backed out of both must agree."""
    print("| case | this script rank 0 GB (mean) | estimate's GB | difference | FLOPs difference |")
    print("|---|---:|---:|---|---|")
    keys = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1")
    tmp = tempfile.mkdtemp()
    bad = 0
    try:
        for c in cases(m):
            kept = POLICY_KEPT[c["remat"]]
            args = [a for a in cli_args(c) if not a.startswith("remat_policy=")] + ["remat_policy=custom"]
            args += ["%s=%s" % (k, "device" if k in kept else "remat") for k in keys]
            cmd = [est_bin, "estimate", os.path.join(ROOT, "configs", "base.yml")] + args + [
                "hbm_gib=100000", "--json"]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            if p.returncode != 0:
                print("| %s | | exit %d | %s |" % (c["name"], p.returncode, p.stderr.strip()))
                bad += 1
                continue
            row = json.loads(p.stdout)["rows"][0]
            T = c["dims"][3]
            tokens = c["B"] * c["seq"] / T
            # model FLOPs per device (train/metrics.c) + the recompute on the local (tensor-split) model
            local = dict(m, H=m["H"] // T, Hkv=m["Hkv"] // T, F=m["F"] // T)
            fl = flops_per_token(m, c["seq"]) * tokens + recompute_flops(local, c["seq"], kept) * c["B"] * c["seq"]
            est_bytes = row["collective_bytes"]
            backed = (row["step_s"] - row["flops"] / 989e12) * 50e9
            mine0, mean = sum(rank_bytes(m, c, 0).values()), sum(avg_bytes(m, c).values())
            print("| %s | %s (%s) | %s | %+.2f GB | %+.3g%% |" % (c["name"], gb(mine0), gb(mean), gb(est_bytes),
                  (est_bytes - mine0) / 1e9, 100 * (row["flops"] - fl) / fl))
            bad += (est_bytes != mine0 or abs(backed - est_bytes) > 1e-6 * est_bytes or
                    abs(row["flops"] - fl) > 1e-3 * fl)
    finally:
        shutil.rmtree(tmp)
    return bad


# ------------------------------------------------------------ the MPI check ----

TINY = dict(V=64, D=32, H=4, Hkv=2, Dh=8, F=64, L=4, tied=False)
TINY_LAYOUTS = [  # (name, dims (data, fsdp, context, tensor), zero1, per_device_batch_size)
    ("zero1 data 4", (4, 1, 1, 1), True, 1),
    ("fsdp 4", (1, 4, 1, 1), True, 1),
    ("fsdp 2 x data 2", (2, 2, 1, 1), True, 1),
    ("tensor 2 x data 2", (2, 1, 1, 2), True, 2),
    ("zero1 data 8", (8, 1, 1, 1), True, 1),
    ("fsdp 4 x data 2", (2, 4, 1, 1), True, 1),
    ("tensor 2 x data 4", (4, 1, 1, 2), True, 2),
]


def check_mpi(build, max_np):
    tool = os.path.join(build, "tests", "tools", "mpi_layout")
    if not os.access(tool, os.X_OK):
        raise SystemExit("no %s (build the tests first)" % tool)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
    tmp = tempfile.mkdtemp()
    bad = 0
    try:
        os.makedirs(os.path.join(tmp, "cfg", "models"))
        with open(os.path.join(tmp, "cfg", "models", "tinyl.yml"), "w") as f:
            f.write("decoder_block: llama2\nvocab_size: 64\nbase_emb_dim: 32\nbase_num_query_heads: 4\n"
                    "base_num_kv_heads: 2\nhead_dim: 8\nbase_mlp_dim: 64\nbase_num_decoder_layers: 4\n"
                    'mlp_activations: ["silu", "linear"]\n')
        subprocess.run([tool, "data", os.path.join(tmp, "data")], check=True)
        cfg = os.path.join(tmp, "cfg", "run.yml")
        with open(cfg, "w") as f:
            f.write("model_name: tinyl\ndataset_path: %s\nmax_target_length: 16\nsteps: 3\nlearning_rate: 0.0003\n"
                    "warmup_steps_fraction: 0\neval_interval: 0\nbackend: cpu\nseed: 3\n" % os.path.join(tmp, "data"))
        print("| tiny layout | ranks | measured bytes/step (rank 0 .. n-1) | this script | agree |")
        print("|---|---:|---|---|---|")
        for name, dims, zero1, B in TINY_LAYOUTS:
            np_ = dims[0] * dims[1] * dims[2] * dims[3]
            if np_ > max_np:
                continue
            out = os.path.join(tmp, name.replace(" ", "_"))
            args = ["ici_data_parallelism=%d" % dims[0], "ici_fsdp_parallelism=%d" % dims[1],
                    "ici_context_parallelism=%d" % dims[2], "ici_tensor_parallelism=%d" % dims[3],
                    "per_device_batch_size=%d" % B]
            if zero1 and dims[1] == 1:
                args.append("shard_optimizer_over_data=true")
            p = subprocess.run(["timeout", "300", "mpirun", "--oversubscribe", "-np", str(np_), tool, "run", out, cfg]
                               + args, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                print("| %s | %d | mpirun exit %d: %s | | no |" % (name, np_, p.returncode, p.stderr.strip()[-200:]))
                bad += 1
                continue
            case = dict(dims=dims, zero1=zero1, B=B, seq=16)
            meas, mine = [], []
            for r in range(np_):
                with open(os.path.join(out, "bytes.%d.txt" % r)) as f:
                    steps = [line.split() for line in f if line.strip()]
                meas.append(sorted({int(s[0]) for s in steps}))
                mine.append(sum(rank_bytes(TINY, case, r).values()))
            ok = all(len(ms) == 1 and ms[0] == mi for ms, mi in zip(meas, mine))
            bad += not ok
            print("| %s | %d | %s | %s | %s |" % (name, np_, " ".join("/".join(map(str, ms)) for ms in meas),
                                                 " ".join(map(str, mine)), "yes" if ok else "NO"))
    finally:
        shutil.rmtree(tmp)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--rate", type=float, default=400e12, help="achieved FLOP/s per GPU (default 400e12)")
    ap.add_argument("--peak", type=float, default=989e12, help="dense bf16 peak FLOP/s (default 989e12)")
    ap.add_argument("--nvlink", type=float, default=370e9, help="intra-node busbw, bytes/s (default 370e9)")
    ap.add_argument("--nic", type=float, default=50e9, help="inter-node bytes/s per GPU (default 50e9)")
    ap.add_argument("--plan", metavar="MESHTRAIN", help="also print `meshtrain plan` peaks")
    ap.add_argument("--estimate", metavar="MESHTRAIN", help="compare with `meshtrain estimate`'s step model")
    ap.add_argument("--check", metavar="BUILD_DIR", help="compare with mpi_layout's measured bytes")
    ap.add_argument("--np", type=int, default=8, help="largest world of --check (default 8)")
    a = ap.parse_args()
    for k in ("plan", "estimate", "check"):
        if getattr(a, k):
            setattr(a, k, os.path.abspath(getattr(a, k)))
    m = read_model(a.model)
    if a.check:
        sys.exit(1 if check_mpi(a.check, a.np) else 0)
    if a.estimate:
        sys.exit(1 if check_estimator(m, a.estimate) else 0)
    print_tables(m, dict(nvlink=a.nvlink, nic=a.nic), a.rate, a.peak, a.plan)


if __name__ == "__main__":
    main()
