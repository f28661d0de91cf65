"""Tests of the ctypes binding (python/meshtrain) on a tiny llama model.

References are independent of the library: the loss and its VJP on hidden states in
float64 NumPy; the gradient of the whole model against a directional finite
difference of the loss; the first saved activation against embedding rows.
Run: MESHTRAIN_LIB=build/libmeshtrain.so /usr/bin/python3 -m unittest discover -s python/tests
"""
import os
import shutil
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import meshtrain  # noqa: E402

TINY = """decoder_block: llama2
vocab_size: 64
base_emb_dim: 32
base_num_query_heads: 4
base_num_kv_heads: 2
head_dim: 8
base_mlp_dim: 64
base_num_decoder_layers: 2
mlp_activations: ["silu", "linear"]
rope_max_timescale: 10000
"""


def write_shard(path, toks):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))


class MeshtrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mt_py_")
        os.makedirs(os.path.join(cls.dir, "models"))
        os.makedirs(os.path.join(cls.dir, "data"))
        with open(os.path.join(cls.dir, "models", "tiny.yml"), "w") as f:
            f.write(TINY)
        cls.cfg = os.path.join(cls.dir, "run.yml")
        with open(cls.cfg, "w") as f:
            f.write(f"model_name: tiny\nbase_output_directory: {cls.dir}/out\ndataset_path: {cls.dir}/data\n"
                    "per_device_batch_size: 2\nmax_target_length: 16\nsteps: 20\nlearning_rate: 0.01\n"
                    "num_vocab_tiling: 4\nseed: 5\n")
        rng = np.random.default_rng(0)
        pattern = (np.arange(3000) % 7) * 9 % 64
        noise = rng.integers(0, 64, 3000)
        toks = np.where(rng.random(3000) < 0.1, noise, pattern)
        write_shard(os.path.join(cls.dir, "data", "train_000.bin"), [int(t) for t in toks])
        write_shard(os.path.join(cls.dir, "data", "val_000.bin"), [int(t) for t in toks[:500]])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def session(self, **kw):
        return meshtrain.Session(self.cfg, dataset_path="", **kw)

    def batch(self, seed=1):
        rng = np.random.default_rng(seed)
        tok = rng.integers(0, 64, (2, 16)).astype(np.int32)
        lab = rng.integers(0, 64, (2, 16)).astype(np.int32)
        lab[0, 3] = -1
        return tok, lab

    def test_params_roundtrip_and_shapes(self):
        with self.session() as s:
            self.assertEqual((s.batch, s.seq, s.rows, s.emb_dim, s.vocab_size), (2, 16, 32, 32, 64))
            names = s.param_names()
            self.assertEqual(names[0], "model.embed_tokens.weight")
            self.assertEqual(sum(int(np.prod(s.param_shape(n))) for n in names), s.num_params)
            q = s.param("model.layers.0.self_attn.q_proj.weight")
            self.assertEqual(q.shape, (32, 32))  # [heads * head_dim, d_model]
            new = np.arange(q.size, dtype=np.float32).reshape(q.shape) / 100
            s.set_param("model.layers.0.self_attn.q_proj.weight", new)
            np.testing.assert_array_equal(s.param("model.layers.0.self_attn.q_proj.weight"), new)
            with self.assertRaises(ValueError):
                s.set_param("model.layers.0.self_attn.q_proj.weight", new[:3])
            with self.assertRaises(meshtrain.MeshtrainError) as e:
                s.param("model.nope")
            self.assertIn("model.nope", str(e.exception))
            self.assertEqual(s.config("max_target_length"), "16")

    def test_tiled_loss_matches_numpy(self):
        with self.session() as s:
            tok, lab = self.batch()
            h = s.forward(tok).astype(np.float64)
            W = s.param("lm_head.weight").astype(np.float64)
            y = lab.reshape(-1)
            z = h @ W.T
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            keep = y >= 0
            ref = -np.log(p[keep, y[keep]]).sum()
            onehot = np.zeros_like(p)
            onehot[np.nonzero(keep)[0], y[keep]] = 1.0
            dref = 0.25 * ((p - onehot) * keep[:, None]) @ W
            ls, cnt, dh = s.tiled_loss(h.astype(np.float32), lab, dscale=0.25)
            self.assertEqual(cnt, keep.sum())
            # fp32 logits of 32-term dot products vs float64: ~1e-6 relative per row
            self.assertLess(abs(ls - ref), 1e-5 * abs(ref))
            self.assertLess(np.abs(dh - dref).max(), 1e-5 * np.abs(dref).max())
            ls2, cnt2 = s.loss(tok, lab)
            self.assertEqual(cnt2, cnt)
            self.assertLess(abs(ls2 - ls), 1e-6 * abs(ls))
            # any number of rows, e.g. a single labelled row
            one, c1, _ = s.tiled_loss(h[:1].astype(np.float32), y[:1], grad=False)
            self.assertEqual(c1, 1)
            self.assertAlmostEqual(one, -np.log(p[0, y[0]]), delta=1e-5)
            # the tiled loss's dhidden back through the decoder (backward_hidden) gives
            # forward_backward's gradients: the same ops on the same values
            names = s.param_names()
            s.zero_grads()
            _, _, dh = s.tiled_loss(s.forward(tok), lab, dscale=0.25, add_unembedding_grad=True)
            s.backward_hidden(dh)
            g1 = {n: s.grad(n) for n in names}
            s.zero_grads()
            s.forward_backward(tok, lab, dscale=0.25)
            for n in names:
                g2 = s.grad(n)
                self.assertGreater(np.abs(g2).max(), 0.0, n)
                # fp32; only the order of additions may differ: 1e-6 of the largest entry
                np.testing.assert_allclose(g1[n], g2, rtol=0, atol=1e-6 * np.abs(g2).max(), err_msg=n)
            with self.assertRaises(meshtrain.MeshtrainError) as e:
                s.backward_hidden(dh)  # forward_backward consumed the forward
            self.assertEqual(e.exception.status_name, "invalid input")

    def test_gradient_directional_derivative(self):
        """d/de L(p + e g) at e = 0 equals |g|^2 for g = dL/dp (L = mean loss)."""
        with self.session() as s:
            tok, lab = self.batch(3)
            names = s.param_names()
            s.zero_grads()
            ls, cnt = s.forward_backward(tok, lab, dscale=1.0 / 31)
            self.assertEqual(cnt, 31)
            p0 = {n: s.param(n).astype(np.float64) for n in names}
            g = {n: s.grad(n).astype(np.float64) for n in names}
            gg = sum((g[n] ** 2).sum() for n in names)
            self.assertGreater(gg, 0.0)
            eps = 1e-2 / gg  # a loss change of ~1e-2 nats: fp32 noise ~1e-6, curvature O(eps^2)

            def loss_at(e):
                for n in names:
                    s.set_param(n, (p0[n] + e * g[n]).astype(np.float32))
                a, c = s.loss(tok, lab)
                return a / c
            fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
            # fp32 loss differences of 2e-2 carry ~1e-4 relative noise; 1% bound
            self.assertLess(abs(fd - gg), 1e-2 * gg, f"fd {fd} vs |g|^2 {gg}")

    def test_activation_and_memory(self):
        with self.session() as s:
            tok, _ = self.batch(4)
            h = s.forward(tok)
            E = s.param("model.embed_tokens.weight")
            np.testing.assert_array_equal(s.activation("layers.0.decoder_layer_input"), E[tok.reshape(-1)])
            np.testing.assert_array_equal(s.activation("final_hidden"), h)
            self.assertEqual(s.activation("layers.1.mlpwi_0").shape, (32, 64))
            m = s.memory()
            self.assertEqual(m["num_params"], s.num_params)
            self.assertGreaterEqual(m["total_bytes"]["params"], 4 * s.num_params)
            self.assertLessEqual(sum(m["live_bytes"].values()), m["peak_bytes"])
        full = meshtrain.memory_from_config(self.cfg, dataset_path="")
        self.assertGreaterEqual(full["total_bytes"]["optimizer"], 8 * full["num_params"])

    def test_training_steps_and_checkpoints(self):
        with meshtrain.Session(self.cfg) as s:
            self.assertTrue(s.has_data)
            tok, lab = s.next_batch()
            np.testing.assert_array_equal(lab.reshape(-1)[:-1], tok.reshape(-1)[1:])
            rows = [s.step() for _ in range(15)]
            self.assertEqual(rows[-1]["step"], 15)
            self.assertIsNone(rows[-1]["mfu"])
            self.assertLess(rows[-1]["loss"], rows[0]["loss"] - 0.5)
            ck = s.save_checkpoint()
            self.assertTrue(os.path.exists(os.path.join(ck, "model.safetensors")))
            hf = os.path.join(self.dir, "hf")
            s.save_model(hf)
            h1 = s.forward(tok)
        with meshtrain.Session(self.cfg, load_checkpoint=ck) as r:
            self.assertEqual(r.step_count, 15)
            np.testing.assert_array_equal(r.forward(tok), h1)
        with meshtrain.Session.from_hf(hf, per_device_batch_size=2, max_target_length=16) as r:
            self.assertFalse(r.has_data)
            np.testing.assert_array_equal(r.forward(tok), h1)

    def test_token_ids_dtype_and_range(self):
        # float / bool ids are refused (they were cast to int32 silently: 3.7 -> 3), and
        # ids are range-checked before the int32 cast (an int64 2^32 + 3 wrapped to 3)
        tok, lab = self.batch()
        with self.session() as s:
            h = s.forward(tok)
            np.testing.assert_array_equal(s.forward(tok.astype(np.int64)), h)  # any integer dtype
            np.testing.assert_array_equal(s.forward(tok.astype(np.uint8)), h)
            for bad in (tok.astype(np.float32), tok.astype(np.float64), tok > 3):
                with self.assertRaises(TypeError) as e:
                    s.forward(bad)
                self.assertIn("tokens", str(e.exception))
                self.assertIn(str(bad.dtype), str(e.exception))
            for v in (2**32 + 3, 64, -1):
                t = tok.astype(np.int64)
                t[1, 5] = v
                with self.assertRaises(ValueError) as e:
                    s.forward(t)
                self.assertIn("vocab_size=64", str(e.exception))
                self.assertIn(str(v), str(e.exception))
            with self.assertRaises(TypeError):
                s.loss(tok, lab.astype(np.float32))
            with self.assertRaises(TypeError):
                s.forward_backward(tok.astype(np.float32), lab)
            with self.assertRaises(TypeError):
                s.tiled_loss(h, lab.astype(np.float32))
            big = lab.astype(np.int64)
            big[0, 0] = 2**32 + 5
            with self.assertRaises(ValueError):
                s.tiled_loss(h, big)
            with self.assertRaises(ValueError):
                s.loss(tok, big)
            ls, n, _ = s.tiled_loss(h, lab.astype(np.int64), grad=False)  # -1 stays "ignored"
            self.assertEqual(n, s.rows - 1)
            self.assertEqual(s.loss(tok, lab)[1], s.rows - 1)

    def test_errors_and_misc(self):
        with self.assertRaises(meshtrain.MeshtrainError) as e:
            meshtrain.Session(self.cfg, learning_rate="fast")
        self.assertIn("learning_rate", str(e.exception))
        self.assertEqual(e.exception.status_name, "invalid input")
        self.assertEqual(meshtrain.version(), "0.1.0")
        self.assertEqual(meshtrain.distributed_init(), (0, 1))


