"""PyTorch autograd functions over fvattn, with FastVideo's call shapes, so that a FastVideo user
switches by changing an import:

    from fvattn.torch import attention                       # FastVideo's Attn-QAT `attention`
    o = attention(q, k, v, causal, sm_scale)                 # same positional and keyword arguments
    from fvattn.torch import block_sparse_attn_from_indices  # VSA
    o, lse = block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes)

CUDA tensors run on their device with torch's current stream, CPU tensors on the library's CPU
backend. Backward is the library's (FastVideo's gradients: straight through the quantizers).
Importing this module needs PyTorch; `import fvattn` does not.
"""
import torch

from . import ops
from ._errors import Error
from .config import QatConfig, VsaConfig


class QatAttentionFunction(torch.autograd.Function):
    """o = QAT attention(q, k, v) under a fvattn.QatConfig; backward by fva_qat_backward."""

    @staticmethod
    def forward(ctx, q, k, v, config):
        o, o_hp, lse = ops.qat_attention_forward(q, k, v, config)
        # The backward's Delta uses o_hp when the config keeps it (FastVideo's use_high_prec_o).
        ctx.save_for_backward(q, k, v, o_hp if o_hp is not None else o, lse)
        ctx.config = config
        return o

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o_for_bwd, lse = ctx.saved_tensors
        # Autograd may hand in broadcast (stride-0) or otherwise strided gradients; the library
        # needs the last stride 1, so give it a dense copy.
        dq, dk, dv = ops.qat_attention_backward(q, k, v, o_for_bwd, lse, dout.contiguous(), ctx.config)
        return dq, dk, dv, None


def attention(q, k, v, causal, sm_scale, use_qat_qkv_backward=True, smooth_k=True,
              warp_specialize=True, IS_QAT=True, two_level_quant_P=True, fake_quant_P=True,
              use_high_prec_o=False, smooth_q=False, use_global_sf_P=True, use_global_sf_QKV=True):
    """FastVideo's Attn-QAT `attention` (same arguments and defaults: the kernel's own defaults,
    tile/row scales and smooth_k; its ATTN_QAT_TRAIN backend passes the production preset).
    warp_specialize is a kernel-tuning switch and is ignored; smooth_q is not offered (broken in
    FastVideo, SPEC.md section 2)."""
    del warp_specialize
    if smooth_q:
        raise Error(2, "FVA_ERR_UNSUPPORTED", "smooth_q: not offered (FastVideo's smooth_q is broken, "
                    "docs/SPEC.md section 2)")
    config = QatConfig(
        softmax_scale=sm_scale, causal=bool(causal), quantize=bool(IS_QAT), smooth_k=bool(smooth_k),
        qkv_scale="tile" if use_global_sf_QKV else "block",
        p_scale="row" if two_level_quant_P else "tile" if use_global_sf_P else "block",
        quantize_p_backward=bool(fake_quant_P), high_precision_o=bool(use_high_prec_o),
        quantized_qkv_backward=bool(use_qat_qkv_backward))
    return QatAttentionFunction.apply(q, k, v, config)


def qat_attention(q, k, v, config=None):
    """o = QAT attention under a fvattn.QatConfig (None: FastVideo's production preset)."""
    return QatAttentionFunction.apply(q, k, v, config if config is not None else QatConfig())


def _int32(t):
    # FastVideo passes int32 or int64 metadata (its wrappers convert); the library reads int32.
    return t.to(torch.int32).contiguous()


class VsaFunction(torch.autograd.Function):
    """(o, lse) = VSA block-sparse attention; backward by fva_vsa_backward (lse not differentiable)."""

    @staticmethod
    def forward(ctx, q, k, v, q2k_idx, q2k_num, block_sizes, config):
        idx, num, bs = _int32(q2k_idx), _int32(q2k_num), _int32(block_sizes)
        o, lse = ops.vsa_forward(q, k, v, idx, num, bs, config)
        ctx.save_for_backward(q, k, v, o, lse, idx, num, bs)
        ctx.config = config
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse, idx, num, bs = ctx.saved_tensors
        dq, dk, dv = ops.vsa_backward(q, k, v, o, lse, dout.contiguous(), idx, num, bs, ctx.config)
        return dq, dk, dv, None, None, None, None


def block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, sm_scale=None):
    """FastVideo's VSA entry point: q, k, v [B, H, 64*n, D] (bf16, D 64 or 128), q2k_idx
    [B, H, nq, max_k], q2k_num [B, H, nq], variable_block_sizes [nkv]. Returns (o, lse), lse in
    FastVideo's base-2 "M" format."""
    return VsaFunction.apply(q, k, v, q2k_idx, q2k_num, variable_block_sizes,
                             VsaConfig(softmax_scale=sm_scale))


__all__ = ["attention", "qat_attention", "block_sparse_attn_from_indices", "QatAttentionFunction",
           "VsaFunction"]
