"""Every failure raises fvattn.Error carrying the library's status name and message."""
import numpy as np
import pytest

import fvattn
from conftest import BF16, random_bf16


def raises(status_name, message, fn, *args, **kwargs):
    with pytest.raises(fvattn.Error) as info:
        fn(*args, **kwargs)
    e = info.value
    assert e.status_name == status_name, str(e)
    assert e.message == message, str(e)
    assert str(e) == f"{status_name}: {message}"
    return e


def test_shape_mismatch_names_the_argument(rng):
    q = random_bf16(rng, (1, 2, 64, 64))
    e = raises("FVA_ERR_INVALID_ARGUMENT", "v: shape[2] is 64 but k.shape[2] is 32",
               fvattn.qat_attention_forward, q, q[:, :, :32], q)
    assert e.status == 1


def test_unsupported_head_dim(rng):
    q = random_bf16(rng, (1, 1, 32, 48))
    e = raises("FVA_ERR_UNSUPPORTED",
               "q: head dim shape[3] = 48 is not supported; D must be 16, 32, 64, 128 or 256",
               fvattn.qat_attention_forward, q, q, q)
    assert e.status == 2


def test_config_values_are_checked_by_the_library(rng):
    q = random_bf16(rng, (1, 1, 32, 16))
    raises("FVA_ERR_INVALID_ARGUMENT",
           "cfg->p_scale is 5 but must be FVA_SCALE_BLOCK (0), FVA_SCALE_TILE (1) or FVA_SCALE_ROW (2)",
           fvattn.qat_attention_forward, q, q, q, fvattn.QatConfig(p_scale=5))
    raises("FVA_ERR_INVALID_ARGUMENT", "cfg->p_scale is 'huge' but must be one of ['block', 'row', 'tile']",
           fvattn.qat_attention_forward, q, q, q, fvattn.QatConfig(p_scale="huge"))
    with pytest.raises(fvattn.Error, match="softmax_scale"):
        fvattn.qat_attention_forward(q, q, q, fvattn.QatConfig(softmax_scale=-1.0))
    raises("FVA_ERR_UNSUPPORTED", "cfg->block_size is 32 but only 64 is supported",
           fvattn.vsa_forward, *_vsa(rng), fvattn.VsaConfig(block_size=32))


def test_dtypes(rng):
    q32 = rng.standard_normal((1, 1, 32, 16)).astype(np.float32)
    raises("FVA_ERR_INVALID_ARGUMENT", "q: dtype is F32 (3) but must be BF16 or F16",
           fvattn.qat_attention_forward, q32, q32, q32)
    q64 = q32.astype(np.float64)
    raises("FVA_ERR_INVALID_ARGUMENT",
           "q: numpy dtype float64 is not one fvattn handles (bfloat16 from ml_dtypes, float16, "
           "float32, int32, int64)", fvattn.qat_attention_forward, q64, q64, q64)
    q16 = q32.astype(BF16)
    raises("FVA_ERR_INVALID_ARGUMENT", "k: dtype is F16 but q.dtype is BF16",
           fvattn.qat_attention_forward, q16, q32.astype(np.float16), q16)


def _vsa(rng):
    q = random_bf16(rng, (1, 1, 128, 64))
    return (q, q, q, np.zeros((1, 1, 2, 1), np.int32), np.ones((1, 1, 2), np.int32),
            np.full((2,), 64, np.int32))


def test_vsa_metadata_rules(rng):
    q, k, v, idx, num, bs = _vsa(rng)
    raises("FVA_ERR_INVALID_ARGUMENT",
           "q: shape[2] is 96 but VSA needs a multiple of 64 (pad each block to 64 tokens and pass "
           "the real sizes in block_sizes)", fvattn.vsa_forward, q[:, :, :96], k, v, idx, num, bs)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: q2k_num: dtype is I64"):
        fvattn.vsa_forward(q, k, v, idx, num.astype(np.int64), bs)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: block_sizes: shape\[0\] is 3"):
        fvattn.vsa_forward(q, k, v, idx, num, np.full((3,), 64, np.int32))


def test_layout_rules_reach_the_caller(rng):
    q = random_bf16(rng, (1, 1, 32, 32))
    odd = q[:, :, :, ::2]  # last stride 2 elements
    with pytest.raises(fvattn.Error, match=r"q: strides\[3\] is 2 but the last stride must be 1"):
        fvattn.qat_attention_forward(odd, odd, odd, fvattn.QatConfig(quantize=False))
    flipped = q[:, :, ::-1]
    with pytest.raises(fvattn.Error, match=r"strides must be >= 0"):
        fvattn.qat_attention_forward(flipped, q, q)


def test_mixed_kinds_are_rejected(rng):
    q = random_bf16(rng, (1, 1, 32, 16))
    with pytest.raises(fvattn.Error, match="every tensor of a call must be of one kind"):
        fvattn.qat_attention_forward(q, q, [[0.0]])
    with pytest.raises(fvattn.Error, match="is not an array fvattn can take"):
        fvattn.qat_attention_forward("q", q, q)


def test_error_is_an_exception_with_fields():
    e = fvattn.Error(3, "FVA_ERR_WORKSPACE_TOO_SMALL", "ws_bytes is 1")
    assert isinstance(e, Exception) and e.status == 3 and str(e) == "FVA_ERR_WORKSPACE_TOO_SMALL: ws_bytes is 1"


# ---- errors a newcomer meets first -----------------------------------------------------------

