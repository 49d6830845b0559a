"""fvattn's operations as torch.library custom ops (namespace `fvattn`), so that torch.compile traces
them as single nodes (fullgraph, no graph breaks) and AOTAutograd differentiates them:

  fvattn::qat_forward, fvattn::qat_backward            QAT attention (fva_qat_forward/backward)
  fvattn::vsa_forward, fvattn::vsa_backward            VSA from indices (fva_vsa_forward/backward)
  fvattn::vsa_layer_forward, fvattn::vsa_layer_backward
                                                       the whole VSA layer (fva_vsa_layer_*)

Each op allocates its outputs (mutates_args=()), has a fake implementation that gives the outputs'
shapes, dtypes and devices without reading tensor data, and the forward ops have autograd formulas
that call the backward ops. Configs cross the op boundary as their fields (floats, ints, bools:
softmax_scale 0.0 means 1/sqrt(D), as in the C configs), because a schema takes no Python objects.
A schema has no optional outputs either: an output that a config leaves out (the QAT forward's o_hp
without high_precision_o, the layer backward's dgate without a gate) is an empty tensor, shape [0].
"""
import torch

from .. import _capi, ops
from ..config import QatConfig, VsaConfig

_NS = "fvattn"


def _absent(like):
    # The stand-in for an output the config leaves out (a schema has no optional outputs).
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _contiguous(grad):
    # Autograd may hand in broadcast (stride-0) or otherwise strided gradients; the library needs
    # the last stride 1, so the backward ops get a dense copy.
    return grad.contiguous()


# ---- QAT attention -------------------------------------------------------------------------------


def _qat_config(softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale, quantize_p_backward,
                high_precision_o, quantized_qkv_backward):
    return QatConfig(softmax_scale=softmax_scale, causal=causal, quantize=quantize, smooth_k=smooth_k,
                     qkv_scale=qkv_scale, p_scale=p_scale, quantize_p_backward=quantize_p_backward,
                     high_precision_o=high_precision_o,
                     quantized_qkv_backward=quantized_qkv_backward)


@torch.library.custom_op(f"{_NS}::qat_forward", mutates_args=())
def qat_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool,
                quantize: bool, smooth_k: bool, qkv_scale: int, p_scale: int,
                quantize_p_backward: bool, high_precision_o: bool, quantized_qkv_backward: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, o_hp, lse) of QAT attention: o like q; o_hp like q when high_precision_o, else empty;
    lse float32 [B, Hq, Sq]. qkv_scale and p_scale are the C codes (0 block, 1 tile, 2 row)."""
    o, o_hp, lse = ops.qat_attention_forward(q, k, v, _qat_config(
        softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale, quantize_p_backward,
        high_precision_o, quantized_qkv_backward))
    return o, (o_hp if o_hp is not None else _absent(q)), lse


@qat_forward.register_fake
def _(q, k, v, softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale, quantize_p_backward,
      high_precision_o, quantized_qkv_backward):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    o_hp = torch.empty(q.shape, dtype=q.dtype, device=q.device) if high_precision_o else _absent(q)
    return o, o_hp, torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)


@torch.library.custom_op(f"{_NS}::qat_backward", mutates_args=())
def qat_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o_for_bwd: torch.Tensor,
                 lse: torch.Tensor, dout: torch.Tensor, softmax_scale: float, causal: bool,
                 quantize: bool, smooth_k: bool, qkv_scale: int, p_scale: int,
                 quantize_p_backward: bool, high_precision_o: bool, quantized_qkv_backward: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of QAT attention: the forward's q, k, v and config, o_for_bwd (its o_hp when
    high_precision_o, else its o), its lse, and dout like q."""
    return ops.qat_attention_backward(q, k, v, o_for_bwd, lse, dout, _qat_config(
        softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale, quantize_p_backward,
        high_precision_o, quantized_qkv_backward))


@qat_backward.register_fake
def _(q, k, v, o_for_bwd, lse, dout, *config):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def _qat_setup_context(ctx, inputs, output):
    q, k, v, *config = inputs
    o, o_hp, lse = output
    high_precision_o = config[7]
    # The backward's Delta uses o_hp when the config keeps it (FastVideo's use_high_prec_o).
    ctx.save_for_backward(q, k, v, o_hp if high_precision_o else o, lse)
    ctx.config = config
    ctx.mark_non_differentiable(o_hp, lse)


def _qat_backward_formula(ctx, dout, _do_hp, _dlse):
    q, k, v, o_for_bwd, lse = ctx.saved_tensors
    dq, dk, dv = qat_backward(q, k, v, o_for_bwd, lse, _contiguous(dout), *ctx.config)
    return (dq, dk, dv) + (None,) * len(ctx.config)


qat_forward.register_autograd(_qat_backward_formula, setup_context=_qat_setup_context)


# ---- VSA from indices ----------------------------------------------------------------------------


