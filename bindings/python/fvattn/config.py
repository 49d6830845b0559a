"""QatConfig, VsaConfig, Nvfp4Config and VsaLayerConfig: Python mirrors of the C configs.

Defaults are the C initializers' (FVA_QAT_CONFIG_INIT: FastVideo's production preset). Values are
passed to the library as they are, so a value out of range is reported by the library's own check
(e.g. "cfg->p_scale is 5 but must be ..."), as fvattn.Error.
"""
import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Optional, Union

from . import _capi
from ._errors import Error, invalid_argument

_SCALES = {"block": _capi.SCALE_BLOCK, "tile": _capi.SCALE_TILE, "row": _capi.SCALE_ROW}


def _scale_code(name, value):
    if isinstance(value, str):
        if value not in _SCALES:
            raise invalid_argument(f"cfg->{name} is {value!r} but must be one of {sorted(_SCALES)}")
        return _SCALES[value]
    return int(value)


def _scale(value):
    return 0.0 if value is None else float(value)


@dataclasses.dataclass
class QatConfig:
    """QAT attention configuration (fva_qat_config_t; FastVideo's flag names in brackets).

    softmax_scale:          None (or 0) for 1/sqrt(D)
    causal:                 query i sees keys j <= i
    quantize:               [IS_QAT] NVFP4 fake quantization of Q, K, V and P; False: plain attention
    smooth_k:               subtract K's per-channel mean over (B, H, Skv) first
    qkv_scale:              "block" or "tile" [use_global_sf_QKV]
    p_scale:                "block", "tile" [use_global_sf_P] or "row" [two_level_quant_P]
    quantize_p_backward:    [fake_quant_P] dV uses quantized P
    high_precision_o:       [use_high_prec_o] the forward also returns o_hp, the backward uses it
    quantized_qkv_backward: [use_qat_qkv_backward] the backward uses fake-quantized q, k, v
    """
    softmax_scale: Optional[float] = None
    causal: bool = False
    quantize: bool = True
    smooth_k: bool = False
    qkv_scale: Union[str, int] = "block"
    p_scale: Union[str, int] = "block"
    quantize_p_backward: bool = True
    high_precision_o: bool = True
    quantized_qkv_backward: bool = True

    def to_c(self):
        return _capi.QatConfigC(
            struct_size=_capi.ctypes.sizeof(_capi.QatConfigC),
            softmax_scale=_scale(self.softmax_scale), causal=int(self.causal),
            quantize=int(self.quantize), smooth_k=int(self.smooth_k),
            qkv_scale=_scale_code("qkv_scale", self.qkv_scale),
            p_scale=_scale_code("p_scale", self.p_scale),
            quantize_p_backward=int(self.quantize_p_backward),
            high_precision_o=int(self.high_precision_o),
            quantized_qkv_backward=int(self.quantized_qkv_backward))


@dataclasses.dataclass
class VsaConfig:
    """VSA configuration (fva_vsa_config_t): softmax_scale None (or 0) for 1/sqrt(D); block_size 64,
    the only value the library supports."""
    softmax_scale: Optional[float] = None
    block_size: int = 64

    def to_c(self):
        return _capi.VsaConfigC(struct_size=_capi.ctypes.sizeof(_capi.VsaConfigC),
                                softmax_scale=_scale(self.softmax_scale),
                                block_size=int(self.block_size))


@dataclasses.dataclass
class Nvfp4Config:
    """NVFP4 fake quantization on its own (fva_nvfp4_config_t): scale_mode "block" or "tile";
    tile_tokens, the tokens sharing one second-level scale in tile mode."""
    scale_mode: Union[str, int] = "block"
    tile_tokens: int = 32

    def to_c(self):
        return _capi.Nvfp4ConfigC(struct_size=_capi.ctypes.sizeof(_capi.Nvfp4ConfigC),
                                  scale_mode=_scale_code("scale_mode", self.scale_mode),
                                  tile_tokens=int(self.tile_tokens))