if __name__ == "__main__":
    unittest.main()


class ApiListingTest(unittest.TestCase):
    """The module docstring (what help(meshtrain) shows first) lists every public
    function, class, method and property with its exact arguments, and each of them
    has a docstring of its own."""

    @staticmethod
    def _sig(f, drop_self):
        import inspect
        ps = [p for p in inspect.signature(f).parameters.values() if not p.name.startswith("_")]
        if drop_self:
            ps = ps[1:]
        return str(inspect.Signature(ps))

    def test_every_public_name_listed_with_arguments(self):
        import inspect
        import pydoc
        doc = meshtrain.__doc__
        text = pydoc.render_doc(meshtrain, renderer=pydoc.plaintext)
        self.assertIn("API", text)
        missing = []
        for name in meshtrain.__all__:
            obj = getattr(meshtrain, name)
            if inspect.isfunction(obj):
                want = name + self._sig(obj, False)
            elif inspect.isclass(obj):
                want = name + self._sig(obj.__init__, True)
            else:
                want = name
            if want not in doc:
                missing.append(want)
            if callable(obj) and not (obj.__doc__ or "").strip():
                missing.append(name + " (no docstring)")
        for name, member in vars(meshtrain.Session).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                want, f = name, member.fget
            elif isinstance(member, classmethod):
                want, f = "Session." + name + self._sig(member.__func__, True), member.__func__
            else:
                want, f = name + self._sig(member, True), member
            if want not in doc:
                missing.append(want)
            if not (f.__doc__ or "").strip():
                missing.append("Session." + name + " (no docstring)")
        self.assertEqual(missing, [], "not listed in meshtrain's docstring (or undocumented)")
