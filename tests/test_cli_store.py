"""The ``tunecache cache`` and ``tunecache dataset`` commands."""

from __future__ import annotations

import json

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from click.testing import CliRunner

from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.datasets.records import Record
from tunecache.tuner.cli import main

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
A = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)


def _fill(root: str) -> None:
    ops = [matmul_op(64, 64, 64 * i) for i in range(1, 4)]
    Store(root).append([Record.create(op=op, hw=HW, schedule=A, status=s, runtimes_s=[1e-3])
                        for op in ops for s in ("ok", "timeout")])


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_cli_round_trip(tmp_path):
    root = str(tmp_path / "store")
    _fill(root)
    code, out = run("dataset", "show", "--root", root, "--json")
    assert code == 0
    rows = json.loads(out)
    assert rows[0]["records"] == 6
    assert rows[0]["ok"] == 3
    assert rows[0]["ops"] == 3
    code, out = run("dataset", "show", "--root", root)
    assert code == 0
    assert "op_kind" in out
    assert HW.hw_id in out

    code, out = run("cache", "publish", "--root", root, "--json")
    assert code == 0
    assert json.loads(out)[0]["entries"] == 3
    code, out = run("cache", "stats", "--root", root, "--json")
    stats = json.loads(out)
    assert stats["partitions"][0]["rows"] == 6
    assert stats["published"][HW.hw_id]["entries"] == 3
    assert run("cache", "stats", "--root", root)[0] == 0

    _fill(root)
    code, out = run("cache", "compact", "--root", root, "--json")
    assert code == 0
    assert json.loads(out)["fragments_after"] == 1
    code, out = run("cache", "verify", "--root", root, "--json")
    assert code == 0
    assert json.loads(out)["ok"] is True

    dest = tmp_path / "published.parquet"
    code, out = run("cache", "export", str(dest), "--root", root, "--json")
    assert code == 0
    assert pq.read_table(dest).num_rows == 3
    csv = tmp_path / "records.csv"
    code, out = run("cache", "export", str(csv), "--root", root, "--records")
    assert code == 0
    assert pacsv.read_csv(csv).num_rows == 12


def test_cli_errors_and_rollback(tmp_path):
    root = str(tmp_path / "store")
    _fill(root)
    run("cache", "publish", "--root", root)
    code, out = run("cache", "rollback", HW.hw_id, "--root", root)
    assert code == 2
    assert "error:" in out
    assert "no snapshot older" in out
    code, out = run("cache", "rollback", "../etc", "--root", root)
    assert code == 2
    assert "not usable as a store path part" in out
    fragment = Store(root).fragments()[0]
    with open(fragment.path, "r+b") as handle:
        handle.truncate(100)
    code, out = run("cache", "verify", "--root", root)
    assert code == 1
    assert "damaged" in out.lower()
