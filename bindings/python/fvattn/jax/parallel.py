"""Sequence parallelism for fvattn's JAX operations: Ulysses (DeepSpeed-Ulysses, what FastVideo's
DistributedAttention_VSA does over torch.distributed).

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
each device's sequence shard is whole 64-token blocks for VSA (S / n a multiple of 64).
"""
import functools

import jax

__all__ = ["ulysses", "sequence_to_heads", "heads_to_sequence"]


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
