"""The object-store code path against a real S3-compatible server process on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunecache.compiler.hardware import HardwareSpec

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")


_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    # The moto_server of this interpreter's environment (the test extra), not another on PATH.
    exe = str(Path(sys.executable).with_name("moto_server"))
    if not Path(exe).exists():
        exe = shutil.which("moto_server") or exe
    if not Path(exe).exists():
        pytest.skip("moto_server not installed (pip install 'moto[server]'); "
                    "no local S3-compatible server to test against")
    port = _free_port()
    server = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, **_CREDENTIALS})
    endpoint = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("moto_server could not be started on loopback")
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def s3_root(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    import pyarrow.fs as pafs

    for key, value in _CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    bucket = f"tunecache-{uuid.uuid4().hex[:12]}"
    fs = pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", region="us-east-1",
                           allow_bucket_creation=True)
    fs.create_dir(bucket)
    return f"s3://{bucket}/store?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1"


_SCENARIO = textwrap.dedent("""
    import sys
    from tunecache.cache.index import Index
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.kinds.matmul import matmul_op
    from tunecache.compiler.kinds.matmul.space import MatmulSchedule
    from tunecache.datasets.records import Record

    root, hw = sys.argv[1], HardwareSpec.from_json(sys.argv[2])
    op = matmul_op(128, 128, 128)
    a = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)
    b = MatmulSchedule(mr=4, nr=16, kc=128, mc=64, nc=512)

    def rec(schedule, median):
        return Record.create(op=op, hw=hw, schedule=schedule, status="ok", median_s=median,
                             runtimes_s=[median])

    store = Store(root)
    store.append([rec(a, 2.0), rec(b, 3.0)])
    store.append([rec(b, 1.0)])
    assert len(store.fragments()) == 2
    assert sorted(store.load()["median_s"].tolist()) == [1.0, 2.0, 3.0]
    first = store.publish()[0]
    assert first.changed and not store.publish()[0].changed
    entry = Index(root, hw.hw_id).lookup(op)
    assert entry is not None and entry.schedule == a  # b's median of (3.0, 1.0) ties: id order
    store.append([rec(b, 0.5)])
    assert store.publish()[0].changed
    entry = Index(root, hw.hw_id).lookup(op)
    assert entry is not None and entry.schedule == b
    assert store.rollback(hw.hw_id).snapshot == first.snapshot
    assert store.compact().fragments_after == 1
    assert store.scan().num_rows == 4
    report = store.verify()
    assert report.ok and report.rows == 4
    print("scenario ok")
""")


@pytest.mark.timeout(120)
def test_store_round_trip_on_s3(s3_root: str):
    # The scenario runs in a fresh process: AWS SDK state of the pytest process is not reused.
    done = subprocess.run([sys.executable, "-c", _SCENARIO, s3_root, HW.to_json()],
                          capture_output=True, text=True, timeout=100, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scenario ok" in done.stdout
