"""Sequence parallelism for fvattn.torch over torch.distributed: Ulysses (DeepSpeed-Ulysses, what
FastVideo's DistributedAttention does) for every operation, and ring attention for plain attention.
The same code runs CPU tensors over the gloo backend and CUDA tensors over NCCL; it mirrors
fvattn.jax.parallel.

Every rank of the process group holds a sequence shard [B, H, S/P, D] of q, k, v (rank i holding
tokens [i S/P, (i + 1) S/P)), P the group's size.

Ulysses (ulysses) runs each attention on whole sequences of a share of the heads: an all-to-all
turns the sequence shards of q, k, v (and the gate) into head shards, the operation runs on them,
and an all-to-all turns its output back into sequence shards. Attention heads are independent, so
the result is the single-process one (bit for bit on the CPU backend). Autograd differentiates
through it (an all-to-all's gradient is the reverse all-to-all).

    import fvattn, fvattn.torch as ft
    from fvattn.torch.distributed import ulysses, ring_attention
    attn = ulysses(ft.qat_attention)                    # group=None: the default process group
    o = attn(q, k, v, fvattn.QatConfig())               # q, k, v, o: [B, H, S/P, D] shards
    o = ulysses(ft.video_sparse_attn)(q, k, v, sizes, sizes, topk, (4, 4, 4), compress_attn_weight=gate)

Requirements: P divides the heads of q and of k, v (GQA: both counts), and each rank's sequence
shard is whole 64-token blocks for VSA (S / P a multiple of 64). With config.smooth_k (K's mean
over (B, H, Skv); FastVideo's `attention` turns it on by default) each rank subtracts the mean of
its own heads, as FastVideo's DistributedAttention does: plain attention's output does not depend on
it, but NVFP4-quantized attention's does, by about the quantization's own noise (relative L2 near
4e-2 from one process where K's channels have a mean of 0.5). For the single-process result of
quantized attention, leave smooth_k off (QatConfig's default).

Ring attention (ring_attention) keeps every head on every rank and passes the k, v shards around
the ring instead (point-to-point send and receive): each rank attends its q shard to each k, v shard
in turn and merges the partial outputs exactly through their lse; the backward passes k, v around
again with their gradients. It serves any head count, for plain attention (config.quantize False:
NVFP4's quantized P depends on the rows' running maximum, which a ring changes), causal too.

Both trace under torch.compile(fullgraph=True) without graph breaks, over the default group and
other groups alike, and give the eager results bit for bit (tested with the aot_eager backend on
CPU tensors over gloo):
  - Ulysses' all-to-alls are torch's functional collectives
    (torch.distributed._functional_collectives.all_to_all_single), nodes of the graph with their
    own autograd formula, around the operation's custom op;
  - ring attention is the custom ops fvattn::ring_forward (o, lse) and fvattn::ring_backward
    (dq, dk, dv), one node each (CUSTOM_OPS), their point-to-point exchanges inside; they take
    the process group by its name (group.group_name) and the config as fvattn::qat_forward's
    arguments. Importing this module registers them.
"""
import dataclasses
import functools

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.distributed_c10d import _get_default_group, _resolve_process_group

from .. import ops
from .._errors import invalid_argument
from ..config import ring_attention_config
from . import _custom_ops, _qat_op_args

__all__ = ["ulysses", "ring_attention", "sequence_to_heads", "heads_to_sequence", "CUSTOM_OPS"]

_NS = "fvattn"


def _size_rank(group):
    return dist.get_world_size(group), dist.get_rank(group)


# ---- Ulysses --------------------------------------------------------------------------------------


def _process_group(group):
    """The process group `group` names (None: the default group)."""
    return _get_default_group() if group is None else group


def _all_to_all(x, group):
    """The all-to-all over dim 0 of x ([P, ...], chunk j to rank j; chunk j of the result from rank
    j), differentiable: its gradient is the same exchange of the output's gradient.

    It is torch's functional collective (torch.distributed._functional_collectives) rather than
    the in-place dist.all_to_all_single in an autograd.Function: the functional op is what a
    torch.compile graph holds (_c10d_functional.all_to_all_single, with a fake and an autograd
    formula of its own), so dynamo traces it as it is, forward and backward, with no rewriting of
    an in-place collective and no autograd.Function to trace, and it runs on any backend's process
    group (gloo's CPU tensors too). A custom op of our own around dist.all_to_all_single would do
    as well, but would hide the exchange from the compiler. Outside compile the functional op
    returns an AsyncCollectiveTensor, which waits for the exchange on first use; wait_tensor
    (differentiable) waits here instead, so that callers get a plain tensor. Under compile the
    result is waited already."""
    out = fc.all_to_all_single(x.contiguous(), None, None, _process_group(group))
    return fc.wait_tensor(out) if isinstance(out, fc.AsyncCollectiveTensor) else out


