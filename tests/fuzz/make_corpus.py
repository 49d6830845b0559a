#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus (tests/fuzz/corpus/): one valid call of every operation in
several configurations, index metadata with out-of-range entries, duplicates and wild counts, and a
few calls with a mutation applied. The input format is the one fvattn_fuzz.cpp reads: bytes front
to back, zeros once the input runs out, zero meaning the plain valid choice. Re-run after changing
that format:  python3 tests/fuzz/make_corpus.py
"""
import base64
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

QAT_FWD, QAT_BWD, VSA_FWD, VSA_BWD, INVERT, NVFP4, HANDLES, MISC, LAYER_FWD, LAYER_BWD, TILE_PLAN = range(11)
F16, BSHD, PAD = 1, 2, 4


def layout(flags=0, B=1, Hkv=1, group=1):
    # read_layout: flags byte, then (B-1), (Hkv-1), (group-1)
    return [flags, B - 1, Hkv - 1, group - 1]


def fill(seed=1, special_rate=0):
    return list(struct.pack("<I", seed)) + [special_rate]


def mutations(*muts):
    return [len(muts)] + [b for m in muts for b in m]


def tensor_mut(target, dim, kind, *params):
    # mutate(): target byte, then mutate_tensor(): dim byte, kind byte, the kind's bytes
    return [target, dim, kind, *params]


def qat(op, flags=0, B=1, Hkv=1, group=1, D_pick=0, Sq=1, Skv=1, cfg=0, qqkvb=0, scale_pick=0,
        muts=(), seed=1, rate=0):
    return ([op] + layout(flags, B, Hkv, group) + [D_pick, Sq - 1, Skv - 1, cfg, qqkvb, scale_pick]
            + mutations(*muts) + fill(seed, rate))


def vsa(op, flags=0, B=1, Hkv=1, group=1, D_pick=0, nqb=1, nkv=1, max_k=1, scale_pick=0, muts=(),
        seed=1, rate=0, meta=()):
    return ([op] + layout(flags, B, Hkv, group) + [D_pick, nqb - 1, nkv - 1, max_k - 1, scale_pick]
            + mutations(*muts) + fill(seed, rate) + list(meta))


def layer(op, flags=0, B=1, Hkv=1, group=1, D_pick=0, nqb=1, nkv=1, topk_pick=0, scale_pick=0,
          no_gate=0, reserve_size=0, prepare=0, muts=(), seed=1, rate=0, meta=()):
    # topk_pick: 0..3 for topk 1, 2, 3, 5. The flags byte: no gate 1, reserve_bytes choice 2 * (0 all,
    # 1 one byte less, 2 half, 3 zero), backward's reserve 8 * (0 its forward, 1 none, 2 the gate
    # toggled, 3 another topk). meta: the q block sizes, then the kv block sizes.
    return ([op] + layout(flags, B, Hkv, group)
            + [D_pick, nqb - 1, nkv - 1, topk_pick, scale_pick, no_gate | 2 * reserve_size | 8 * prepare]
            + mutations(*muts) + fill(seed, rate) + list(meta))


def tile_plan(dims=(1, 1, 1), tile=(1, 1, 1), nulls=0):
    # Each value: a small one (byte 0, then value - 1), or (byte 1, then an interesting64/32 pick).
    out = [TILE_PLAN]
    for v in list(dims) + list(tile):
        out += [1, v[1]] if isinstance(v, tuple) else [0, v - 1]
    return out + [nulls]


def invert(B=1, H=1, nqb=1, nkv=1, max_k=1, muts=(), meta=()):
    return [INVERT, B - 1, H - 1, nqb - 1, nkv - 1, max_k - 1] + mutations(*muts) + fill() + list(meta)


def nvfp4(flags=0, B=1, Hkv=1, group=1, D_pick=0, S=1, mode=0, tile=1, in_place=0, muts=(), rate=0):
    return ([NVFP4] + layout(flags, B, Hkv, group) + [D_pick, S - 1, mode, tile - 1, in_place]
            + mutations(*muts) + fill(7, rate))


# Metadata bytes (index_value): < 200 in range; 200 + i picks a wild value
# (-1, num_kv_blocks, max_k + 1, 65, INT32_MAX, INT32_MIN, -64, 2^20 for i = 0..7).
WILD = [200 + i for i in range(8)]

# QAT config byte: causal 1, quantize 2, smooth_k 4, qkv tile 8, p_scale 16*(1 tile, 2 row),
# quantize_p_backward 64, high_precision_o 128.
PROD = 2 | 64 | 128

seeds = {
    "qat_fwd_plain": qat(QAT_FWD, D_pick=2, Sq=40, Skv=33),
    "qat_fwd_production": qat(QAT_FWD, BSHD | PAD, B=2, Hkv=1, group=2, D_pick=3, Sq=48, Skv=48,
                              cfg=PROD, qqkvb=1),
    "qat_fwd_causal_tile_f16": qat(QAT_FWD, F16, D_pick=1, Sq=70, Skv=31, cfg=1 | 2 | 8 | 16 | 128,
                                   scale_pick=1, rate=20),
    "qat_fwd_row_smooth": qat(QAT_FWD, PAD, Hkv=2, D_pick=0, Sq=17, Skv=65, cfg=2 | 4 | 32),
    "qat_fwd_d256": qat(QAT_FWD, D_pick=4, Sq=8, Skv=24, cfg=PROD),
    "qat_bwd_production": qat(QAT_BWD, BSHD, Hkv=2, group=2, D_pick=2, Sq=33, Skv=40, cfg=PROD,
                              qqkvb=1),
    "qat_bwd_plain_causal_f16": qat(QAT_BWD, F16 | PAD, D_pick=1, Sq=64, Skv=64, cfg=1, rate=8),
    "vsa_fwd": vsa(VSA_FWD, B=1, Hkv=1, group=2, D_pick=0, nqb=2, nkv=3, max_k=3,
                   meta=[0, 1, 2, 2, 0, 1, 0, 0, 0, 1, 1, 1] + [0, 1, 2, 3] + [0, 30, 63]),
    "vsa_fwd_wild_indices": vsa(VSA_FWD, F16 | BSHD, D_pick=1, nqb=2, nkv=2, max_k=4,
                                meta=[0, WILD[0], 1, WILD[1], WILD[4], 0, WILD[5], 1]
                                + [WILD[2], WILD[0]] + [WILD[0], WILD[3]]),
    "vsa_fwd_duplicates": vsa(VSA_FWD, D_pick=0, nqb=1, nkv=2, max_k=4,
                              meta=[0, 199, 0, 199] + [0] + [0, 17]),
    "vsa_bwd": vsa(VSA_BWD, B=2, Hkv=1, group=1, D_pick=0, nqb=2, nkv=2, max_k=2,
                   meta=[0, 0, 0, 0, 0, 0, 0, 0] + [0, 1, 0, 2] + [0, 10]),
    "vsa_bwd_wild_indices": vsa(VSA_BWD, PAD, D_pick=1, nqb=2, nkv=3, max_k=3,
                                meta=[WILD[1], 0, 0, 2, WILD[6], 2] + [WILD[2], WILD[4]]
                                + [WILD[0], 64, WILD[3]], rate=10),
    "invert": invert(B=2, H=2, nqb=3, nkv=3, max_k=3, meta=[0] * 36 + [0] * 12),
    "invert_wild": invert(nqb=4, nkv=2, max_k=4,
                          meta=[0, 0, WILD[0], WILD[1], 1, WILD[4], 199, 1, 0, 0, 0, 0, WILD[5], 1, 1, 0]
                          + [0, WILD[2], WILD[4], WILD[5]]),
    "nvfp4_block": nvfp4(D_pick=3, S=50, rate=30),
    "nvfp4_tile_in_place": nvfp4(BSHD | F16, B=2, Hkv=2, D_pick=2, S=40, mode=1, tile=7, in_place=1),
    "handles_cpu": [HANDLES, 0, 0, 0, 0, 0, 0],
    "handles_auto_cuda": [HANDLES, 1, 0, 1, 0, 0, 0] + [HANDLES, 2, 1, 0, 0, 0, 0],
    "handles_struct_sizes": [HANDLES, 0, 0, 0, 1, 9, 1, 4, 0],
    "misc": [MISC] + list(struct.pack("<i", -7)),
    "layer_fwd": layer(LAYER_FWD, Hkv=1, group=2, D_pick=0, nqb=2, nkv=3, topk_pick=1,
                       meta=[0, 34] + [0, 64, 47]),
    "layer_fwd_no_gate_f16": layer(LAYER_FWD, F16 | BSHD | PAD, B=2, D_pick=1, nqb=1, nkv=2,
                                   topk_pick=3, scale_pick=1, no_gate=1, meta=[10] + [0, 0]),
    "layer_bwd": layer(LAYER_BWD, Hkv=2, group=1, D_pick=0, nqb=2, nkv=2, topk_pick=0,
                       meta=[0, 0] + [0, 20]),
    "layer_bwd_gqa_empty_blocks": layer(LAYER_BWD, PAD, Hkv=1, group=3, D_pick=0, nqb=1, nkv=3,
                                        topk_pick=2, meta=[64] + [64, 0, 30]),
    "layer_bwd_reserve_without_gate": layer(LAYER_BWD, nqb=1, nkv=2, topk_pick=1, prepare=2),
    "layer_bwd_reserve_other_topk": layer(LAYER_BWD, nqb=1, nkv=2, topk_pick=1, prepare=3),
    "layer_bwd_reserve_garbage": layer(LAYER_BWD, nqb=1, nkv=1, prepare=1),
    "layer_fwd_reserve_short": layer(LAYER_FWD, nqb=1, nkv=1, reserve_size=1),
    "tile_plan_video": tile_plan(dims=(5, 7, 9), tile=(4, 4, 4)),
    "tile_plan_huge": tile_plan(dims=((0, 25), (0, 25), 3), tile=(4, 4, 4)),
    "tile_plan_null_dims": tile_plan(dims=(2, 2, 2), tile=(2, 1, 2), nulls=1),
    # Mutations: an overflowing stride, a misaligned k, a pointer near 2^64, o aliasing q, a bad
    # config struct_size, too small (or half) a workspace, a misaligned one, a NULL handle.
    "mut_qat_stride_overflow": qat(QAT_FWD, D_pick=1, Sq=16, Skv=16,
                                   muts=[tensor_mut(0, 1, 3, 26)]),
    "mut_qat_misaligned_k": qat(QAT_FWD, D_pick=1, Sq=16, Skv=16, muts=[tensor_mut(1, 0, 7, 3)]),
    "mut_qat_top_pointer": qat(QAT_BWD, D_pick=1, Sq=16, Skv=16, muts=[tensor_mut(2, 0, 8, 0)]),
    "mut_qat_o_aliases_q": qat(QAT_FWD, D_pick=1, Sq=16, Skv=16, muts=[tensor_mut(3, 0, 9, 0, 0)]),
    "mut_qat_cfg_struct_size": qat(QAT_FWD, Sq=4, Skv=4, muts=[[6, 1, 9]]),
    "mut_vsa_workspace_small": vsa(VSA_BWD, nqb=1, nkv=1, max_k=1, muts=[[13, 2]], meta=[0, 0, 0]),
    "mut_qat_workspace_half": qat(QAT_BWD, D_pick=1, Sq=16, Skv=16, cfg=PROD, muts=[[10, 6]]),
    "mut_qat_workspace_misaligned": qat(QAT_FWD, D_pick=1, Sq=16, Skv=16, cfg=PROD, muts=[[7, 1]]),
    "mut_invert_null_handle": invert(nqb=2, nkv=2, max_k=2, muts=[[6]]),
    "mut_nvfp4_huge_broadcast": nvfp4(D_pick=0, S=4, muts=[tensor_mut(0, 2, 2, 19),
                                                          tensor_mut(0, 2, 3, 0)]),
    "sequence": (qat(QAT_FWD, D_pick=1, Sq=9, Skv=9) + nvfp4(S=3) + [HANDLES, 0, 0, 0, 0, 0, 0]
                 + vsa(VSA_FWD, meta=[0, 0, 0])),
}

# Inputs that found bugs, kept as regression seeds (libFuzzer's crash files, base64).
REGRESSIONS = {
    # checks.cpp: a tensor whose largest offset is exactly INT64_MAX overflowed computing its size.
    "regress_offset_int64_max":
        "//////////8EPQADAQMAHgEAACcAIJoAAAAAJwAgmgB11RAAAAAAAAAANgA2/MJGAAAAAQABAxoBAMc=",
}
for name, b64 in REGRESSIONS.items():
    seeds[name] = list(base64.b64decode(b64))

os.makedirs(OUT, exist_ok=True)
for old in os.listdir(OUT):
    os.remove(os.path.join(OUT, old))
for name, data in seeds.items():
    assert all(0 <= b < 256 for b in data), name
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes(data))
print(f"wrote {len(seeds)} seeds to {OUT}")
