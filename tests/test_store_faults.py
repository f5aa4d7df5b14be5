"""The store under faults: damaged fragments and snapshots, forged or misplaced records,
compiler skew, and deploys against stores that are read-only, full, unreachable or damaged.

Each test names the defect of issue 16 it pins (see docs/STORE.md, "Guarantees").
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from tunecache.cache import paths
from tunecache.cache.errors import SnapshotError, StoreWarning
from tunecache.cache.index import Index, SnapshotWarning, compiler_key
from tunecache.cache.publish import snapshot_bytes, snapshot_digest
from tunecache.cache.store import Store
from tunecache.cache.wanted import WANTED_DIR, add_wanted
from tunecache.compiler.backends.cpu.build import find_compiler
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.datasets import fs
from tunecache.datasets.records import Record, records_to_table
from tunecache.tuner.deploy import compile_model

pytestmark = pytest.mark.fault

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
OP = matmul_op(256, 256, 256)
OP2 = batch_matmul_op(8, 64, 64, 64, trans_b=True)
A = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)
B = MatmulSchedule(mr=4, nr=16, kc=128, mc=64, nc=512)
# What a hostile user appends: measured "fast", illegal everywhere.
FORGED = A.replace(mr=1000, mc=1000, loop_order="xyz", threads=64)

GCC12 = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0;x86_64-linux-gnu"
CLANG = "Debian clang version 16.0.6;x86_64-pc-linux-gnu"


def rec(op: OpSignature, schedule: MatmulSchedule, median: float, hw: HardwareSpec = HW,
        **kw: object) -> Record:
    return Record.create(op=op, hw=hw, schedule=schedule, status="ok", median_s=median,
                         runtimes_s=[median], **kw)


def tunecache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def errors_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def snapshot_file(root: Path, hw_id: str = HW.hw_id) -> Path:
    current = Store(root).current(hw_id)
    assert current is not None
    return root / "published" / hw_id / current.snapshot


# -- 1: damaged fragments and lost entries -------------------------------------------------


def test_publish_refuses_a_snapshot_read_from_damaged_fragments(tmp_path: Path) -> None:
    """Defect 1: one damaged fragment made a 0-entry snapshot current, exit 0."""
    root = tmp_path / "store"
    [path] = Store(root).append([rec(OP, A, 1.0), rec(OP, B, 2.0)])
    Path(path).write_bytes(Path(path).read_bytes()[:100])

    out = tunecache("cache", "publish", "--root", str(root))
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    [error] = errors_of(out.stderr)
    assert "damaged record fragment" in error and "--force" in error
    assert path in out.stderr  # the damaged fragment is named
    assert Store(root).current(HW.hw_id) is None  # nothing became current

    out = tunecache("cache", "publish", "--root", str(root), "--json")
    assert out.returncode == 1
    [result] = json.loads(out.stdout)
    assert result["refused"] and len(result["damaged"]) == 1
    assert result["damaged"][0].startswith(path)

    out = tunecache("cache", "publish", "--root", str(root), "--force", "--json")
    assert out.returncode == 0, out.stderr
    [result] = json.loads(out.stdout)
    assert result["changed"] and result["refused"] is None and len(result["damaged"]) == 1
    assert Store(root).current(HW.hw_id) is not None


def test_publish_refuses_to_drop_entries_the_current_snapshot_serves(tmp_path: Path) -> None:
    """Defect 1: a snapshot that loses entries (records gone) must not become current."""
    store = Store(tmp_path)
    [old_x] = store.append([rec(OP, A, 1.0, compiler=GCC12)])
    [y] = store.append([rec(OP2, B, 1.0)])
    first = store.publish()[0]
    assert first.entries == 2

    os.unlink(y)  # the records of OP2 are gone (nothing is damaged)
    [refused] = store.publish()
    assert refused.lost == 1 and not refused.changed
    assert refused.refused is not None and "drop 1 of the 2 entries" in refused.refused
    assert store.current(HW.hw_id).snapshot == first.snapshot  # type: ignore[union-attr]
    assert Index(tmp_path, HW.hw_id).lookup(OP2) is not None

    [forced] = store.publish(force=True)
    assert forced.changed and forced.entries == 1 and forced.lost == 1
    assert Index(tmp_path, HW.hw_id).lookup(OP2) is None

    # An entry whose key disappears but whose op has a newer measurement is replaced, not lost.
    store.append([rec(OP, B, 3.0, compiler="gcc (GCC) 13.2.0;x86_64-linux-gnu")])
    os.unlink(old_x)
    [replaced] = store.publish()
    assert replaced.changed and replaced.refused is None and replaced.lost == 0


# -- 2: a damaged current snapshot ---------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_damaged_current_snapshot_is_absent_for_deploy_and_rebuilt_by_publish(
        tmp_path: Path, damage: str) -> None:
    """Defect 2: publish said "nothing changed" over a damaged snapshot, forever."""
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0), rec(OP2, B, 1.0)])
    first = store.publish()[0]
    path = snapshot_file(tmp_path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:  # a readable Parquet file, but not the one published: another schedule for OP
        table = pq.read_table(path)
        forged = pc.if_else(pc.equal(table["op_text"], OP.text), B.to_json(),
                            table["schedule_json"])
        table = table.set_column(table.schema.get_field_index("schedule_json"),
                                 "schedule_json", forged)
        table = table.set_column(table.schema.get_field_index("schedule_id"), "schedule_id",
                                 pc.if_else(pc.equal(table["op_text"], OP.text),
                                            B.schedule_id, table["schedule_id"]))
        pq.write_table(table, path)

    with pytest.warns(SnapshotWarning, match="cannot read"):
        index = Index(tmp_path, HW.hw_id)
    assert len(index) == 0  # absent, never half-trusted
    report = store.verify()
    assert not report.ok
    assert any(HW.hw_id in p for p in report.problems)

    [result] = store.publish()
    assert result.changed and result.repaired and result.refused is None
    assert result.snapshot != first.snapshot
    entry = Index(tmp_path, HW.hw_id).lookup(OP)
    assert entry is not None and entry.schedule == A
    assert store.verify().ok
    assert not store.publish()[0].changed


# -- 3: validation against the op and its hardware -----------------------------------------


def test_publish_serves_the_best_legal_schedule_not_a_forged_illegal_one(tmp_path: Path) -> None:
    """Defect 3: an illegal forged record won publish; now it is rejected and counted."""
    assert problems(OP, FORGED, HW) and not problems(OP, A, HW)
    root = tmp_path / "store"
    store = Store(root)
    store.append([rec(OP, A, 1.0), rec(OP, B, 2.0), rec(OP2, FORGED, 1e-4)]
                 + [rec(OP, FORGED, 1e-4) for _ in range(3)])
    out = tunecache("cache", "publish", "--root", str(root), "--json")
    assert out.returncode == 0, out.stderr
    [result] = json.loads(out.stdout)
    assert result["entries"] == 1  # OP2 has no legal schedule: not published at all
    assert result["rejected"] == 4
    assert all("illegal on" in r and "mr=1000" in r for r in result["rejections"])
    entry = Index(root, HW.hw_id).lookup(OP)
    assert entry is not None and entry.schedule == A
    assert Index(root, HW.hw_id).lookup(OP2) is None
    text = tunecache("cache", "publish", "--root", str(root))
    assert "rejected" in text.stdout and "4 record(s) rejected" in text.stderr


def test_schedules_are_judged_on_the_hardware_they_were_measured_on(tmp_path: Path) -> None:
    """Defect 3: legality is per hardware: 3 threads are legal on 4 cores, not on 2."""
    small = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=2,
                         l1d_bytes=32768, l2_bytes=1 << 20, l3_bytes=8 << 20,
                         cpu_model="Test CPU")
    three = A.replace(threads=3)
    store = Store(tmp_path)
    store.append([rec(OP, three, 1.0), rec(OP, A, 2.0),
                  rec(OP, three, 1.0, hw=small), rec(OP, A, 2.0, hw=small)])
    results = {r.hw_id: r for r in store.publish()}
    assert (results[HW.hw_id].rejected, results[small.hw_id].rejected) == (0, 1)
    assert Index(tmp_path, HW.hw_id).lookup(OP).schedule == three  # type: ignore[union-attr]
    assert Index(tmp_path, small.hw_id).lookup(OP).schedule == A  # type: ignore[union-attr]


# -- 4: the index serves the JSON's schedule -----------------------------------------------


def test_index_serves_the_json_schedule_never_the_typed_knob_columns(tmp_path: Path) -> None:
    """Defect 4: typed knob columns (version 1 snapshots) that disagree with the JSON are
    never what is served; a row whose JSON does not hash to its id is not served at all."""
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0), rec(OP2, B, 1.0)])
    store.publish()
    snapshot = store.read_snapshot(HW.hw_id)
    v1 = snapshot.set_column(0, "snapshot_version",
                             pa.array([1] * snapshot.num_rows, pa.int16()))
    for name, value in FORGED.knobs().items():  # typed columns say FORGED, the JSON says A/B
        type_ = pa.string() if isinstance(value, str) else pa.int32()
        v1 = v1.append_column(name, pa.array([value] * snapshot.num_rows, type_))
    is_op2 = pc.equal(v1["op_text"], OP2.text)
    v1 = v1.set_column(v1.schema.get_field_index("schedule_json"), "schedule_json",
                       pc.if_else(is_op2, A.to_json(), v1["schedule_json"]))  # id stays B's
    name = paths.new_snapshot_name(snapshot_digest(v1))
    (tmp_path / "published" / HW.hw_id / name).write_bytes(snapshot_bytes(v1).to_pybytes())
    store.rollback(HW.hw_id, to=name)
    index = Index(tmp_path, HW.hw_id)
    assert index.lookup(OP).schedule == A  # type: ignore[union-attr]
    assert index.lookup(OP2) is None and index.ignored == 1


# -- 5: the partition must be the op's kind ------------------------------------------------


def test_a_record_in_the_wrong_op_kind_partition_is_rejected(tmp_path: Path) -> None:
    """Defect 5: a matmul record stored under op_kind=conv2d was published as conv2d."""
    store = Store(tmp_path)
    store.append([rec(OP, B, 2.0)])
    misplaced = records_to_table([rec(OP, A, 1.0)])
    misplaced = misplaced.set_column(misplaced.schema.get_field_index("op_kind"), "op_kind",
                                     pa.array(["conv2d"], pa.string()))
    [path] = store.append(misplaced)
    assert "op_kind=conv2d" in path
    [result] = store.publish()
    assert result.rejected == 1
    assert "stored under op_kind=conv2d" in result.rejections[0]
    snapshot = store.read_snapshot(HW.hw_id)
    assert snapshot["op_kind"].to_pylist() == ["matmul"]
    assert snapshot["schedule_id"].to_pylist() == [B.schedule_id]


# -- 6: verify reads wanted/ and models/ ---------------------------------------------------


def test_verify_reads_the_wanted_list_and_the_models(tmp_path: Path) -> None:
    """Defect 6: `cache verify` ignored wanted/ and models/."""
    from costmodel_support import fixture_frame

    from tunecache.costmodel import registry
    from tunecache.costmodel.model import CostModel, TrainParams, prepare

    root = tmp_path / "store"
    store = Store(root)
    store.append([rec(OP, A, 1.0)])
    add_wanted(store.location, HW.hw_id, [(OP, 3, "m")])
    version = registry.save(CostModel.fit(prepare(fixture_frame()), TrainParams(rounds=5)),
                            str(root))
    report = store.verify()
    assert report.ok, (report.damaged, report.problems)
    assert report.wanted_files == 1 and report.models == [version]

    bad_wanted = root / WANTED_DIR / f"hw_id={HW.hw_id}" / "part-20260101T000000000000Z-x.parquet"
    bad_wanted.write_bytes(b"PAR1 not parquet")
    model_json = root / "models" / version / "model.json"
    model_json.write_text(model_json.read_text().replace("1", "2", 1))
    report = store.verify()
    assert not report.ok
    assert [p for p, _ in report.damaged] == [str(bad_wanted)]
    assert any("does not match meta.json" in p for p in report.problems)
    assert any(f"CURRENT names {version}" in p for p in report.problems)
    out = tunecache("cache", "verify", "--root", str(root))
    assert out.returncode == 1 and str(bad_wanted) in out.stdout

    (root / "models" / "CURRENT").write_text("{broken")
    assert any("models/CURRENT is damaged" in p for p in store.verify().problems)


# -- 7: compiler skew ----------------------------------------------------------------------


def test_compiler_identity_is_matched_by_family_and_major_version(tmp_path: Path) -> None:
    """Defect 7: the index served schedules measured with any compiler."""
    assert compiler_key(GCC12) == compiler_key("cc (Debian 12.2.0-14) 12.2.0") == "gcc 12"
    assert compiler_key(CLANG) == "clang 16"
    assert compiler_key("gcc (GCC) 13.2.0;x86_64-linux-gnu") == "gcc 13"
    store = Store(tmp_path)
    store.append([rec(OP, A, 2.0, compiler=GCC12), rec(OP, B, 1.0, compiler=CLANG),
                  rec(OP, B.replace(threads=2), 0.5, compiler="gcc (GCC) 13.2.0;x86_64")])
    store.publish()
    local = "gcc (Debian 12.2.0-14+deb12u2) 12.2.0;x86_64-linux-gnu"  # another patch level
    entry = Index(tmp_path, HW.hw_id, compiler=local).lookup(OP)
    assert entry is not None and entry.schedule == A and entry.compiler == GCC12
    assert Index(tmp_path, HW.hw_id, compiler="clang version 17.0.1;x86_64").lookup(OP) is None


# -- deploys (3, 7, 8) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_matmul(tmp_path_factory: pytest.TempPathFactory) -> Path:
    weight = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [numpy_helper.from_array(weight, "w")])
    path = tmp_path_factory.mktemp("models") / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


MM = matmul_op(8, 16, 32)


def test_deploy_serves_the_local_compilers_best_legal_schedule(one_matmul: Path,
                                                               tmp_path: Path) -> None:
    """Defects 3 and 7 at deploy: neither a forged illegal record nor a faster schedule of
    another compiler is served; the best legal one of the local compiler family is."""
    hw, local = local_spec(), find_compiler().identity
    legal = MatmulSchedule(mr=4, nr=16, kc=32, mc=8, nc=16, pack_a=0, pack_b=0)
    other = legal.replace(kc=16)
    assert not problems(MM, legal, hw) and not problems(MM, other, hw)
    store = Store(tmp_path)
    store.append([rec(MM, legal, 2e-3, hw=hw, compiler=local),
                  rec(MM, FORGED, 1e-6, hw=hw, compiler=local),
                  rec(MM, other, 1e-3, hw=hw, compiler="clang version 99.0.0;x86_64")])
    assert store.publish()[0].rejected == 1
    compiled = compile_model(one_matmul, store=store, policy="analytic", hw=hw)
    [entry] = compiled.plan
    assert (entry.action, entry.schedule) == ("cache", legal), entry.reason


def test_compile_on_a_read_only_store_warns_and_goes_on(one_matmul: Path,
                                                        tmp_path: Path) -> None:
    """Defect 8: recording the miss crashed the compile when the store cannot be written
    (here: its parent is a regular file, which even root cannot write under)."""
    (tmp_path / "file").write_text("")
    out = tunecache("compile", str(one_matmul), "--root", str(tmp_path / "file" / "store"),
                    "--policy", "analytic", "--json")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert json.loads(out.stdout)["actions"] == {"guess": 1}
    [warning] = [line for line in out.stderr.splitlines() if "wanted list" in line]
    assert warning.startswith("warning:") and "Not a directory" in warning


def test_compile_on_a_full_disk_warns_and_goes_on(one_matmul: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 8: ENOSPC while recording measurements or the wanted list is not fatal."""
    def full(*_args: object, **_kwargs: object) -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fs, "write_atomic", full)
    with pytest.warns(StoreWarning) as caught:
        compiled = compile_model(one_matmul, store=Store(tmp_path), policy="tune",
                                 use_model=False)
    [entry] = compiled.plan
    assert entry.action == "measure" and entry.schedule is not None
    messages = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert any("measurement" in m and "No space left on device" in m for m in messages)
    assert any("wanted list" in m and "No space left on device" in m for m in messages)
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    weight = onnx.numpy_helper.to_array(onnx.load(one_matmul).graph.initializer[0])
    np.testing.assert_allclose(compiled.run({"x": x})["y"], x @ weight, rtol=1e-4, atol=1e-4)