def _split_heads(x, n, what):
    heads = x.shape[1]
    if heads % n:
        raise invalid_argument(f"ulysses: {what} has {heads} heads, which do not split over the {n} "
                               "ranks of the process group (the group's size must divide every head "
                               "count; ring_attention serves any head count)")
    return heads // n


def sequence_to_heads(x, group=None):
    """[B, H, S/P, ...] sequence shards -> [B, H/P, S, ...] head shards: rank i gets heads
    [i H/P, (i + 1) H/P) of the whole sequence. Differentiable."""
    n, _ = _size_rank(group)
    if n == 1:
        return x
    h = _split_heads(x, n, "a sequence-sharded argument")
    B, s, rest = x.shape[0], x.shape[2], tuple(x.shape[3:])
    # [B, P, H/P, s, ...] -> [P, B, H/P, s, ...]: chunk j (heads of rank j) goes to rank j.
    send = x.reshape((B, n, h, s) + rest).transpose(0, 1)
    recv = _all_to_all(send, group)  # chunk j: rank j's sequence shard of this rank's heads
    return recv.permute((1, 2, 0) + tuple(range(3, recv.dim()))).reshape((B, h, n * s) + rest)


def heads_to_sequence(x, group=None):
    """The inverse of sequence_to_heads: [B, H/P, S, ...] head shards -> [B, H, S/P, ...].
    Differentiable."""
    n, _ = _size_rank(group)
    if n == 1:
        return x
    B, h, S, rest = x.shape[0], x.shape[1], x.shape[2], tuple(x.shape[3:])
    if S % n:
        raise invalid_argument(f"ulysses: the output's sequence length {S} does not split over the "
                               f"{n} ranks of the process group")
    s = S // n
    # [B, h, P, s, ...] -> [P, B, h, s, ...]: sequence shard j goes to rank j.
    send = x.reshape((B, h, n, s) + rest).permute((2, 0, 1) + tuple(range(3, x.dim() + 1)))
    recv = _all_to_all(send, group)  # chunk j: rank j's heads of this rank's sequence shard
    return recv.transpose(0, 1).reshape((B, n * h, s) + rest)


def _head_slice(x, group, what):
    """This rank's share of the heads (dim 1) of an argument every rank holds whole."""
    n, me = _size_rank(group)
    share = _split_heads(x, n, what)
    return x[:, me * share:(me + 1) * share]


def _known_layouts():
    """The sequence-sharded and per-head arguments of fvattn.torch's operations: (seq_args,
    head_args, seq_kwargs) by function."""
    from . import (attention, block_sparse_attn_from_indices, qat_attention, video_sparse_attn)
    return {
        attention: ((0, 1, 2), (), ()),
        qat_attention: ((0, 1, 2), (), ()),
        # q2k_idx [B, H, nq, k] and q2k_num [B, H, nq]: every rank holds them whole.
        block_sparse_attn_from_indices: ((0, 1, 2), (3, 4), ()),
        # the gate (compress_attn_weight), positional argument 7 or keyword: like q.
        video_sparse_attn: ((0, 1, 2, 7), (), ("compress_attn_weight",)),
    }


