"""Sequence parallelism for fvattn's JAX operations: Ulysses (DeepSpeed-Ulysses, what FastVideo's
DistributedAttention_VSA does over torch.distributed) for every operation, and ring attention for
plain attention.

A model whose sequence is sharded over a mesh axis runs each attention on whole sequences of a
share of the heads: an all-to-all turns the sequence shards of q, k, v (and the gate) into head
shards, the operation runs on them, and an all-to-all turns its output back into sequence shards.
Attention heads are independent, so the result is the single-device one (bit for bit on the CPU).

    from jax.sharding import Mesh, PartitionSpec as P
    import fvattn.jax as fj
    mesh = Mesh(jax.devices(), ("sp",))
    attn = fj.parallel.ulysses(fj.qat_attention, "sp")
    spec = P(None, None, "sp")                          # [B, H, S, D], S sharded over "sp"
    o = jax.shard_map(attn, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)

Under jax.shard_map every argument is a shard; jax.grad of the mapped function gives the
gradients of the single-device computation (an all-to-all's transpose is the reverse all-to-all).
Requirements: the mesh axis size n divides the heads of q and of k, v (GQA: both counts), and
each device's sequence shard is whole 64-token blocks for VSA (S / n a multiple of 64). With
config.smooth_k (K's mean over (B, H, Skv)) each device subtracts the mean of its own heads, as
FastVideo's DistributedAttention does: plain attention's output does not depend on it, NVFP4-quantized
attention's does, by about the quantization's own noise; for the single-device result of quantized
attention, leave smooth_k off (QatConfig's default).

Ring attention (ring_attention) keeps every head on every device and passes the k, v shards around
the ring instead: each device attends its q shard to each k, v shard in turn and merges the partial
outputs exactly through their lse; the backward passes k, v around again with their gradients. It
serves any head count (no head split), for plain attention (config.quantize False: NVFP4's
quantized P depends on the rows' running maximum, which a ring changes), causal too.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..config import ring_attention_config

__all__ = ["ulysses", "ring_attention", "sequence_to_heads", "heads_to_sequence"]


def sequence_to_heads(x, axis_name):
    """[B, H, S/n, ...] sequence shards -> [B, H/n, S, ...] head shards (inside shard_map over
    axis_name, of size n): device i gets heads [i H/n, (i + 1) H/n) of the whole sequence."""
    return jax.lax.all_to_all(x, axis_name, split_axis=1, concat_axis=2, tiled=True)


def heads_to_sequence(x, axis_name):
    """The inverse of sequence_to_heads: [B, H/n, S, ...] head shards -> [B, H, S/n, ...]."""
    return jax.lax.all_to_all(x, axis_name, split_axis=2, concat_axis=1, tiled=True)


def _head_slice(x, axis_name):
    """Device i's share of the heads (axis 1) of an argument every device holds whole."""
    n = jax.lax.axis_size(axis_name)
    heads = x.shape[1]
    if heads % n:
        raise ValueError(f"ulysses: {heads} heads do not split over the {n} devices of axis "
                         f"{axis_name!r}")
    share = heads // n
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(axis_name) * share, share, axis=1)


def ulysses(fn, axis_name, *, seq_args=(0, 1, 2), head_args=(), seq_kwargs=()):
    """fn, an fvattn operation over [B, H, S, D] tensors that returns one [B, H, S, D] output
    (qat_attention, vsa_attention, video_sparse_attn, or a function of them), wrapped for use
    inside jax.shard_map with the sequence axis sharded over `axis_name`:
      - the positional arguments at seq_args (default q, k, v) and the keyword arguments named in
        seq_kwargs (e.g. "compress_attn_weight", video_sparse_attn's gate) are sequence shards
        [B, H, S/n, ...], turned into head shards of the whole sequence;
      - the positional arguments at head_args are per-head metadata every device holds whole
        ([B, H, ...], e.g. vsa_attention's q2k_idx and q2k_num: head_args=(3, 4)), cut to the
        device's heads;
      - every other argument passes as it is (block sizes, topk, configs: the same for every head).
    Returns the output's sequence shard [B, H, S/n, ...]."""
    seq_args, head_args, seq_kwargs = tuple(seq_args), tuple(head_args), tuple(seq_kwargs)

    @functools.wraps(fn)
    def sharded(*args, **kwargs):
        args = list(args)
        for i in seq_args:
            args[i] = sequence_to_heads(args[i], axis_name)
        for i in head_args:
            args[i] = _head_slice(args[i], axis_name)
        for name in seq_kwargs:
            if kwargs.get(name) is not None:
                kwargs[name] = sequence_to_heads(kwargs[name], axis_name)
        return heads_to_sequence(fn(*args, **kwargs), axis_name)

    return sharded


# ---- ring attention -------------------------------------------------------------------------------


def _merge(o1, l1, o2, l2):
    """Two partial attentions of the same rows over disjoint keys (o [B, H, S, D] in the dtype, lse
    [B, H, S] base 2, -inf for rows that saw no key) as one, in fp32."""
    m = jnp.maximum(l1, l2)
    safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp2(l1 - safe), jnp.exp2(l2 - safe)
    total = w1 + w2
    o = (o1.astype(jnp.float32) * w1[..., None] + o2.astype(jnp.float32) * w2[..., None])
    o = jnp.where(total[..., None] > 0, o / jnp.where(total > 0, total, 1.0)[..., None], 0.0)
    return o, jnp.where(total > 0, safe + jnp.log2(jnp.where(total > 0, total, 1.0)), -jnp.inf)


