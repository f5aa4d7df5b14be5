"""Nothing tunecache reads can hang or crash it (issue 55, item 2): a FIFO or an oversized
file where a user named a file is one `error:` line, store walks never follow a symbolic
link, and a hardware spec must describe a machine that could exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunecache.cache.store import Store
from tunecache.compiler.errors import HardwareError
from tunecache.compiler.hardware import HardwareSpec, local_spec, machine_cpus
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.costmodel.model import CostModel, ModelLoadError
from tunecache.datasets.records import Record

pytestmark = pytest.mark.fault

HW = local_spec()
OP = matmul_op(64, 64, 64)
OP_TEXT = "matmul(M=64,N=64,K=64)"


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    # A regression hangs on the FIFO: the timeout turns it into a failure.
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[-1], lines[-1]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "planted"
    os.mkfifo(path)
    return path


def test_a_fifo_as_a_hardware_spec_is_one_line(fifo: Path) -> None:
    one_error_line(tunecache("hw", "--hardware", str(fifo)), 2, "not a regular file")


def test_a_fifo_as_a_schedule_file_is_one_line(fifo: Path) -> None:
    one_error_line(tunecache("bench-op", OP_TEXT, "--schedule", f"@{fifo}"), 2,
                   "not a regular file")


def test_a_fifo_as_run_inputs_is_one_line(fifo: Path, tmp_path: Path) -> None:
    one_error_line(tunecache("run", str(tmp_path / "absent.onnx"), "--inputs", str(fifo)), 2,
                   "not a regular file")


def test_a_fifo_in_a_cost_model_directory_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "model.json")
    (model / "meta.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"cannot read model\.json: is not a regular file"):
        CostModel.load(model)


def test_an_oversized_hardware_spec_is_refused_unread(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    with spec.open("wb") as handle:
        handle.truncate(64 << 20)  # sparse: 64 MiB of zeros
    with pytest.raises(HardwareError, match="larger than 1 MiB"):
        HardwareSpec.from_file(spec)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cores", 1_000_000, "cores=1000000 is not plausible"),
    ("l2_bytes", 1 << 40, "is not plausible"),
    ("l1d_ways", 100_000, "is not plausible"),
    ("cache_line", 48, "power of two"),
    ("cache_line", 8, "power of two"),
])
def test_an_implausible_hardware_spec_is_refused(field: str, value: int, message: str) -> None:
    data = json.loads(HW.to_json())
    data[field] = value
    with pytest.raises(HardwareError, match=message):
        HardwareSpec.from_dict(data)


def test_thread_counts_are_bounded_by_the_machine(tmp_path: Path) -> None:
    one_error_line(tunecache("run", str(tmp_path / "m.onnx"), "--threads", "100000"), 2,
                   "--threads")
    one_error_line(tunecache("run", str(tmp_path / "m.onnx"), "--threads",
                             str(machine_cpus() + 1)), 2, "CPUs")


def record(median: float) -> Record:
    schedule = MatmulSchedule(mr=4, nr=16, kc=64, mc=64, nc=64)
    return Record.create(op=OP, hw=HW, schedule=schedule, status="ok", median_s=median,
                         runtimes_s=[median])


def test_store_walks_do_not_follow_links(tmp_path: Path) -> None:
    mine, elsewhere = Store(tmp_path / "mine"), Store(tmp_path / "elsewhere")
    mine.append([record(1e-3)])
    elsewhere.append([record(5e-4)])
    records = tmp_path / "mine" / "records"
    partition = next(p for p in (tmp_path / "elsewhere" / "records").rglob("op_kind=*"))
    linked = records / f"hw_id={HW.hw_id}" / "op_kind=linked"
    linked.symlink_to(partition, target_is_directory=True)
    (records / "loop").symlink_to(records, target_is_directory=True)
    fragment = next(partition.glob("*.parquet"))
    (next(records.rglob("op_kind=matmul")) / f"z{fragment.name}").symlink_to(fragment)
    assert len(mine.fragments()) == 1
    assert mine.load()["median_s"].tolist() == [pytest.approx(1e-3)]