def ulysses(fn, group=None, *, seq_args=None, head_args=None, seq_kwargs=None):
    """fn, an fvattn.torch operation over [B, H, S, D] tensors (or a function of them), wrapped to
    run on sequence shards over the process group `group` (None: the default group) of P ranks:
      - the positional arguments at seq_args and the keyword arguments named in seq_kwargs are
        sequence shards [B, H, S/P, ...], turned into head shards of the whole sequence;
      - the positional arguments at head_args are per-head metadata every rank holds whole
        ([B, H, ...], e.g. block_sparse_attn_from_indices' q2k_idx and q2k_num: head_args=(3, 4)),
        cut to the rank's heads;
      - every other argument passes as it is (block sizes, topk, configs: the same for every head).
    An index past the call's arguments, or an argument that is None, is skipped. Left None,
    seq_args, head_args and seq_kwargs are fn's own for the operations of fvattn.torch (q, k, v;
    block_sparse_attn_from_indices' lists; video_sparse_attn's gate) and q, k, v otherwise.
    Returns fn's output (a tensor, or a tuple such as (o, lse)) with every tensor's sequence
    (dim 2) sharded again: [B, H, S/P, ...]."""
    known = _known_layouts().get(fn, ((0, 1, 2), (), ()))
    seq_args = tuple(known[0] if seq_args is None else seq_args)
    head_args = tuple(known[1] if head_args is None else head_args)
    seq_kwargs = tuple(known[2] if seq_kwargs is None else seq_kwargs)

    @functools.wraps(fn)
    def sharded(*args, **kwargs):
        args = list(args)
        for i in seq_args:
            if i < len(args) and args[i] is not None:
                args[i] = sequence_to_heads(args[i], group)
        for i in head_args:
            if i < len(args) and args[i] is not None:
                args[i] = _head_slice(args[i], group, f"argument {i}")
        for name in seq_kwargs:
            if kwargs.get(name) is not None:
                kwargs[name] = sequence_to_heads(kwargs[name], group)
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return heads_to_sequence(out, group)
        items = [heads_to_sequence(t, group) if isinstance(t, torch.Tensor) and t.dim() >= 3 else t
                 for t in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)

    return sharded


# ---- ring attention -------------------------------------------------------------------------------


def _merge(o1, l1, o2, l2):
    """Two partial attentions of the same rows over disjoint keys (o [B, H, S, D], lse [B, H, S]
    base 2, -inf for rows that saw no key) as one, in fp32."""
    m = torch.maximum(l1, l2)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp2(l1 - safe), torch.exp2(l2 - safe)
    total = w1 + w2
    seen = total > 0
    denom = torch.where(seen, total, torch.ones_like(total))
    o = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / denom[..., None]
    o = torch.where(seen[..., None], o, torch.zeros_like(o))
    lse = torch.where(seen, safe + torch.log2(denom), torch.full_like(total, float("-inf")))
    return o, lse


class _Ring:
    """The ring of the process group named `group_name`: rank i sends to i + 1 and receives from
    i - 1 (mod P)."""

    def __init__(self, group_name):
        self.group = _resolve_process_group(group_name)
        self.n, self.me = _size_rank(self.group)
        self.next, self.prev = (dist.get_global_rank(self.group, (self.me + step) % self.n)
                                for step in (1, -1))

    def shift(self, *tensors, tag=0):
        """Starts sending each tensor to the next rank and receiving the previous rank's into a new
        buffer; returns (buffers, wait), wait() completing the exchange. The tensors get tags from
        `tag` on, so that exchanges in flight together (k, v and the gradients of the previous
        shard) never match each other's messages."""
        ops_, bufs = [], []
        for i, t in enumerate(tensors):
            t = t.contiguous()
            buf = torch.empty_like(t)
            ops_.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops_.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            bufs.append(buf)
        reqs = dist.batch_isend_irecv(ops_)

        def wait():
            for r in reqs:
                r.wait()
            return bufs

        return bufs, wait


def _step_config(cfgs, causal, src, me):
    """The C config for q shard `me` against k, v shard `src`, or None where causality hides it:
    earlier shards are seen whole, the own shard through the causal mask (equal lengths, so the
    library's mask is the diagonal one), later shards not at all."""
    full, diag = cfgs
    if not causal:
        return full
    return diag if src == me else full if src < me else None


# The ring's forward and backward are torch.library custom ops, so that torch.compile traces
# ring_attention as single nodes (fullgraph, no graph breaks) while the point-to-point exchanges run
# inside them, out of dynamo's sight. The process group crosses the op boundary as its name (a
# schema takes no Python objects), the config as its fields (fvattn::qat_forward's arguments).


def _ring_config(config):
    """The ring's QatConfig from the ops' config arguments, checked as ring_attention checks it."""
    return ring_attention_config(_custom_ops._qat_config(*config))


def _step_configs(cfg):
    """The configs of the ring's steps: a whole shard and the own (diagonal) one."""
    return (dataclasses.replace(cfg, causal=False, high_precision_o=False),
            dataclasses.replace(cfg, causal=True, high_precision_o=False))


