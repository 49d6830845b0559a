"""The operations of fvattn.h for Python arrays: each describes its inputs, allocates its outputs
and workspace through the inputs' framework, calls the library, and raises fvattn.Error on failure.

JAX arrays go to fvattn.jax instead (the same library calls as XLA custom calls), so XLA keeps
owning their memory and stream.
"""
import ctypes

from . import _capi
from ._call import Call
from ._frameworks import is_jax_array
from .config import Nvfp4Config, QatConfig, VsaConfig


def _jax_inputs(*arrays):
    return any(is_jax_array(a) for a in arrays if a is not None)


def _qat_config(config):
    return (config if config is not None else QatConfig()).to_c()


def _vsa_config(config):
    return (config if config is not None else VsaConfig()).to_c()


def qat_attention_forward(q, k, v, config=None):
    """QAT attention forward (fva_qat_forward). q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D], bf16 or
    f16. Returns (o, o_hp or None, lse): o_hp when config.high_precision_o, lse float32 [B, Hq, Sq]
    (base-2 log-sum-exp of the scaled logits)."""
    if _jax_inputs(q, k, v):
        from .jax import _primitives
        return _primitives.qat_forward(q, k, v, config)
    lib, cfg = _capi.lib(), _qat_config(config)
    c = Call({"q": q, "k": k, "v": v})
    nbytes = c.query(lib.fva_qat_forward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"))
    qs, dt = c.shape("q"), c.dtype("q")
    c.output("o", qs, dt)
    if cfg.high_precision_o:
        c.output("o_hp", qs, dt)
    c.output("lse", qs[:3], _capi.DTYPE_F32)
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_qat_forward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                    c.t("o"), c.t("o_hp"), c.t("lse"), ws, ws_bytes, c.stream))
    return (c.result("o"), c.result("o_hp") if cfg.high_precision_o else None, c.result("lse"))


def qat_attention_backward(q, k, v, o_for_bwd, lse, dout, config=None):
    """QAT attention backward (fva_qat_backward): the forward's q, k, v and config, o_for_bwd (o_hp
    when config.high_precision_o, else o), its lse, and dout. Returns (dq, dk, dv)."""
    if _jax_inputs(q, k, v, o_for_bwd, lse, dout):
        from .jax import _primitives
        return _primitives.qat_backward(q, k, v, o_for_bwd, lse, dout, config)
    lib, cfg = _capi.lib(), _qat_config(config)
    c = Call({"q": q, "k": k, "v": v, "o_for_bwd": o_for_bwd, "lse": lse, "dout": dout})
    nbytes = c.query(lib.fva_qat_backward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"))
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        c.output(g, c.shape(x), c.dtype(x))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_qat_backward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                     c.t("o_for_bwd"), c.t("lse"), c.t("dout"), c.t("dq"), c.t("dk"),
                                     c.t("dv"), ws, ws_bytes, c.stream))
    return c.result("dq"), c.result("dk"), c.result("dv")


def vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes, config=None):
    """VSA block-sparse attention forward (fva_vsa_forward). q [B, Hq, 64*nq, D], k and v
    [B, Hkv, 64*nkv, D] (D 64 or 128), q2k_idx int32 [B, Hq, nq, max_k], q2k_num int32 [B, Hq, nq],
    block_sizes int32 [nkv]. Returns (o, lse)."""
    if _jax_inputs(q, k, v, q2k_idx, q2k_num, block_sizes):
        from .jax import _primitives
        return _primitives.vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes, config)
    lib, cfg = _capi.lib(), _vsa_config(config)
    c = Call({"q": q, "k": k, "v": v, "q2k_idx": q2k_idx, "q2k_num": q2k_num,
              "block_sizes": block_sizes})
    nbytes = c.query(lib.fva_vsa_forward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"),
                     c.t("v"), c.t("q2k_idx"))
    qs = c.shape("q")
    c.output("o", qs, c.dtype("q"))
    c.output("lse", qs[:3], _capi.DTYPE_F32)
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_forward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                    c.t("q2k_idx"), c.t("q2k_num"), c.t("block_sizes"), c.t("o"),
                                    c.t("lse"), ws, ws_bytes, c.stream))
    return c.result("o"), c.result("lse")


def vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, config=None):
    """VSA backward (fva_vsa_backward): the forward's inputs, its o and lse, and dout. Returns
    (dq, dk, dv); kv blocks nobody selects get exactly zero dk and dv."""
    if _jax_inputs(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes):
        from .jax import _primitives
        return _primitives.vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, config)
    lib, cfg = _capi.lib(), _vsa_config(config)
    c = Call({"q": q, "k": k, "v": v, "o": o, "lse": lse, "dout": dout, "q2k_idx": q2k_idx,
              "q2k_num": q2k_num, "block_sizes": block_sizes})
    nbytes = c.query(lib.fva_vsa_backward_workspace_size, ctypes.byref(cfg), c.t("q"), c.t("k"),
                     c.t("v"), c.t("q2k_idx"))
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        c.output(g, c.shape(x), c.dtype(x))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_backward(c.handle, ctypes.byref(cfg), c.t("q"), c.t("k"), c.t("v"),
                                     c.t("o"), c.t("lse"), c.t("dout"), c.t("q2k_idx"),
                                     c.t("q2k_num"), c.t("block_sizes"), c.t("dq"), c.t("dk"),
                                     c.t("dv"), ws, ws_bytes, c.stream))
    return c.result("dq"), c.result("dk"), c.result("dv")


def vsa_invert_indices(q2k_idx, q2k_num, num_kv_blocks):
    """The q->kv block lists inverted (fva_vsa_invert_indices): returns (k2q_idx int32
    [B, H, num_kv_blocks, nq], each row's q blocks ascending and -1 past its count; k2q_num int32
    [B, H, num_kv_blocks])."""
    if _jax_inputs(q2k_idx, q2k_num):
        from .jax import _primitives
        return _primitives.vsa_invert_indices(q2k_idx, q2k_num, num_kv_blocks)
    lib = _capi.lib()
    c = Call({"q2k_idx": q2k_idx, "q2k_num": q2k_num})
    B, H, nq = c.shape("q2k_idx")[:3] if c.desc["q2k_idx"].rank >= 3 else (1, 1, 1)
    c.output("k2q_idx", (B, H, int(num_kv_blocks), nq), _capi.DTYPE_I32)
    c.output("k2q_num", (B, H, int(num_kv_blocks)), _capi.DTYPE_I32)
    nbytes = c.query(lib.fva_vsa_invert_indices_workspace_size, c.t("q2k_idx"), c.t("k2q_idx"))
    ws, ws_bytes = c.workspace(nbytes)
    _capi.check(lib.fva_vsa_invert_indices(c.handle, c.t("q2k_idx"), c.t("q2k_num"), c.t("k2q_idx"),
                                           c.t("k2q_num"), ws, ws_bytes, c.stream))
    return c.result("k2q_idx"), c.result("k2q_num")


def nvfp4_fake_quantize(x, config=None):
    """NVFP4 fake quantization of x [B, H, S, D] (fva_nvfp4_fake_quantize): what QAT attention
    applies to q, k and v. Returns y, like x."""
    lib = _capi.lib()
    cfg = (config if config is not None else Nvfp4Config()).to_c()
    c = Call({"x": x})
    c.output("y", c.shape("x"), c.dtype("x"))
    _capi.check(lib.fva_nvfp4_fake_quantize(c.handle, ctypes.byref(cfg), c.t("x"), c.t("y"), c.stream))
    return c.result("y")