def test_config_as_dict_is_mapped_to_the_config_class(rng):
    q = random_bf16(rng, (1, 1, 32, 16))
    o, o_hp, lse = fvattn.qat_attention_forward(q, q, q, {"quantize": False, "high_precision_o": False})
    ref = fvattn.qat_attention_forward(q, q, q, fvattn.QatConfig(quantize=False, high_precision_o=False))
    assert o_hp is None
    np.testing.assert_array_equal(o.astype(np.float32), ref[0].astype(np.float32))
    y = fvattn.nvfp4_fake_quantize(q, {"scale_mode": "tile"})
    np.testing.assert_array_equal(
        y.astype(np.float32), fvattn.nvfp4_fake_quantize(q, fvattn.Nvfp4Config("tile")).astype(np.float32))
    args = _vsa(rng)
    np.testing.assert_array_equal(fvattn.vsa_forward(*args, {"softmax_scale": 0.5})[1],
                                  fvattn.vsa_forward(*args, fvattn.VsaConfig(softmax_scale=0.5))[1])


def test_config_of_another_type_is_a_type_error_naming_the_class(rng):
    q = random_bf16(rng, (1, 1, 32, 16))
    with pytest.raises(TypeError, match=r"^config must be fvattn\.QatConfig \(or a dict of its fields"):
        fvattn.qat_attention_forward(q, q, q, 3)
    with pytest.raises(TypeError, match=r"^config must be fvattn\.QatConfig .*not fvattn\.config\.VsaConfig$"):
        fvattn.qat_attention_forward(q, q, q, fvattn.VsaConfig())
    with pytest.raises(TypeError, match=r"^config: unknown QatConfig field\(s\) \['quantise'\]; the fields are"):
        fvattn.qat_attention_forward(q, q, q, {"quantise": False})
    with pytest.raises(TypeError, match=r"^config must be fvattn\.VsaConfig"):
        fvattn.vsa_forward(*_vsa(rng), "fast")


FIX = ("; pass a contiguous copy instead: np.ascontiguousarray(x) for NumPy, x.contiguous() for torch, "
       "cupy.ascontiguousarray(x) for CuPy")


def test_stride_and_alignment_errors_say_how_to_fix_them(rng):
    q = random_bf16(rng, (1, 1, 32, 32))
    plain = fvattn.QatConfig(quantize=False)
    for bad, what in ((q[:, :, :, ::2], "q: strides[3] is 2 but the last stride must be 1"),
                      (q[:, :, ::-1], "q: strides[2] is -32 but strides must be >= 0")):
        e = raises("FVA_ERR_INVALID_ARGUMENT", what + FIX, fvattn.qat_attention_forward, bad, q, q, plain)
        fixed = np.ascontiguousarray(bad)
        fvattn.qat_attention_forward(fixed, fixed, fixed, plain)  # the fix the message gives works
        assert "np.ascontiguousarray" in str(e)
    raw = np.zeros(2 * 32 * 16 + 64, np.uint8)
    off = 2 + (-raw.ctypes.data) % 16  # 2 bytes past a 16-byte boundary: a bf16 view, misaligned
    misaligned = raw[off:off + 2 * 32 * 16].view(BF16).reshape(1, 1, 32, 16)
    with pytest.raises(fvattn.Error, match=r"^FVA_ERR_INVALID_ARGUMENT: q: data \S+ is not 16-byte aligned"):
        fvattn.qat_attention_forward(misaligned, misaligned, misaligned, plain)
    try:
        fvattn.qat_attention_forward(misaligned, misaligned, misaligned, plain)
    except fvattn.Error as err:
        assert err.message.endswith("; pass a fresh copy instead (new arrays are aligned): x.copy() for "
                                    "NumPy and CuPy, x.clone() for torch"), err.message
    fixed = misaligned.copy()
    fvattn.qat_attention_forward(fixed, fixed, fixed, plain)
    # Other errors keep the library's message as it is.
    raises("FVA_ERR_INVALID_ARGUMENT", "v: shape[2] is 32 but k.shape[2] is 16",
           fvattn.qat_attention_forward, q, q[:, :, :16], q)


def test_negative_num_kv_blocks_is_reported_as_that_argument(rng):
    idx, num = np.zeros((1, 1, 2, 1), np.int32), np.ones((1, 1, 2), np.int32)
    for n in (-1, 0):
        raises("FVA_ERR_INVALID_ARGUMENT",
               f"num_kv_blocks is {n} but must be >= 1 (the kv block count, k.shape[2] // 64) and "
               "fit in int32", fvattn.vsa_invert_indices, idx, num, n)
    with pytest.raises(TypeError, match="^num_kv_blocks must be an int"):
        fvattn.vsa_invert_indices(idx, num, 1.5)
    k2q_idx, k2q_num = fvattn.vsa_invert_indices(idx, num, np.int64(2))
    assert k2q_num.tolist() == [[[2, 0]]]


def test_error_class_prints_as_fvattn_error():
    assert fvattn.Error.__module__ == "fvattn" and fvattn.LibraryNotFoundError.__module__ == "fvattn"
    assert repr(fvattn.Error).endswith("'fvattn.Error'>")
    import traceback
    try:
        raise fvattn.Error(1, "FVA_ERR_INVALID_ARGUMENT", "x")
    except fvattn.Error as e:
        assert traceback.format_exception_only(type(e), e)[-1] == "fvattn.Error: FVA_ERR_INVALID_ARGUMENT: x\n"


def test_readme_says_bf16_needs_ml_dtypes_and_the_bf16_extra():
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    readme = open(os.path.join(here, "..", "README.md"), encoding="utf-8").read()
    assert "ml_dtypes" in readme and "[bf16]" in readme
    toml = open(os.path.join(here, "..", "pyproject.toml"), encoding="utf-8").read()
    assert 'bf16 = ["ml_dtypes"]' in toml
