"""meshtrain: a thin ctypes binding over libmeshtrain's C API (include/meshtrain.h).

    import meshtrain
    with meshtrain.Session("configs/demo.yml", steps=10) as s:
        print(s.step()["loss"])
        tokens, labels = s.next_batch()
        hidden = s.forward(tokens)                 # float32 [rows, emb_dim]
        w = s.param("lm_head.weight")              # float32 [vocab, emb_dim], a copy

Tensors cross as NumPy arrays (float32 values, int32 token ids), always copies.
Token ids and labels may come in any integer dtype; each is checked to be in
[0, vocab_size) (labels: or -1, ignored) before the int32 cast, and a float or bool
array raises TypeError instead of being truncated.
Every C error raises MeshtrainError carrying the status name and the library's message.

The shared library is found from $MESHTRAIN_LIB (a path to libmeshtrain.so), else
next to this package in a source checkout (build/), else by the loader
(ctypes.util.find_library("meshtrain"), e.g. after `cmake --install`).

API (each C function named is in include/meshtrain.h; ids are int32, tensors float32;
rows = batch x seq; python/tests/test_meshtrain.py checks this list against the code)

Module functions:
  version()                                   library version "major.minor.patch"
  set_verbosity(level)                        0 silent, 1 info, 2 debug (stderr)
  distributed_init()                          (rank, world_size); MPI_COMM_WORLD under mpirun
  memory_from_config(config=None, overrides=None, **kw)
                                              memory plan dict of a config, nothing allocated
  MeshtrainError(status, status_name, message, call)
                                              raised by every failing call
  MEMORY_CATEGORIES                           number of memory-plan categories (8)

Session(config=None, overrides=None, **kw)    one model on one device (mt_session_create);
                                              keys as on the CLI, e.g. steps=10; a context manager
  Session.from_hf(hf_dir, overrides=None, **kw)
                                              from a Hugging Face dir (config.json + safetensors)
  attributes: batch, seq, rows, emb_dim, vocab_size, num_layers, num_params, has_data
  lifetime and configuration:
    close()                                   free the session (also on `with` exit)
    config(key)                               text value of a configuration key
    step_count                                (property) optimizer steps done so far
  the library's own training:
    step()                                    one optimizer step: dict like a metrics.jsonl row
    evaluate()                                (val_loss, val_tokens)
    train()                                   the whole run, like `meshtrain train`
  pieces of a custom step:
    next_batch()                              (tokens, labels) int32 [batch, seq]
    forward(tokens)                           final hidden states [rows, emb_dim]
    loss(tokens, labels)                      (loss_sum, count)
    zero_grads()                              gradients := 0
    forward_backward(tokens, labels, dscale=1.0)
                                              grads += dscale * dloss/dparams; (loss_sum, count)
    backward_hidden(dhidden)                  back-propagate dloss/dhidden [rows, emb_dim]
    tiled_loss(hidden, labels, dscale=1.0, grad=True, add_unembedding_grad=False)
                                              vocab-tiled loss: (loss_sum, count, dhidden)
  parameters, gradients, activations (Hugging Face names; copies):
    param_names()                             names in the model's order
    param_shape(name)                         shape tuple
    param(name)                               float32 array of the parameter
    set_param(name, value)                    overwrite a parameter
    grad(name)                                float32 array of its gradient
    set_grad(name, value)                     overwrite a gradient
    activation(name)                          saved tensor of the last forward, e.g. "layers.1.mlpwi_0"
  memory and checkpoints:
    memory()                                  the session's plan (dict, as memory_from_config)
    save_checkpoint()                         full training checkpoint; returns its directory
    save_model(directory, bf16=False)         Hugging Face directory (model.safetensors + config.json)
    load_model(directory)                     load weights from a Hugging Face directory
"""
import ctypes as C
import ctypes.util
import math
import os

import numpy as np

__all__ = ["Session", "MeshtrainError", "memory_from_config", "version", "set_verbosity",
           "distributed_init", "MEMORY_CATEGORIES"]

MEMORY_CATEGORIES = 8
_NAME_MAX = 96


