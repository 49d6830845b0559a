"""Sharding rules for fvattn's custom calls under jax.jit (custom_partitioning, for GSPMD and
Shardy alike): a call whose first operand is sharded over its batch or its head dimension runs on
each device's shard of batch and heads, with no all-gather, since attention never mixes batch
elements or heads (with GQA a device's q heads use exactly its kv heads when both head counts
divide by the head axis). Every other dimension (sequence, head dim, block lists' lengths, block
sizes) is gathered first: sequence parallelism is fvattn.jax.parallel's, inside jax.shard_map.

A sharding that does not divide a dimension (a batch of 3 over 2 devices, 4 kv heads over 8) is not
used for it: that dimension is gathered instead, and the result is still right.

Under jax.vmap a partitioned call runs its plain custom call, whose batching rule is the library's
(custom_vmap: custom_partitioning has no batching rule of its own).
"""
import functools
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

# An operand's or result's layout: "q" ([B, Hq, ...]), "kv" ([B, Hkv, ...]), or "whole" (not split).
Q, KV, WHOLE = "q", "kv", "whole"


def _axis_size(mesh, entry):
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[n] for n in names)


def _batch_and_head_axes(mesh, shapes, layouts):
    """The mesh axes (or None) to split batch and heads over: the first q operand's sharding of its
    dims 0 and 1, each kept only where it divides every operand's dimension it would split."""
    lead = next(s for s, l in zip(shapes, layouts) if l == Q)
    spec = lead.sharding.spec if isinstance(lead.sharding, NamedSharding) else P()
    spec = tuple(spec) + (None, None)
    b, h = spec[0], spec[1]
    split = [s for s, l in zip(shapes, layouts) if l in (Q, KV)]
    if b is not None and any(s.shape[0] % _axis_size(mesh, b) for s in split):
        b = None
    if h is not None and any(s.shape[1] % _axis_size(mesh, h) for s in split):
        h = None
    if b is not None and h is not None and set(_names(b)) & set(_names(h)):
        h = None  # one mesh axis cannot split both
    return b, h


def _names(entry):
    return entry if isinstance(entry, tuple) else (entry,)


def _sharding(mesh, layout, ndim, b, h):
    if layout == WHOLE:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(b, h, *([None] * (ndim - 2))))


def _rule(arg_ranks, arg_layouts, result_ranks, result_layouts):
    """The Shardy rule: b for every batch dimension, h for q heads, g for kv heads, a factor of its
    own for every other dimension."""
    counter = iter(range(10 ** 6))

    def operand(rank, layout):
        if layout == WHOLE:
            return " ".join(f"f{next(counter)}" for _ in range(rank))
        head = "h" if layout == Q else "g"
        return " ".join(["b", head] + [f"f{next(counter)}" for _ in range(rank - 2)])

    args = ", ".join(operand(r, l) for r, l in zip(arg_ranks, arg_layouts))
    results = ", ".join(operand(r, l) for r, l in zip(result_ranks, result_layouts))
    return f"{args} -> {results}"


def partitioned(local, arg_layouts, result_layouts, arg_ranks, result_ranks, num_static):
    """`local(*arrays, *statics)` (its last num_static arguments hashable, static) as a call that
    runs per batch and head shard under jax.jit and per element under jax.vmap. result_layouts:
    one per result, in `local`'s result order (a tuple of results, or a single result when it has
    one layout)."""
    n = len(arg_layouts)
    single = len(result_layouts) == 1

    def shardings(mesh, arg_shapes):
        b, h = _batch_and_head_axes(mesh, arg_shapes, arg_layouts)
        args = tuple(_sharding(mesh, l, len(s.shape), b, h) for s, l in zip(arg_shapes, arg_layouts))
        results = tuple(_sharding(mesh, l, r, b, h) for l, r in zip(result_layouts, result_ranks))
        return args, (results[0] if single else results)

    def infer(*a):
        *statics, mesh, arg_shapes, _ = a
        return shardings(mesh, arg_shapes)[1]

    def partition(*a):
        *statics, mesh, arg_shapes, _ = a
        args, results = shardings(mesh, arg_shapes)
        return mesh, (lambda *arrays: local(*arrays, *statics)), results, args

    cp = custom_partitioning(local, static_argnums=tuple(range(n, n + num_static)))
    cp.def_partition(infer_sharding_from_operands=infer, partition=partition,
                     sharding_rule=_rule(arg_ranks, arg_layouts, result_ranks, result_layouts))

    @functools.wraps(local)
    def call(*args):
        arrays, statics = args[:n], args[n:]

        @jax.custom_batching.custom_vmap
        def op(*xs):
            return cp(*xs, *statics)

        @op.def_vmap
        def op_vmap(axis_size, in_batched, *xs):
            del axis_size
            out = jax.vmap(lambda *ys: local(*ys, *statics), in_axes=tuple(0 if b else None for b in in_batched))(*xs)
            return out, jax.tree_util.tree_map(lambda _: True, out)

        return op(*arrays)

    return call