def _ring_configs(cfg):
    """The C configs of a ring's blocks for a checked QatConfig: (full, causal diagonal), and
    whether it is causal."""
    from . import _primitives
    full = dataclasses.replace(cfg, causal=False, high_precision_o=False)
    diag = dataclasses.replace(cfg, causal=True, high_precision_o=False)
    return _primitives.qat_config(full), _primitives.qat_config(diag), cfg.causal


def _like(x, ref):
    """x typed as varying over the mesh axes ref varies over (what the custom calls' results are),
    so that every branch of a switch has the same type."""
    from . import _primitives
    axes = _primitives._varying_axes(ref) - _primitives._varying_axes(x)
    return _primitives._vary(x, axes) if axes else x


def _shift(x, axis_name, n):
    """Device i's x to device i + 1 (mod n)."""
    return jax.lax.ppermute(x, axis_name, [(i, (i + 1) % n) for i in range(n)])


def _ring_forward(q, k, v, axis_name, full, diag, causal):
    from . import _primitives
    n = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    o = jnp.zeros(q.shape, jnp.float32)
    lse = jnp.full(q.shape[:3], -jnp.inf, jnp.float32)
    kc, vc = k, v
    for r in range(n):
        src = (me - r) % n  # whose k, v shard this device holds at step r
        if causal:
            def diagonal(kc=kc, vc=vc):
                oo, _, ll = _primitives.qat_forward_c(q, kc, vc, diag)
                return oo, ll

            def earlier(kc=kc, vc=vc):
                oo, _, ll = _primitives.qat_forward_c(q, kc, vc, full)
                return oo, ll

            def later():
                return (_like(jnp.zeros(q.shape, q.dtype), q),
                        _like(jnp.full(q.shape[:3], -jnp.inf, jnp.float32), q))

            o_r, l_r = jax.lax.switch(jnp.where(src == me, 0, jnp.where(src < me, 1, 2)),
                                      (diagonal, earlier, later))
        else:
            o_r, _, l_r = _primitives.qat_forward_c(q, kc, vc, full)
        o, lse = _merge(o, lse, o_r, l_r)
        if r + 1 < n:
            kc, vc = _shift(kc, axis_name, n), _shift(vc, axis_name, n)
    return o.astype(q.dtype), lse


def _ring_backward(q, k, v, o, lse, dout, axis_name, full, diag, causal):
    from . import _primitives
    n = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    dq = jnp.zeros(q.shape, jnp.float32)
    kc, vc = k, v
    dk = jnp.zeros(k.shape, jnp.float32)  # the gradients of the k, v shard this device holds
    dv = jnp.zeros(v.shape, jnp.float32)
    for r in range(n):
        src = (me - r) % n
        if causal:
            def diagonal(kc=kc, vc=vc):
                return _primitives.qat_backward_c(q, kc, vc, o, lse, dout, diag)

            def earlier(kc=kc, vc=vc):
                return _primitives.qat_backward_c(q, kc, vc, o, lse, dout, full)

            def later():
                return (_like(jnp.zeros(q.shape, q.dtype), q), _like(jnp.zeros(k.shape, k.dtype), q),
                        _like(jnp.zeros(v.shape, v.dtype), q))

            dq_r, dk_r, dv_r = jax.lax.switch(jnp.where(src == me, 0, jnp.where(src < me, 1, 2)),
                                              (diagonal, earlier, later))
        else:
            dq_r, dk_r, dv_r = _primitives.qat_backward_c(q, kc, vc, o, lse, dout, full)
        dq = dq + dq_r.astype(jnp.float32)
        dk, dv = dk + dk_r.astype(jnp.float32), dv + dv_r.astype(jnp.float32)
        # k, v and their gradients move on together; after n moves every shard's gradients are home.
        kc, vc = _shift(kc, axis_name, n), _shift(vc, axis_name, n)
        dk, dv = _shift(dk, axis_name, n), _shift(dv, axis_name, n)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ring(q, k, v, axis_name, cfg_key):
    full, diag, causal = _ring_configs(cfg_key.config)
    return _ring_forward(q, k, v, axis_name, full, diag, causal)[0]


def _ring_fwd(q, k, v, axis_name, cfg_key):
    full, diag, causal = _ring_configs(cfg_key.config)
    o, lse = _ring_forward(q, k, v, axis_name, full, diag, causal)
    return o, (q, k, v, o, lse)


def _ring_bwd(axis_name, cfg_key, res, g):
    full, diag, causal = _ring_configs(cfg_key.config)
    q, k, v, o, lse = res
    return _ring_backward(q, k, v, o, lse, g.astype(q.dtype), axis_name, full, diag, causal)


_ring.defvjp(_ring_fwd, _ring_bwd)


class _Key:
    """A config as a nondiff argument: compared by value, hashed by its fields."""

    def __init__(self, config):
        self.config = config

    def __eq__(self, other):
        return isinstance(other, _Key) and self.config == other.config

    def __hash__(self):
        return hash(tuple(sorted(vars(self.config).items())))


def ring_attention(q, k, v, axis_name, config=None):
    """Plain attention (fvattn.QatConfig with quantize=False, the default here; causal allowed) of
    sequence shards, inside jax.shard_map with the sequence axis of q, k, v ([B, H, S/n, D]) sharded over axis_name
    (size n, device i holding tokens [i S/n, (i + 1) S/n)): k and v go around the ring, each device
    merges its q shard's partial outputs exactly through their lse, and the backward sends k, v
    around again with their gradients. Returns the output's sequence shard. The result is the
    single-device one up to the dtype's rounding of the partial outputs (within SPEC's bounds)."""
    return _ring(q, k, v, axis_name, _Key(ring_attention_config(config)))  # refused at trace time
