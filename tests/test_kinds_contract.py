"""The contract every registered op kind keeps, checked on each kind's example ops: the three
layers exist, the tiler proposes legal schedules, refinement stays legal, the kernel the
tiler ranks first computes the reference, and records, features and the schedule JSON carry
the kind without kind-specific code."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds import all_kinds, kind_names, op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, in_model, problems, schedule_from_json
from tunecache.costmodel import features as F
from tunecache.costmodel.kinds import cost_kind
from tunecache.datasets.records import Record, records_from_table, records_to_table
from tunecache.tuner.kinds import tuner_kind
from tunecache.tuner.search.roller import candidates, exhaustive_space
from tunecache.tuner.search.tune import neighbours

HW = local_spec()
EXAMPLES = [(kind.name, text) for kind in all_kinds() for text in kind.examples]


def test_every_kind_has_examples_and_all_three_layers() -> None:
    for kind in all_kinds():
        assert kind.examples, f"{kind.name} has no example ops"
        assert cost_kind(kind.name).name == kind.name
        assert tuner_kind(kind.name).name == kind.name
        assert f"kind_{kind.name}" in F.FEATURE_NAMES


@pytest.mark.parametrize(("name", "text"), EXAMPLES)
def test_example_parses_to_its_kind_and_round_trips(name: str, text: str) -> None:
    op = OpSignature.parse(text)
    assert op.kind == name and OpSignature.parse(op.text) == op
    assert op.flops > 0 and op.min_bytes > 0


@pytest.mark.parametrize(("name", "text"), EXAMPLES)
def test_tiler_and_refinement_stay_legal(name: str, text: str) -> None:
    op = OpSignature.parse(text)
    ranked = candidates(op, HW, k=6)
    assert ranked, f"no candidates for {text}"
    assert [c.rank for c in ranked] == list(range(len(ranked)))
    seconds = [c.estimate.seconds for c in ranked]
    assert seconds == sorted(seconds) and all(s > 0 for s in seconds)
    for c in ranked:
        assert not problems(op, c.schedule, HW)
        for s in neighbours(op, c.schedule, HW):
            assert not problems(op, s, HW) and s != c.schedule
    grid = exhaustive_space(op, HW, limit=12, seed=1)
    assert grid and all(not problems(op, s, HW) for s in grid)
    two = replace(HW, cores=2)  # where a kind's in_model re-fits a thread split
    for s in [c.schedule for c in candidates(op, two, k=6)] + exhaustive_space(op, two, limit=12):
        assert not problems(op, in_model(op, s), two), (text, str(s))


@pytest.mark.parametrize(("name", "text"), EXAMPLES)
def test_top_candidate_and_default_compute_the_reference(name: str, text: str) -> None:
    op = OpSignature.parse(text)
    inputs = random_inputs(op, seed=3)
    expected = reference(op, inputs)
    for schedule in (candidates(op, HW, k=1)[0].schedule, default_schedule(op, HW, 1)):
        out = compile_kernel(op, schedule, HW)(*inputs)
        assert check_result(op, inputs, out, expected) is None, (text, str(schedule))


@pytest.mark.parametrize(("name", "text"), EXAMPLES)
def test_records_and_features_carry_the_kind(name: str, text: str) -> None:
    op = OpSignature.parse(text)
    schedule = candidates(op, HW, k=1)[0].schedule
    assert schedule_from_json(schedule.to_json()) == schedule
    record = Record.create(op=op, hw=HW, status="ok", schedule=schedule,
                           runtimes_s=(1e-4, 2e-4, 1.5e-4))
    [back] = records_from_table(records_to_table([record]))
    assert back.op_kind == name and back.schedule_json == schedule.to_json()
    for dim, column in op_kind(name).dim_columns.items():
        assert getattr(back, column) == op.dim(dim)
    for knob, value in schedule.knobs().items():
        assert getattr(back, knob) == value
    row = F.features(op, schedule, HW)
    assert row[F.FEATURE_NAMES.index(f"kind_{name}")] == 1
    assert row[F.FEATURE_NAMES.index("legal")] == 1
    assert np.isfinite(row[F.FEATURE_NAMES.index("est_log_s")])


def test_registry_lists_builtins_first_and_refuses_unknown_kinds() -> None:
    names = kind_names()
    assert names[:3] == ("matmul", "batch_matmul", "conv2d")
    with pytest.raises(Exception, match="unknown kind 'conv9d'"):
        op_kind("conv9d")


def test_layers_and_backends_name_what_is_missing() -> None:
    from tunecache.compiler.backends import backend_for
    from tunecache.compiler.errors import OpSignatureError

    with pytest.raises(OpSignatureError, match=r"cost model has no module for op kind 'conv9d' "
                                               r"\(costmodel/kinds/conv9d.py\)"):
        cost_kind("conv9d")
    with pytest.raises(OpSignatureError, match=r"tiler has no model for op kind 'conv9d' "
                                               r"\(tuner/kinds/conv9d.py\)"):
        tuner_kind("conv9d")
    assert backend_for(HW).name == "cpu"
    gpu = HW.with_isa("generic")
    object.__setattr__(gpu, "isa", "sm_90")  # a device no registered backend serves
    with pytest.raises(ValueError, match=r"no backend generates code for .*sm_90; backends: .*cpu"):
        backend_for(gpu)