@dataclasses.dataclass
class VsaLayerConfig:
    """The whole VSA layer's configuration (fva_vsa_layer_config_t): topk, the kv blocks each q
    block attends (>= 1; more than the kv block count means all); softmax_scale None (or 0) for
    1/sqrt(D), for the coarse and the fine attention alike; block_size 64, the only value the library
    supports."""
    topk: int
    softmax_scale: Optional[float] = None
    block_size: int = 64

    def to_c(self):
        topk = int(self.topk)
        if not -2**31 <= topk < 2**31:
            raise invalid_argument(f"cfg->topk is {topk} but must be >= 1 (and fit in int32)")
        return _capi.VsaLayerConfigC(struct_size=_capi.ctypes.sizeof(_capi.VsaLayerConfigC),
                                     softmax_scale=_scale(self.softmax_scale),
                                     block_size=int(self.block_size), topk=topk)


def coerce(config, cls, argname="config"):
    """config as a cls: None gives cls() (the defaults), a cls instance is used as it is, a dict (or
    other mapping) of cls's field names is turned into one; anything else raises a TypeError that
    names the class expected."""
    if config is None:
        return cls()
    if isinstance(config, cls):
        return config
    fields = [f.name for f in dataclasses.fields(cls)]
    if isinstance(config, Mapping):
        unknown = sorted(str(k) for k in config if k not in fields)
        if unknown:
            raise TypeError(f"{argname}: unknown {cls.__name__} field(s) {unknown}; the fields are "
                            f"{fields}")
        try:
            return cls(**config)
        except TypeError as e:  # a required field (VsaLayerConfig's topk) missing
            raise TypeError(f"{argname}: {e} (pass a dict of fvattn.{cls.__name__}'s fields "
                            f"{fields}, or fvattn.{cls.__name__}(...))") from None
    raise TypeError(f"{argname} must be fvattn.{cls.__name__} (or a dict of its fields {fields}), "
                    f"not {type(config).__module__}.{type(config).__qualname__}")


def ring_attention_config(config):
    """The QatConfig a ring attention computes (None: plain attention, non-causal), checked: a ring
    refuses what it cannot compute exactly (fvattn.jax.parallel and fvattn.torch.distributed)."""
    cfg = QatConfig(quantize=False) if config is None else coerce(config, QatConfig)
    if cfg.quantize:
        raise invalid_argument("ring_attention: config.quantize must be False (plain attention): NVFP4's "
                               "quantized P depends on each row's running maximum, which a ring changes; "
                               "use ulysses for QAT attention")
    if cfg.smooth_k:
        raise invalid_argument("ring_attention: config.smooth_k subtracts K's mean over the whole "
                               "sequence, which no shard holds; it changes no output of plain "
                               "attention, so leave it False")
    return cfg


def block_tokens(block_size):
    """Tokens per block of FastVideo's video_sparse_attn block_size argument: a tuple (4, 4, 4) is a
    4x4x4 tile; an int b the cube (b, b, b), as FastVideo reads it, except 64 itself, also taken as
    64 tokens (the default's and docs/SPEC.md's meaning; FastVideo's cube reading of it, 262144-token
    blocks, no model uses, and its block-size vectors, one entry per 262144 tokens, cannot pass for
    ours). fvattn supports 64-token blocks only: anything else raises fvattn.Error."""
    if isinstance(block_size, numbers.Integral):
        n = 64 if block_size == 64 else int(block_size) ** 3
    else:
        n = math.prod([int(b) for b in block_size])  # a list: torch.compile traces math.prod of one
    if n != 64:
        raise Error(2, "FVA_ERR_UNSUPPORTED", f"block_size {block_size!r} makes {n}-token blocks; fvattn "
                    "supports 64-token blocks only ((4, 4, 4) tiles)")
    return n
