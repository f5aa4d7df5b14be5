"""Cost-model features: fixed layout, stable values, the same numbers per row and in bulk."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from costmodel_support import fixture_frame

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule
from tunecache.compiler.kinds.lrn import LrnSchedule, lrn_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.kinds.pwdw import PwdwSchedule, pwdw_op
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel import features as F

# One entry per FEATURE_VERSION: the hash of the names (layout) and of golden values. When
# either check fails, the features changed: bump FEATURE_VERSION (saved models then refuse
# to load and must be retrained) and add the new version's digests here.
LAYOUT_DIGESTS = {1: "69330a51579c4cf9", 2: "84f7f0316a034daa", 3: "84f7f0316a034daa",
                  4: "84f7f0316a034daa", 5: "7ec47d8fb9fd97ae", 6: "27e28fc5b8decf11",
                  7: "24e71a35542179d8", 8: "2f93537a1730cd63", 9: "a5a0e17e055572f5",
                  10: "fff9ee10eaea7fea", 11: "c654093b4f7a52d6",
                  12: "9938fab643596ddb", 13: "9938fab643596ddb", 14: "9938fab643596ddb",
                  15: "9938fab643596ddb", 16: "ff6646bd22ec6025",
                  17: "9d8d40ab8cb05e1a", 18: "973f8a727afef4ee",
                  19: "973f8a727afef4ee", 20: "973f8a727afef4ee", 21: "973f8a727afef4ee",
                  22: "973f8a727afef4ee", 23: "973f8a727afef4ee",
                  24: "973f8a727afef4ee", 25: "2c78ffdf01ac939a",
                  26: "52bb5274b268e90b", 27: "fad26e047fc8f57b",
                  28: "1ca6256e784d9455"}
VALUE_DIGESTS = {1: "7a4bbf887cdf0eca", 2: "68aed89b98dbe3c2", 3: "ee3c150c3f1c00d4",
                 4: "28e29d75ebf480e0", 5: "5a2a23657e21ad2a", 6: "e6204765dd950e66",
                 7: "f20cb4de32fb7943", 8: "d6d65c55b0f686b2", 9: "def038e369205259",
                 10: "b46d05c4cb2d011c", 11: "2c1a15b69aa365f2",
                 12: "607bb35cfef37228", 13: "50d239d5758275cf",
                 14: "3489d3dcaf33eb0d",  # 14: two golden rows more (an LM head, a Winograd conv)
                 15: "113ad569124da84d",  # 15: a golden row more (a decode projection by rows)
                 16: "679b85ba9be6a53d",  # 16: a golden row more (AlexNet's blocked LRN)
                 17: "d90a1d863a554226",  # 17: and MobileNet-v2's fused pwdw block
                 18: "bc01626452950a51",  # 18: and BERT's FFN as one level of Strassen
                 19: "9a8c4b571a8800b9",  # 19: FMAs in flight per ISA, GEMM conv margin and panels
                 20: "cce5ec7520d1a0e1",  # 20: broadcast cost per ISA, direct conv margin, strides
                 21: "7f572caaa473aa3f",  # 21: latency or loads, short reductions overlap, ic blocks
                 22: "c617eb4b7fcc3874",  # 22: a golden row more (a 1x1 conv on a flat pixel grid)
                 23: "15270c479c165bb6",  # 23: and a Xeon's FFN, its weight stream charged
                 24: "5ec49af23c776a44",  # 24: and a Xeon's M=1024 Strassen, its own passes charged
                 25: "60e1a76c988f059c",  # 25: the dequant epilogue's column
                 26: "7413b63584083de9",  # 26: the elementwise kind's new steps' columns
                 27: "bb0093ddf0c8485e",  # 27: hardswish and hardsigmoid's columns
                 28: "6b79913ab2b068ef"}  # 28: mish, prelu, elu and softplus's columns

AVX512 = HardwareSpec(arch="x86_64", isa="avx512", vector_bits=512, cores=2, l1d_bytes=48 << 10,
                      l2_bytes=1 << 20, l3_bytes=32 << 20, cpu_model="Golden CPU",
                      l3_shared_by=2)
AVX2 = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=8, l1d_bytes=32 << 10,
                    l2_bytes=256 << 10, l3_bytes=16 << 20, cpu_model="Golden CPU 2")
XEON = HardwareSpec(arch="x86_64", isa="avx512", vector_bits=512, cores=2, l1d_bytes=48 << 10,
                    l2_bytes=2 << 20, l3_bytes=105 << 20, cpu_model="Intel(R) Xeon(R) Golden",
                    l3_shared_by=2)


def golden_inputs() -> list[tuple[OpSignature, object, HardwareSpec]]:
    mm = matmul_op(128, 768, 768, epilogue="bias")
    bmm = batch_matmul_op(12, 128, 64, 128, trans_b=True)
    odd = matmul_op(97, 13, 511, trans_a=True)
    conv = conv2d_op(1, 64, 56, 56, 64, 3, 3, pads=1, epilogue="bias+relu")
    dw = conv2d_op(1, 96, 112, 112, 96, 3, 3, stride=2, pads=1, groups=96,
                            epilogue="bias")
    head = matmul_op(8, 50257, 768)
    wino = OpSignature.parse("conv2d(N=1,C=64,H=56,W=56,F=64,R=3,S=3,pad_t=1,pad_b=1,"
                             "pad_l=1,pad_r=1,layout=nchw8c,out_layout=nchw8c,"
                             "epilogue=bias+relu)")
    return [
        (mm, MatmulSchedule(mr=14, nr=32, kc=384, mc=126, nc=768, threads=2), AVX512),
        (mm, MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=768, pack_a=0, loop_order="ipj",
                            unroll=4, threads=8, parallel="n"), AVX2),
        (bmm, MatmulSchedule(mr=8, nr=16, kc=128, mc=128, nc=64, threads=2, parallel="batch"),
         AVX512),
        (odd, MatmulSchedule(mr=5, nr=16, kc=64, mc=100, nc=16, threads=2), AVX512),
        # illegal (register file overflow): still a full row, flagged illegal
        (mm, MatmulSchedule(mr=30, nr=64, kc=256, mc=120, nc=768), AVX2),
        (conv, default_conv2d_schedule(conv, AVX512, 2, "direct"), AVX512),
        (conv, default_conv2d_schedule(conv, AVX2, 8, "gemm"), AVX2),
        # the depthwise plane kernel (feature version 3)
        (dw, Conv2dSchedule(oc_block=16, ow_block=32, oh_block=2, ic_block=1, pack_w=0,
                            threads=2), AVX512),
        # a decode-step LM head split by rows: every thread streams all of B (version 14)
        (head, MatmulSchedule(mr=2, nr=32, kc=384, mc=4, nc=5056, pack_a=0, threads=2,
                              parallel="m"), AVX2),
        # a decode-step projection split by rows, B small enough for the L3: each thread's
        # pass over the weights still comes from DRAM (version 15)
        (matmul_op(8, 768, 768, epilogue="bias"),
         MatmulSchedule(mr=4, nr=24, kc=384, mc=4, nc=768, threads=2, parallel="m"), AVX2),
        # Winograd F(4x4,3x3) on the blocked layout (version 14)
        (wino, Conv2dSchedule(algorithm="winograd", oh_block=4, ow_block=14, oc_block=8,
                              ic_block=8, threads=2), AVX2),
        # AlexNet's first LRN on blocked activations (version 16)
        (lrn_op(1, 96, 55, 55, 5, layout="nchw8c"), LrnSchedule(pixels=4, vec=2, threads=8),
         AVX2),
        # MobileNet-v2's first expansion fused with its depthwise conv (version 17)
        (pwdw_op(1, 16, 112, 112, 96, 3, 3, stride=2, pads=1, pw_epilogue="bias+clip6",
                 epilogue="bias+clip6", layout="nchw8c", out_layout="nchw8c"),
         PwdwSchedule(ow_block=14, pw_block=14, band_tiles=4, threads=2), AVX2),
        # BERT's FFN up-projection as one level of Strassen (version 18)
        (matmul_op(128, 3072, 768, epilogue="bias"),
         MatmulSchedule(mr=8, nr=48, kc=384, mc=64, nc=240, threads=2, parallel="n",
                        strassen=1), AVX512),
        # MobileNet-v2's last 1x1 projection: tiles along the flat run of pixels (version 22)
        (OpSignature.parse("conv2d(N=1,C=960,H=7,W=7,F=320,R=1,S=1,layout=nchw8c,"
                           "out_layout=nchw8c,epilogue=bias)"),
         Conv2dSchedule(oc_block=16, ow_block=5, oh_block=2, ic_block=8, threads=2,
                        parallel="pixel"), AVX2),
        # the same FFN on a two-FMA-unit Xeon, plain and split by columns: its weight stream
        # is charged on top of compute there (version 23)
        (matmul_op(128, 3072, 768, epilogue="bias"),
         MatmulSchedule(mr=8, nr=48, kc=128, mc=128, nc=3072, threads=2, parallel="n"), XEON),
        # BERT's projection at batch 8 as one level of Strassen on that Xeon: its C and its
        # row block's A sums overflow L2, both charged there (version 24)
        (matmul_op(1024, 768, 768, epilogue="bias"),
         MatmulSchedule(mr=8, nr=48, kc=384, mc=256, nc=96, threads=2, parallel="n",
                        strassen=1), XEON),
    ]


def _digest(rows: np.ndarray) -> str:
    # 5 significant digits: stable across numpy/libm builds, sensitive to any real change.
    text = "\n".join(",".join("nan" if np.isnan(x) else f"{x:.5g}" for x in row) for row in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_layout_is_versioned():
    assert len(set(F.FEATURE_NAMES)) == len(F.FEATURE_NAMES)
    assert F.FEATURE_VERSION in LAYOUT_DIGESTS, (
        f"FEATURE_VERSION {F.FEATURE_VERSION} has no recorded layout digest; add "
        f"{F.FEATURE_VERSION}: {F.names_digest()!r}")
    assert LAYOUT_DIGESTS[F.FEATURE_VERSION] == F.names_digest(), (
        "FEATURE_NAMES changed without a FEATURE_VERSION bump: bump it and record "
        f"{F.names_digest()!r} for the new version")


def test_values_are_versioned():
    rows = np.stack([F.features(op, s, hw) for op, s, hw in golden_inputs()])
    assert VALUE_DIGESTS.get(F.FEATURE_VERSION) == _digest(rows), (
        "feature values changed (features.py or costmodel.analytic) without a FEATURE_VERSION "
        f"bump: bump it and record {_digest(rows)!r} for the new version")


def test_same_input_same_vector():
    for op, s, hw in golden_inputs():
        a = F.features(op, s, hw)
        b = F.features(OpSignature.parse(op.text), s.replace(), HardwareSpec.from_json(hw.to_json()))
        assert a.dtype == np.float32 and a.shape == (len(F.FEATURE_NAMES),)
        np.testing.assert_array_equal(a, b)


def test_families_share_one_layout():
    rows = {F.FEATURE_NAMES[i]: i for i in range(len(F.FEATURE_NAMES))}
    (mm, s, hw), *_ = golden_inputs()
    conv_op, conv_s, conv_hw = golden_inputs()[5]
    m = F.features(mm, s, hw)
    c = F.features(conv_op, conv_s, conv_hw)
    assert m[rows["kind_matmul"]] == 1 and c[rows["kind_conv2d"]] == 1
    assert np.isnan(m[rows["oc_block"]]) and np.isnan(c[rows["mr"]])
    assert m[rows["legal"]] == 1 and c[rows["legal"]] == 1
    # the tiler's estimate: present for matmul, and for conv2d (since feature version 2)
    assert np.isfinite(m[rows["est_log_s"]])
    assert np.isfinite(c[rows["est_log_s"]])
    assert 0 < c[rows["register_pressure"]] <= 1
    illegal = F.features(*golden_inputs()[4])
    assert illegal[rows["legal"]] == 0 and np.isnan(illegal[rows["est_log_s"]])


def test_edge_and_balance_features_follow_the_shape():
    idx = F.FEATURE_NAMES.index
    op = matmul_op(97, 13, 511)
    s = MatmulSchedule(mr=8, nr=16, kc=128, mc=96, nc=16, threads=2)
    v = F.features(op, s, AVX512)
    assert v[idx("edge_eff_m")] == pytest.approx(97 / 104)
    assert v[idx("edge_eff_n")] == pytest.approx(13 / 16)
    assert v[idx("parallel_balance")] == pytest.approx((96 + 8) / 2 / 96)


def test_matrix_matches_rows_on_real_measurements():
    df = fixture_frame()
    X, ok = F.feature_matrix(df)
    assert ok.all() and X.shape == (len(df), len(F.FEATURE_NAMES))
    from tunecache.compiler.schedule import schedule_from_json

    for i in range(0, len(df), max(1, len(df) // 25)):
        row = df.iloc[i]
        one = F.features(OpSignature.parse(row.op_text), schedule_from_json(row.schedule_json),
                         HardwareSpec.from_json(row.hw_json))
        np.testing.assert_array_equal(one, X[i])


def test_unreadable_rows_are_flagged_not_fatal():
    op, s, hw = golden_inputs()[0]
    df = pd.DataFrame({
        "op_text": [op.text, "matmul(M=oops)", op.text, op.text],
        "schedule_json": [s.to_json(), s.to_json(), None, s.to_json()],
        "hw_json": [hw.to_json(), hw.to_json(), hw.to_json(), "{not json"],
    })
    X, ok = F.feature_matrix(df)
    assert ok.tolist() == [True, False, False, False]
    assert np.isnan(X[1:]).all()
    np.testing.assert_array_equal(X[0], F.features(op, s, hw))
    with pytest.raises(F.FeatureError, match="hw_json"):
        F.feature_matrix(df.drop(columns=["hw_json"]))