@torch.library.custom_op(f"{_NS}::vsa_forward", mutates_args=())
def vsa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k_idx: torch.Tensor,
                q2k_num: torch.Tensor, block_sizes: torch.Tensor, softmax_scale: float,
                block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of VSA block-sparse attention: o like q, lse float32 [B, Hq, Sq] (base 2); the
    metadata int32 (q2k_idx [B, Hq, nq, max_k], q2k_num [B, Hq, nq], block_sizes [nkv])."""
    return ops.vsa_forward(q, k, v, q2k_idx, q2k_num, block_sizes,
                           VsaConfig(softmax_scale=softmax_scale, block_size=block_size))


@vsa_forward.register_fake
def _(q, k, v, q2k_idx, q2k_num, block_sizes, softmax_scale, block_size):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))


@torch.library.custom_op(f"{_NS}::vsa_backward", mutates_args=())
def vsa_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 dout: torch.Tensor, q2k_idx: torch.Tensor, q2k_num: torch.Tensor,
                 block_sizes: torch.Tensor, softmax_scale: float, block_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of VSA: the forward's inputs and config, its o and lse, and dout like q."""
    return ops.vsa_backward(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes,
                            VsaConfig(softmax_scale=softmax_scale, block_size=block_size))


@vsa_backward.register_fake
def _(q, k, v, o, lse, dout, q2k_idx, q2k_num, block_sizes, softmax_scale, block_size):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def _vsa_setup_context(ctx, inputs, output):
    q, k, v, idx, num, bs, softmax_scale, block_size = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, idx, num, bs)
    ctx.config = (softmax_scale, block_size)
    ctx.mark_non_differentiable(lse)


def _vsa_backward_formula(ctx, dout, _dlse):
    q, k, v, o, lse, idx, num, bs = ctx.saved_tensors
    dq, dk, dv = vsa_backward(q, k, v, o, lse, _contiguous(dout), idx, num, bs, *ctx.config)
    return dq, dk, dv, None, None, None, None, None


vsa_forward.register_autograd(_vsa_backward_formula, setup_context=_vsa_setup_context)


# ---- the whole VSA layer -------------------------------------------------------------------------

_DTYPE_CODES = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16,
                torch.float32: _capi.DTYPE_F32}


def _device(t):
    if t.device.type == "cuda":
        return ("cuda", t.device.index if t.device.index is not None else torch.cuda.current_device())
    return ("cpu", -1)


def _reserve_bytes(q, k, v, topk, softmax_scale):
    """The reserve's bytes, from the library's size query on the shapes alone; under symbolic shapes
    (torch.compile's dynamic=True) a new symbolic size, since the library's size is a function of
    concrete shapes only."""
    if any(isinstance(n, torch.SymInt) for x in (q, k, v) for n in x.shape) or isinstance(topk, torch.SymInt):
        return torch.library.get_ctx().new_dynamic_size()
    code = _DTYPE_CODES.get(q.dtype, _capi.DTYPE_F32)
    _, reserve = ops.vsa_layer_sizes(_device(q), code, q.shape, k.shape, v.shape, topk,
                                     softmax_scale)
    return reserve


@torch.library.custom_op(f"{_NS}::vsa_layer_forward", mutates_args=())
def vsa_layer_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None,
                      kv_block_sizes: torch.Tensor, q_block_sizes: torch.Tensor, topk: int,
                      softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, reserve) of the whole VSA layer: out like q; reserve uint8 [the library's reserve
    bytes], what vsa_layer_backward needs. Block sizes int32 on q's device."""
    result = ops.video_sparse_attn(q, k, v, kv_block_sizes, q_block_sizes, topk, gate,
                                   softmax_scale=softmax_scale)
    return result.out, result.reserve


@vsa_layer_forward.register_fake
def _(q, k, v, gate, kv_block_sizes, q_block_sizes, topk, softmax_scale):
    nbytes = _reserve_bytes(q, k, v, topk, softmax_scale)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(nbytes, dtype=torch.uint8, device=q.device))


@torch.library.custom_op(f"{_NS}::vsa_layer_backward", mutates_args=())
def vsa_layer_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None,
                       kv_block_sizes: torch.Tensor, q_block_sizes: torch.Tensor, dout: torch.Tensor,
                       reserve: torch.Tensor, topk: int, softmax_scale: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dgate) of the whole VSA layer from the forward's inputs, config and reserve, and
    dout like q; dgate like the gate, empty without one."""
    dq, dk, dv, dgate = ops.video_sparse_attn_backward(q, k, v, kv_block_sizes, q_block_sizes, topk, dout,
                                                       reserve, gate, softmax_scale=softmax_scale)
    return dq, dk, dv, (dgate if dgate is not None else _absent(q))


@vsa_layer_backward.register_fake
def _(q, k, v, gate, kv_block_sizes, q_block_sizes, dout, reserve, topk, softmax_scale):
    grads = tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device) if gate is not None else _absent(q)
    return grads + (dgate,)


def _layer_setup_context(ctx, inputs, output):
    q, k, v, gate, kv_bs, q_bs, topk, softmax_scale = inputs
    _, reserve = output
    ctx.save_for_backward(q, k, v, gate, kv_bs, q_bs, reserve)
    ctx.config = (topk, softmax_scale)
    ctx.mark_non_differentiable(reserve)


def _layer_backward_formula(ctx, dout, _dreserve):
    q, k, v, gate, kv_bs, q_bs, reserve = ctx.saved_tensors
    dq, dk, dv, dgate = vsa_layer_backward(q, k, v, gate, kv_bs, q_bs, _contiguous(dout), reserve,
                                           *ctx.config)
    # The block sizes, topk and the scale get no gradient (SPEC 3b: the selection is not
    # differentiated).
    return dq, dk, dv, (dgate if gate is not None else None), None, None, None, None


vsa_layer_forward.register_autograd(_layer_backward_formula, setup_context=_layer_setup_context)

OPS = (qat_forward, qat_backward, vsa_forward, vsa_backward, vsa_layer_forward, vsa_layer_backward)