_UNREACHABLE = textwrap.dedent("""
    import json, sys, warnings
    import pyarrow.fs as pafs
    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model

    s3 = pafs.S3FileSystem(endpoint_override=sys.argv[2], scheme="http", region="us-east-1",
                           connect_timeout=1, request_timeout=1,
                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_model(sys.argv[1], store=Store("bucket/store", filesystem=s3),
                                 policy="analytic")
    print(json.dumps({"actions": compiled.summary()["actions"],
                      "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
""")


def test_compile_against_an_unreachable_store_warns_and_goes_on(one_matmul: Path) -> None:
    """Defect 8: an object store with no server behind it (fresh process: AWS SDK state)."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    done = subprocess.run(
        [sys.executable, "-c", _UNREACHABLE, str(one_matmul), endpoint],
        capture_output=True, text=True, timeout=200,
        env={**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_EC2_METADATA_DISABLED": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["actions"] == {"guess": 1}
    assert any(w.startswith("SnapshotWarning") for w in report["warnings"])
    assert any(w.startswith("StoreWarning") and "wanted list" in w for w in report["warnings"])


def test_compile_on_a_damaged_store_warns_and_goes_on(one_matmul: Path, tmp_path: Path) -> None:
    """Defect 8: a garbage pointer, a garbage model pointer and a wanted-list directory that
    is a file: the compile warns about each and still produces a working plan."""
    hw_id = local_spec().hw_id
    (tmp_path / "published" / hw_id).mkdir(parents=True)
    (tmp_path / "published" / hw_id / "CURRENT").write_text("{not json")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "CURRENT").write_text("{not json")
    (tmp_path / WANTED_DIR).mkdir()
    (tmp_path / WANTED_DIR / f"hw_id={hw_id}").write_text("not a directory")
    out = tunecache("compile", str(one_matmul), "--root", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert json.loads(out.stdout)["kernel_nodes"] == 1
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert any("damaged snapshot pointer" in w for w in warnings)
    assert any("wanted list" in w for w in warnings)


def test_a_fifo_in_place_of_current_is_damage_not_a_hang(tmp_path: Path) -> None:
    # Opening a FIFO for reading waits for a writer: one planted as CURRENT hung `cache
    # verify`, `cache publish` and `compile` (issue 55). Now it is a damaged pointer.
    root = tmp_path / "store"
    Store(root).append([rec(OP, A, 1e-3)])
    Store(root).publish()
    pointer = root / "published" / HW.hw_id / "CURRENT"
    pointer.unlink()
    os.mkfifo(pointer)
    verify = tunecache("cache", "verify", "--root", str(root))
    assert verify.returncode == 1 and "CURRENT pointer is not a regular file" in verify.stdout
    publish = tunecache("cache", "publish", "--root", str(root))
    assert publish.returncode == 0, publish.stderr
    assert "replacing a damaged pointer" in publish.stderr
    assert pointer.is_file() and Store(root).current(HW.hw_id) is not None


def test_a_pointer_past_the_size_limit_is_damage_not_read(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    Store(root).append([rec(OP, A, 1e-3)])
    Store(root).publish()
    monkeypatch.setattr(fs, "MAX_READ_BYTES", 16)  # a CURRENT pointer is a few hundred bytes
    with pytest.raises(SnapshotError, match="CURRENT pointer is larger than"):
        Store(root).current(HW.hw_id)