@torch.library.custom_op(f"{_NS}::ring_forward", mutates_args=())
def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group_name: str,
                 softmax_scale: float, causal: bool, quantize: bool, smooth_k: bool, qkv_scale: int,
                 p_scale: int, quantize_p_backward: bool, high_precision_o: bool,
                 quantized_qkv_backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of ring attention over the process group named group_name: o like q, this rank's
    shard of the output; lse float32 [B, Hq, S/P] (base 2) over every rank's keys. The config
    arguments are fvattn::qat_forward's (quantize and smooth_k False)."""
    cfg = _ring_config((softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale,
                        quantize_p_backward, high_precision_o, quantized_qkv_backward))
    ring = _Ring(group_name)
    cfgs = _step_configs(cfg)
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    kc, vc = k.contiguous(), v.contiguous()
    for r in range(ring.n):
        wait = None
        if r + 1 < ring.n:  # the next k, v shard travels while this one is attended
            _, wait = ring.shift(kc, vc)
        step = _step_config(cfgs, cfg.causal, (ring.me - r) % ring.n, ring.me)
        if step is not None:
            o_r, _, l_r = ops.qat_attention_forward(q, kc, vc, step)
            o, lse = _merge(o, lse, o_r, l_r)
        if wait is not None:
            kc, vc = wait()
    return o.to(q.dtype), lse


@ring_forward.register_fake
def _(q, k, v, group_name, *config):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))


@torch.library.custom_op(f"{_NS}::ring_backward", mutates_args=())
def ring_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, dout: torch.Tensor, group_name: str, softmax_scale: float,
                  causal: bool, quantize: bool, smooth_k: bool, qkv_scale: int, p_scale: int,
                  quantize_p_backward: bool, high_precision_o: bool, quantized_qkv_backward: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ring attention: the forward's shards, group and config, its o and lse, and
    dout like q. k and v go around the ring again, their gradients with them."""
    cfg = _ring_config((softmax_scale, causal, quantize, smooth_k, qkv_scale, p_scale,
                        quantize_p_backward, high_precision_o, quantized_qkv_backward))
    ring = _Ring(group_name)
    cfgs = _step_configs(cfg)
    dout = dout.to(q.dtype).contiguous()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kc, vc = k.contiguous(), v.contiguous()
    # The gradients of the k, v shard this rank holds at each step; they travel with it, so after P
    # moves every shard's gradients are home.
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    wait_grads = None
    for r in range(ring.n):
        wait_kv = None
        if r + 1 < ring.n:
            _, wait_kv = ring.shift(kc, vc)
        step = _step_config(cfgs, cfg.causal, (ring.me - r) % ring.n, ring.me)
        if step is not None:
            # The library's backward on the merged o and lse: each chunk's P is its share of the
            # whole row's softmax, and Delta = rowsum(dO o) is the whole row's.
            dq_r, dk_r, dv_r = ops.qat_attention_backward(q, kc, vc, o, lse, dout, step)
            dq += dq_r.float()
        if wait_grads is not None:  # the accumulators of the shard that arrived last step
            dk, dv = wait_grads()
        if step is not None:
            dk += dk_r.float()
            dv += dv_r.float()
        _, wait_grads = ring.shift(dk, dv, tag=2)
        if wait_kv is not None:
            kc, vc = wait_kv()
    dk, dv = wait_grads()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@ring_backward.register_fake
def _(q, k, v, o, lse, dout, group_name, *config):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def _ring_setup_context(ctx, inputs, output):
    q, k, v, *config = inputs  # config: the group's name and the config's fields
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.config = config
    ctx.mark_non_differentiable(lse)


def _ring_backward_formula(ctx, dout, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = ring_backward(q, k, v, o, lse, _custom_ops._contiguous(dout), *ctx.config)
    return (dq, dk, dv) + (None,) * len(ctx.config)


ring_forward.register_autograd(_ring_backward_formula, setup_context=_ring_setup_context)

CUSTOM_OPS = (ring_forward, ring_backward)


def ring_attention(q, k, v, config=None, group=None):
    """Plain attention (fvattn.QatConfig with quantize=False, the default here: non-causal unless
    config.causal) of sequence shards over the process group `group` (None: the default group) of
    P ranks, rank i holding tokens [i S/P, (i + 1) S/P) of q, k, v ([B, Hq, S/P, D] and
    [B, Hkv, S/P, D], equal lengths on every rank): k and v go around the ring, each rank merges
    its q shard's partial outputs exactly through their base-2 lse, and the backward sends k, v
    around again with their gradients. Returns the output's sequence shard [B, Hq, S/P, D]. The
    result is the single-process one up to the dtype's rounding of the partial outputs (within
    SPEC's bounds). NVFP4-quantized configs are refused (fvattn.Error). The custom op
    fvattn::ring_forward (backward fvattn::ring_backward)."""
    cfg = ring_attention_config(config)
    o, _ = ring_forward(q, k, v, _process_group(group).group_name, *_qat_op_args(cfg))
    return o
