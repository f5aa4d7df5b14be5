"""Every CLI failure is one ``error: …`` line (exit 2 for bad input, 1 for the environment),
never a traceback unless asked for with ``--debug``; durations parse as people write them."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tunecache.tuner.cli import main
from tunecache.tuner.cli.common import BudgetError, parse_duration

pytestmark = pytest.mark.fault


def tunecache(*args: str, env: dict[str, str] | None = None,
              stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def assert_one_error_line(out: subprocess.CompletedProcess[str] | Result, code: int,
                          fragment: str) -> None:
    stderr = out.stderr
    status = out.returncode if isinstance(out, subprocess.CompletedProcess) else out.exit_code
    assert status == code, (status, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert fragment in lines[0], stderr
    assert "Traceback" not in stderr


# -- D: durations ------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("1h30", 5400),
    ("1.5h", 5400), ("1m30", 90), ("1h30m15s", 5415), (" 2H ", 7200), ("0.5", 0.5),
])
def test_durations_read_as_written(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "", "1h1h", "30m1h", "1s30", "-5", "1e3", "1..5h",
                                  "h", "1x", "9" * 20])
def test_bad_durations_name_the_accepted_forms(text: str) -> None:
    with pytest.raises(BudgetError, match=r"not a duration; use 90 or 90s .*1h30m, or 1h30"):
        parse_duration(text, "--budget")


def test_bad_budget_is_one_line(tmp_path: Path) -> None:
    out = tunecache("tune", "--op", "matmul(M=8,N=8,K=8)", "--budget", "1h1h",
                    "--root", str(tmp_path))
    assert_one_error_line(out, 2, "--budget '1h1h' is not a duration")
    assert "1h30 (= 1h30m" in out.stderr


# -- B: one line, right exit status ------------------------------------------------------


def test_click_usage_errors_are_one_line() -> None:
    for args, fragment in [
        (("bench-op",), "Missing argument 'OP'. (see 'tunecache bench-op --help')"),
        (("no-such-command",), "No such command 'no-such-command'"),
        (("candidates", "matmul(M=8,N=8,K=8)", "--k", "0"), "Invalid value for '--k'"),
        (("hw", "--no-such-flag"), "--no-such-flag"),
    ]:
        assert_one_error_line(tunecache(*args), 2, fragment)


def test_absurd_dims_and_deep_schedules_are_input_errors(tmp_path: Path) -> None:
    huge = tunecache("bench-op", f"matmul(M={'9' * 4301},N=2,K=3)")
    assert_one_error_line(huge, 2, "dim M has 4301 digits; dims are at most 2147483647")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    big = tunecache("bench-op", "matmul(M=8,N=8,K=8)", "--schedule", f"@{deep}")
    assert_one_error_line(big, 2, "larger than a schedule can be")
    nested = tunecache("bench-op", "matmul(M=8,N=8,K=8)", "--schedule",
                       "[" * 20_000 + "]" * 20_000)
    assert_one_error_line(nested, 2, "schedule is not valid JSON")


def test_write_errors_are_environment_errors(tmp_path: Path) -> None:
    if not Path("/dev/full").is_char_device():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        out = tunecache("hw", "--json", stdout=full.fileno())
    assert_one_error_line(out, 1, "No space left on device")
    missing = tmp_path / "no-such-dir" / "out.parquet"
    export = tunecache("cache", "export", str(missing), "--root", str(tmp_path / "store"))
    assert_one_error_line(export, 1, "no-such-dir")


def test_garbage_inputs_file_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    import onnx
    from onnx_support import mlp_model

    model = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(model))
    for name, content in [("zip.npz", b"PK\x03\x04" + b"\x00garbage" * 8),
                          ("text.npz", b"not an npz at all")]:
        inputs = tmp_path / name
        inputs.write_bytes(content)
        out = tunecache("run", str(model), "--inputs", str(inputs), "--repeat", "1",
                        "--policy", "analytic", "--root", str(tmp_path / "store"))
        assert_one_error_line(out, 2, "cannot read input")


def _raising(exc: BaseException) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    return fail


@pytest.mark.parametrize(("exc", "code", "fragment"), [
    (MemoryError(), 1, "error: out of memory"),
    (OSError(errno.ENOSPC, "No space left on device", "/dev/full"), 1,
     "error: No space left on device: /dev/full"),
    (RecursionError("maximum recursion depth exceeded"), 2, "nested too deeply"),
    (KeyError("surprise"), 1, "unexpected KeyError: 'surprise' (rerun with --debug"),
])
def test_group_handler_maps_failures(monkeypatch: pytest.MonkeyPatch, exc: BaseException,
                                     code: int, fragment: str) -> None:
    monkeypatch.delenv("TUNECACHE_DEBUG", raising=False)
    monkeypatch.setattr("tunecache.tuner.cli.compiler.local_spec", _raising(exc))
    result = CliRunner().invoke(main, ["hw"])
    assert_one_error_line(result, code, fragment)


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tunecache.tuner.cli.compiler.local_spec", _raising(MemoryError()))
    for args, env in ((["--debug", "hw"], None), (["hw"], "1")):
        if env is None:
            monkeypatch.delenv("TUNECACHE_DEBUG", raising=False)
        else:
            monkeypatch.setenv("TUNECACHE_DEBUG", env)
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1
        assert "Traceback" in result.stderr and "MemoryError" in result.stderr
        assert result.stderr.strip().splitlines()[-1] == "error: out of memory"


def test_truncated_kernel_in_the_build_cache_is_rebuilt(tmp_path: Path) -> None:
    env = {"TUNECACHE_BUILD_CACHE": str(tmp_path / "kernels")}
    args = ("bench-op", "matmul(M=16,N=32,K=8)", "--no-baseline", "--no-record",
            "--min-time", "0.01")
    assert tunecache(*args, env=env).returncode == 0
    objects = list((tmp_path / "kernels").rglob("*.so"))
    assert objects
    for so in objects:
        so.write_bytes(so.read_bytes()[:100])
    again = tunecache(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert all(so.stat().st_size > 100 for so in objects)


def test_export_to_a_pipe_streams_and_leaves_it_in_place(tmp_path: Path) -> None:
    # pyarrow deletes a path it fails to write; a device or a pipe must never be replaced.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c",
                               f"import sys; sys.stdout.write(str(len(open({str(fifo)!r}, 'rb')"
                               ".read())))"], stdout=subprocess.PIPE, text=True)
    export = tunecache("cache", "export", str(fifo), "--root", str(tmp_path / "store"))
    got, _ = reader.communicate(timeout=60)
    assert export.returncode == 0, export.stderr
    assert int(got) > 0 and fifo.is_fifo()


def test_export_failure_leaves_no_partial_file(tmp_path: Path) -> None:
    dest = tmp_path / "out.parquet"
    dest.write_bytes(b"previous export")
    export = tunecache("cache", "export", str(dest), "--root", str(tmp_path / "store"),
                       "--format", "csv")
    assert export.returncode == 0
    assert dest.read_bytes() != b"previous export"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_warning_is_one_line_without_its_source(tmp_path: Path) -> None:
    # A damaged CURRENT pointer: the next publish replaces it and warns (issue 55's probe saw
    # Python's file:line and the source line of warnings.warn here).
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.compiler.kinds.matmul import matmul_op
    from tunecache.compiler.kinds.matmul.space import MatmulSchedule
    from tunecache.datasets.records import Record

    hw, root = local_spec(), tmp_path / "store"
    schedule = MatmulSchedule(mr=4, nr=16, kc=64, mc=64, nc=64)
    Store(root).append([Record.create(op=matmul_op(16, 16, 16), hw=hw, schedule=schedule,
                                      status="ok", runtimes_s=[1e-3])])
    assert tunecache("cache", "publish", "--root", str(root)).returncode == 0
    pointer = root / "published" / hw.hw_id / "CURRENT"
    pointer.write_text("{not json")
    out = tunecache("cache", "publish", "--root", str(root))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: "), out.stderr
    assert "damaged pointer" in lines[0] and "UserWarning" not in out.stderr


@pytest.mark.parametrize("command", [["cache", "stats"], ["cache", "verify"], ["dataset", "show"],
                                     ["model", "show"]])
def test_a_store_root_that_is_a_file_is_an_input_error(tmp_path: Path, command: list[str]) -> None:
    # It used to read as an empty store: `cache verify` said ok.
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    assert_one_error_line(tunecache(*command, "--root", str(afile)), 2,
                          f"{afile} is not a folder")
    assert_one_error_line(tunecache(*command, env={"TUNECACHE_HOME": str(afile)}), 2,
                          f"{afile} ($TUNECACHE_HOME) is not a folder")


def test_run_inputs_that_are_not_an_npz_archive_are_one_line(tmp_path: Path) -> None:
    import numpy as np

    np.save(tmp_path / "plain.npy", np.ones(3, np.float32))
    out = tunecache("run", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "plain.npy"))
    assert_one_error_line(out, 2, "not an .npz archive of named arrays")