class MeshtrainError(RuntimeError):
    """A failing meshtrain call: .status (int), .status_name, and the message."""

    def __init__(self, status, status_name, message, call):
        super().__init__(f"{call}: {status_name}: {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


def _find_library():
    env = os.environ.get("MESHTRAIN_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "build", "libmeshtrain.so"),
                 os.path.join(here, "..", "..", "lib", "libmeshtrain.so")):
        if os.path.exists(cand):
            return os.path.abspath(cand)
    found = ctypes.util.find_library("meshtrain")
    if found:
        return found
    raise OSError("libmeshtrain.so not found: set MESHTRAIN_LIB to its path")


class _TensorInfo(C.Structure):
    _fields_ = [("name", C.c_char * _NAME_MAX), ("ndim", C.c_int), ("shape", C.c_int64 * 2),
                ("numel", C.c_int64)]


class _SessionInfo(C.Structure):
    _fields_ = [("batch", C.c_int64), ("seq", C.c_int64), ("rows", C.c_int64), ("emb_dim", C.c_int64),
                ("vocab_size", C.c_int64), ("num_layers", C.c_int64), ("num_params", C.c_int64),
                ("num_tensors", C.c_int64), ("step", C.c_int64), ("has_data", C.c_int)]


class _StepResult(C.Structure):
    _fields_ = [("step", C.c_int64), ("loss", C.c_double), ("lr", C.c_double), ("grad_norm", C.c_double),
                ("tokens", C.c_int64), ("tokens_per_s", C.c_double), ("step_ms", C.c_double),
                ("mfu", C.c_double), ("bytes_communicated", C.c_uint64)]


class _MemoryPlan(C.Structure):
    _fields_ = [("peak_bytes", C.c_size_t), ("live_bytes", C.c_size_t * MEMORY_CATEGORIES),
                ("total_bytes", C.c_size_t * MEMORY_CATEGORIES), ("peak_phase", C.c_int),
                ("num_entries", C.c_int), ("num_params", C.c_int64)]


_P = C.c_void_p
_F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
_lib = C.CDLL(_find_library())

# (name, argtypes); every function returns mt_status (int) unless listed in _OTHER.
_SIGS = {
    "mt_set_verbosity": [C.c_int],
    "mt_distributed_init": [_P, C.POINTER(C.c_int), C.POINTER(C.c_int)],
    "mt_session_create": [C.POINTER(_P), C.c_char_p, C.c_int, C.POINTER(C.c_char_p)],
    "mt_session_create_hf": [C.POINTER(_P), C.c_char_p, C.c_int, C.POINTER(C.c_char_p)],
    "mt_session_get_info": [_P, C.POINTER(_SessionInfo)],
    "mt_session_config_get": [_P, C.c_char_p, C.c_char_p, C.c_size_t],
    "mt_session_step": [_P, C.POINTER(_StepResult)],
    "mt_session_evaluate": [_P, C.POINTER(C.c_double), C.POINTER(C.c_int64)],
    "mt_session_train": [_P],
    "mt_session_next_batch": [_P, _I32P, _I32P],
    "mt_session_forward": [_P, _I32P, _F32P],
    "mt_session_loss": [_P, _I32P, _I32P, C.POINTER(C.c_double), C.POINTER(C.c_int64)],
    "mt_session_zero_grads": [_P],
    "mt_session_forward_backward": [_P, _I32P, _I32P, C.c_float, C.POINTER(C.c_double),
                                    C.POINTER(C.c_int64)],
    "mt_session_backward_hidden": [_P, _F32P],
    "mt_session_tiled_loss": [_P, _F32P, _I32P, C.c_int64, C.c_float, _P, C.c_int,
                              C.POINTER(C.c_double), C.POINTER(C.c_int64)],
    "mt_session_param_info": [_P, C.c_int64, C.POINTER(_TensorInfo)],
    "mt_session_param_find": [_P, C.c_char_p, C.POINTER(_TensorInfo)],
    "mt_session_get_param": [_P, C.c_char_p, _F32P, C.c_int64],
    "mt_session_set_param": [_P, C.c_char_p, _F32P, C.c_int64],
    "mt_session_get_grad": [_P, C.c_char_p, _F32P, C.c_int64],
    "mt_session_set_grad": [_P, C.c_char_p, _F32P, C.c_int64],
    "mt_session_activation": [_P, C.c_char_p, _P, C.c_int64, C.POINTER(C.c_int64)],
    "mt_memory_from_config": [C.c_char_p, C.c_int, C.POINTER(C.c_char_p), C.POINTER(_MemoryPlan)],
    "mt_session_memory": [_P, C.POINTER(_MemoryPlan)],
    "mt_session_save_checkpoint": [_P, C.c_char_p, C.c_size_t],
    "mt_session_save_model": [_P, C.c_char_p, C.c_int],
    "mt_session_load_model": [_P, C.c_char_p],
}
for _name, _args in _SIGS.items():
    _f = getattr(_lib, _name)
    _f.argtypes = _args
    _f.restype = C.c_int
_OTHER = {"mt_status_str": ([C.c_int], C.c_char_p), "mt_last_error": ([], C.c_char_p),
          "mt_version": ([], C.c_char_p), "mt_memory_category_name": ([C.c_int], C.c_char_p),
          "mt_session_free": ([_P], None)}
for _name, (_args, _res) in _OTHER.items():
    _f = getattr(_lib, _name)
    _f.argtypes = _args
    _f.restype = _res


def _call(name, *args):
    st = getattr(_lib, name)(*args)
    if st != 0:
        raise MeshtrainError(st, _lib.mt_status_str(st).decode(), _lib.mt_last_error().decode(errors="replace"),
                             name)


def _overrides(overrides, kw):
    items = []
    if overrides:
        if isinstance(overrides, dict):
            items += [f"{k}={_fmt(v)}" for k, v in overrides.items()]
        else:
            items += list(overrides)
    items += [f"{k}={_fmt(v)}" for k, v in kw.items()]
    arr = (C.c_char_p * max(1, len(items)))(*[s.encode() for s in items])
    return len(items), arr


def _fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def version():
    """The library version, "major.minor.patch"."""
    return _lib.mt_version().decode()


def set_verbosity(level):
    """0 silent (default), 1 info, 2 debug: the library's log lines on stderr."""
    _call("mt_set_verbosity", int(level))


def distributed_init():
    """(rank, world_size) of this process; under mpirun the library initialises MPI
    itself (MPI_COMM_WORLD). Passing a caller's communicator is C-only
    (mt_distributed_init)."""
    r, w = C.c_int(), C.c_int()
    _call("mt_distributed_init", None, C.byref(r), C.byref(w))
    return r.value, w.value


def _memory_dict(mp):
    names = [_lib.mt_memory_category_name(i).decode() for i in range(MEMORY_CATEGORIES)]
    return {"peak_bytes": mp.peak_bytes, "peak_phase": mp.peak_phase, "num_entries": mp.num_entries,
            "num_params": mp.num_params,
            "live_bytes": {n: mp.live_bytes[i] for i, n in enumerate(names)},
            "total_bytes": {n: mp.total_bytes[i] for i, n in enumerate(names)}}


def memory_from_config(config=None, overrides=None, **kw):
    """The memory plan of a run configuration without allocating: a dict with
    peak_bytes, live_bytes / total_bytes per category, peak_phase, num_params."""
    n, arr = _overrides(overrides, kw)
    mp = _MemoryPlan()
    _call("mt_memory_from_config", config.encode() if config else None, n, arr, C.byref(mp))
    return _memory_dict(mp)


class Session:
    """One model on one device (mt_session). Session(config, overrides, **keys) builds
    it from a config file (None: keys alone); Session.from_hf(dir, **keys) from a
    Hugging Face directory. Keys are the CLI's (MaxText names), e.g. steps=10."""

    def __init__(self, config=None, overrides=None, _hf_dir=None, **kw):
        self._s = _P()
        n, arr = _overrides(overrides, kw)
        if _hf_dir is not None:
            _call("mt_session_create_hf", C.byref(self._s), str(_hf_dir).encode(), n, arr)
        else:
            _call("mt_session_create", C.byref(self._s), str(config).encode() if config else None, n, arr)
        inf = _SessionInfo()
        _call("mt_session_get_info", self._s, C.byref(inf))
        self.batch, self.seq, self.rows = inf.batch, inf.seq, inf.rows
        self.emb_dim, self.vocab_size, self.num_layers = inf.emb_dim, inf.vocab_size, inf.num_layers
        self.num_params, self.has_data = inf.num_params, bool(inf.has_data)
        self._tensors = {}
        for i in range(inf.num_tensors):
            ti = _TensorInfo()
            _call("mt_session_param_info", self._s, i, C.byref(ti))
            shape = (ti.shape[0], ti.shape[1]) if ti.ndim == 2 else (ti.shape[0],)
            self._tensors[ti.name.decode()] = (shape, ti.numel)

    @classmethod
    def from_hf(cls, hf_dir, overrides=None, **kw):
        """A session from a Hugging Face directory hf_dir (config.json and
        model.safetensors, or a sharded index): model keys from config.json, weights
        from the safetensors, run keys from the defaults, then overrides / **kw."""
        return cls(None, overrides, _hf_dir=hf_dir, **kw)

    # -- lifetime --
    def close(self):
        """Free the session's memory (idempotent; also done on `with` exit)."""
        if self._s:
            _lib.mt_session_free(self._s)
            self._s = _P()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- configuration --
    def config(self, key):
        """The text value of configuration key `key`."""
        buf = C.create_string_buffer(4096)
        _call("mt_session_config_get", self._s, key.encode(), buf, len(buf))
        return buf.value.decode()

    @property
    def step_count(self):
        """Optimizer steps done so far (the step a resumed run starts from)."""
        inf = _SessionInfo()
        _call("mt_session_get_info", self._s, C.byref(inf))
        return inf.step

    # -- the library's step --
    def step(self):
        """One optimizer step of the library's trainer; a dict like a metrics.jsonl row
        (mfu None when unknown)."""
        r = _StepResult()
        _call("mt_session_step", self._s, C.byref(r))
        return {"step": r.step, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm, "tokens": r.tokens,
                "tokens_per_s": r.tokens_per_s, "step_ms": r.step_ms,
                "mfu": None if math.isnan(r.mfu) else r.mfu, "bytes_communicated": r.bytes_communicated}

    def evaluate(self):
        """(val_loss, val_tokens) over eval_steps batches of the val split."""
        v, n = C.c_double(), C.c_int64()
        _call("mt_session_evaluate", self._s, C.byref(v), C.byref(n))
        return v.value, n.value

    def train(self):
        """The whole run (steps, evals, metrics.jsonl, checkpoints), like `meshtrain train`."""
        _call("mt_session_train", self._s)

    # -- pieces of a custom step --
    def _ids(self, a, what, labels=False, rows=None):
        """a as int32 C-contiguous [rows] after checking it: an integer dtype (a float
        or bool array raises TypeError rather than being truncated), rows ids
        (self.rows by default), each in [0, vocab_size), or -1 for labels (ignored).
        Checked before the int32 cast, which would wrap an int64 id of 2^32 to 0."""
        a = np.asarray(a)
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{what}: dtype {a.dtype}, expected integer token ids (e.g. int32); "
                            "a float or bool array is not taken as ids")
        a = a.reshape(-1)
        n = self.rows if rows is None else rows
        if a.size != n:
            raise ValueError(f"{what}: {a.size} ids for {n} rows" + (" (batch x seq)" if rows is None else ""))
        bad = (a >= self.vocab_size) | ((a < 0) & (a != -1) if labels else (a < 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what}: id {a[i]} at position {i} is outside [0, vocab_size={self.vocab_size})"
                             + (" and not -1 (ignored)" if labels else ""))
        return np.ascontiguousarray(a, dtype=np.int32)

    def next_batch(self):
        """(tokens, labels): int32 [batch, seq] each, from the session's train reader."""
        t = np.empty(self.rows, np.int32)
        lab = np.empty(self.rows, np.int32)
        _call("mt_session_next_batch", self._s, t, lab)
        return t.reshape(self.batch, self.seq), lab.reshape(self.batch, self.seq)

    def forward(self, tokens):
        """Final hidden states (after the final norm): float32 [rows, emb_dim]. tokens:
        integer ids in [0, vocab_size), rows of them (TypeError for a float array,
        ValueError for an id out of range)."""
        h = np.empty((self.rows, self.emb_dim), np.float32)
        _call("mt_session_forward", self._s, self._ids(tokens, "tokens"), h)
        return h

    def loss(self, tokens, labels):
        """(loss_sum, count): summed cross-entropy over labels != -1 and their count."""
        ls, c = C.c_double(), C.c_int64()
        _call("mt_session_loss", self._s, self._ids(tokens, "tokens"), self._ids(labels, "labels", True),
              C.byref(ls), C.byref(c))
        return ls.value, c.value

    def zero_grads(self):
        """Set every gradient to 0."""
        _call("mt_session_zero_grads", self._s)

    def forward_backward(self, tokens, labels, dscale=1.0):
        """Adds dscale * d(summed loss)/d(params) into the gradients; (loss_sum, count)."""
        ls, c = C.c_double(), C.c_int64()
        _call("mt_session_forward_backward", self._s, self._ids(tokens, "tokens"), self._ids(labels, "labels", True),
              float(dscale), C.byref(ls), C.byref(c))
        return ls.value, c.value

    def backward_hidden(self, dhidden):
        """Adds the gradients of a loss of one's own on the hidden states of the last
        forward(): dhidden [rows, emb_dim] = d(loss)/d(hidden), back-propagated through
        the final norm, the layers and the embedding (not the unembedding). One backward
        per forward (raises MeshtrainError "invalid input" otherwise)."""
        d = np.ascontiguousarray(dhidden, dtype=np.float32).reshape(-1)
        if d.size != self.rows * self.emb_dim:
            raise ValueError("dhidden has %d elements, expected rows x emb_dim = %d"
                             % (d.size, self.rows * self.emb_dim))
        _call("mt_session_backward_hidden", self._s, d)

    def tiled_loss(self, hidden, labels, dscale=1.0, grad=True, add_unembedding_grad=False):
        """Vocab-tiled cross-entropy of hidden [rows, emb_dim] (any rows) against
        labels [rows] with the session's unembedding: (loss_sum, count, dhidden), dhidden
        = dscale * dloss/dhidden (None when grad is False). loss_sum is the SUM of the
        count token losses (labels -1 ignored): the mean is loss_sum / count."""
        h = np.ascontiguousarray(hidden, dtype=np.float32).reshape(-1, self.emb_dim)
        lab = self._ids(labels, "labels", True, rows=h.shape[0])
        dh = np.empty_like(h) if grad else None
        ls, c = C.c_double(), C.c_int64()
        _call("mt_session_tiled_loss", self._s, h, lab, h.shape[0], float(dscale),
              dh.ctypes.data_as(_P) if grad else None, int(bool(add_unembedding_grad)), C.byref(ls), C.byref(c))
        return ls.value, c.value, dh

    # -- parameters and gradients --
    def param_names(self):
        """Hugging Face names of the parameters, in the model's order."""
        return list(self._tensors)

    def param_shape(self, name):
        """Shape tuple of parameter `name`."""
        return self._shape(name)[0]

    def _shape(self, name):
        try:
            return self._tensors[name]
        except KeyError:
            raise MeshtrainError(1, "invalid input", f"the model has no parameter '{name}'", "param") from None

    def _get(self, fn, name):
        shape, n = self._shape(name)
        out = np.empty(n, np.float32)
        _call(fn, self._s, name.encode(), out, n)
        return out.reshape(shape)

    def _set(self, fn, name, value):
        shape, n = self._shape(name)
        v = np.ascontiguousarray(value, dtype=np.float32)
        if v.shape != shape:
            raise ValueError(f"{name}: shape {v.shape}, expected {shape}")
        _call(fn, self._s, name.encode(), v.reshape(-1), n)

    def param(self, name):
        """A copy of parameter `name`: float32, param_shape(name)."""
        return self._get("mt_session_get_param", name)

    def set_param(self, name, value):
        """Overwrite parameter `name` with value (shape param_shape(name))."""
        self._set("mt_session_set_param", name, value)

    def grad(self, name):
        """A copy of the gradient of `name`: float32, param_shape(name)."""
        return self._get("mt_session_get_grad", name)

    def set_grad(self, name, value):
        """Overwrite the gradient of `name` with value (shape param_shape(name))."""
        self._set("mt_session_set_grad", name, value)

    # -- activations --
    def activation(self, name):
        """A tensor saved by the last forward/loss, by its plan name (e.g.
        "layers.1.mlpwi_0"): float32 [rows, features]."""
        n = C.c_int64()
        _call("mt_session_activation", self._s, name.encode(), None, 0, C.byref(n))
        out = np.empty(n.value, np.float32)
        _call("mt_session_activation", self._s, name.encode(), out.ctypes.data_as(_P), n.value, None)
        return out.reshape(self.rows, -1) if n.value % self.rows == 0 else out

    # -- memory, checkpoints --
    def memory(self):
        """The plan the session allocated: dict as memory_from_config returns."""
        mp = _MemoryPlan()
        _call("mt_session_memory", self._s, C.byref(mp))
        return _memory_dict(mp)

    def save_checkpoint(self):
        """Full training checkpoint (resume with load_checkpoint=<returned dir>)."""
        buf = C.create_string_buffer(4096)
        _call("mt_session_save_checkpoint", self._s, buf, len(buf))
        return buf.value.decode()

    def save_model(self, directory, bf16=False):
        """Weights as a Hugging Face directory (model.safetensors + config.json)."""
        _call("mt_session_save_model", self._s, str(directory).encode(), int(bool(bf16)))

    def load_model(self, directory):
        """Load the weights of a Hugging Face directory (model.safetensors) into the session."""
        _call("mt_session_load_model", self._s, str(directory).encode())
