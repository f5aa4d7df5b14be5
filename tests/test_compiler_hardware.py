from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tunecache.compiler import hardware
from tunecache.compiler.errors import HardwareError
from tunecache.compiler.hardware import HardwareSpec, detect, local_spec
from tunecache.compiler.kinds.matmul import matmul_op

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Test CPU @ 2.00GHz
flags\t\t: fpu sse sse2 avx avx2 fma {extra}

processor\t: 1
model name\t: Test CPU @ 2.00GHz
"""


def fake_machine(root: Path, flags: str = "avx512f avx512bw avx512dq avx512vl",
                 l2: str = "1024K", cpus: str = "0-3") -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(CPUINFO.format(extra=flags))
    cpu = root / "sys" / "devices" / "system" / "cpu"
    (cpu / "online").parent.mkdir(parents=True)
    (cpu / "online").write_text(cpus + "\n")
    levels = [("1", "Data", "48K", "12", "0"), ("1", "Instruction", "32K", "8", "0"),
              ("2", "Unified", l2, "16", "0"), ("3", "Unified", "32768K", "16", cpus)]
    for i, (level, kind, size, ways, shared) in enumerate(levels):
        d = cpu / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, value in [("level", level), ("type", kind), ("size", size),
                            ("ways_of_associativity", ways), ("coherency_line_size", "64"),
                            ("shared_cpu_list", shared)]:
            (d / name).write_text(value + "\n")
    return root


def test_detect_reads_procfs_and_sysfs(tmp_path: Path) -> None:
    spec = detect(fake_machine(tmp_path))
    assert spec.isa == "avx512" and spec.vector_bits == 512 and spec.lanes == 16
    assert spec.cores == 4
    assert (spec.l1d_bytes, spec.l2_bytes, spec.l3_bytes) == (48 << 10, 1 << 20, 32 << 20)
    assert (spec.l1d_ways, spec.l2_ways, spec.l3_shared_by) == (12, 16, 4)
    assert spec.cpu_model == "Test CPU @ 2.00GHz"


def test_isa_levels_follow_flags(tmp_path: Path) -> None:
    assert detect(fake_machine(tmp_path / "a", flags="")).isa == "avx2"
    generic = fake_machine(tmp_path / "b", flags="")
    info = generic / "proc" / "cpuinfo"
    info.write_text(info.read_text().replace("avx2 fma", ""))
    assert detect(generic).isa == "generic"


def test_hw_id_equal_on_identical_machines_and_sensitive(tmp_path: Path) -> None:
    a = detect(fake_machine(tmp_path / "a"))
    b = detect(fake_machine(tmp_path / "b"))
    assert a == b and a.hw_id == b.hw_id
    assert detect(fake_machine(tmp_path / "c", flags="")).hw_id != a.hw_id
    assert detect(fake_machine(tmp_path / "d", l2="2048K")).hw_id != a.hw_id
    assert detect(fake_machine(tmp_path / "e", cpus="0-7")).hw_id != a.hw_id
    assert replace(a, l1d_bytes=32 << 10).hw_id != a.hw_id
    assert all(c.isalnum() or c in "-_" for c in a.hw_id)


def test_json_round_trip(tmp_path: Path) -> None:
    spec = detect(fake_machine(tmp_path))
    again = HardwareSpec.from_json(spec.to_json())
    assert again == spec and again.hw_id == spec.hw_id
    assert json.loads(spec.to_json())["hw_id"] == spec.hw_id


def test_detection_impossible_gives_clear_message(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="TUNECACHE_HARDWARE"):
        detect(tmp_path)
    root = fake_machine(tmp_path / "nocache")
    for index in (root / "sys/devices/system/cpu/cpu0/cache").iterdir():
        for f in index.iterdir():
            f.unlink()
        index.rmdir()
    with pytest.raises(HardwareError, match="cache sizes"):
        detect(root)


def test_override_from_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = replace(detect(fake_machine(tmp_path / "m")), isa="avx2", vector_bits=256)
    path = tmp_path / "spec.json"
    path.write_text(pinned.to_json())
    assert local_spec(path) == pinned
    monkeypatch.setenv(hardware.ENV_VAR, str(path))
    assert local_spec() == pinned
    monkeypatch.setenv(hardware.ENV_VAR, pinned.to_json())
    assert local_spec() == pinned


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"isa": "sse9"}, "unknown ISA level"),
        ({"vector_bits": 256}, "does not match"),
        ({"cores": 0}, "cores must be a positive integer"),
        ({"turbo": True}, "unknown hardware spec key"),
        ({"spec_version": 99}, "version 99"),
    ],
)
def test_bad_specs_are_refused(tmp_path: Path, patch: dict, fragment: str) -> None:
    data = json.loads(detect(fake_machine(tmp_path)).to_json())
    data.update(patch)
    with pytest.raises(HardwareError, match=fragment):
        HardwareSpec.from_json(json.dumps(data))


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read"):
        HardwareSpec.from_file(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HardwareError, match="not valid JSON"):
        HardwareSpec.from_file(tmp_path / "bad.json")
    data = json.loads(detect(fake_machine(tmp_path / "x")).to_json())
    del data["l2_bytes"]
    with pytest.raises(HardwareError, match="missing l2_bytes"):
        HardwareSpec.from_json(json.dumps(data))


def test_local_machine_is_detected() -> None:
    spec = local_spec()
    assert spec.cores >= 1 and spec.l1d_bytes > 0
    assert spec.isa in hardware.isa_levels()


def test_a_spec_whose_isa_the_cpu_lacks_is_refused_before_anything_runs(monkeypatch) -> None:
    # A pinned spec above this CPU's ISA level would die with SIGILL in the first kernel.
    import numpy as np

    from tunecache.compiler import hardware
    from tunecache.compiler.errors import HardwareError
    from tunecache.compiler.runtime import compile_kernel
    from tunecache.compiler.schedule import default_schedule

    spec = hardware.local_spec().with_isa("avx2")
    with pytest.raises(HardwareError, match=r"isa avx2\) needs instructions this CPU lacks "
                                            r"\(its ISA level: generic\)"):
        hardware.ensure_runnable(spec, cpu="generic")
    hardware.ensure_runnable(spec.with_isa("generic"), cpu="generic")
    hardware.ensure_runnable(spec, cpu="avx512")
    # The runtime asks before it builds or loads anything.
    monkeypatch.setattr(hardware, "_cpu_isa", "generic")
    op = matmul_op(8, 8, 8)
    with pytest.raises(HardwareError, match="CPU lacks"):
        compile_kernel(op, default_schedule(op, spec), spec)
    generic = spec.with_isa("generic")
    out = compile_kernel(op, default_schedule(op, generic), generic)(
        np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
    assert np.all(out == 8)


@pytest.mark.skipif(__import__("tunecache.compiler.hardware", fromlist=["cpu_isa"]).cpu_isa()
                    == "avx512", reason="needs a CPU below AVX-512 to pin a spec above it")
def test_cli_with_a_pinned_spec_above_the_cpu_says_so_in_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tunecache.compiler import hardware

    pinned = hardware.local_spec().with_isa("avx512").to_json()
    env = {**os.environ, "TUNECACHE_HARDWARE": pinned, "TUNECACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "bench-op",
                           "matmul(M=8,N=8,K=8)", "--no-baseline"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode not in (0, -4, 132), done.stderr  # never SIGILL
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and "CPU lacks" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr


ZEN3 = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=2, l1d_bytes=32 << 10,
                    l2_bytes=512 << 10, l3_bytes=32 << 20, cpu_model="AMD EPYC 7B13",
                    l3_shared_by=2)


def test_hardware_distance_orders_neighbours_by_what_changes_kernels() -> None:
    same_kind_other_vm = replace(ZEN3, cpu_model="AMD EPYC 7763", l3_ways=8)
    more_cores = replace(ZEN3, cores=8, l3_shared_by=8)
    smaller_l2 = replace(ZEN3, l2_bytes=256 << 10)
    portable = ZEN3.with_isa("generic")
    avx512 = replace(ZEN3, isa="avx512", vector_bits=512)
    arm = replace(ZEN3, arch="aarch64", isa="generic", vector_bits=128)
    assert hardware.hardware_distance(ZEN3, ZEN3) == 0.0
    assert hardware.hardware_distance(ZEN3, same_kind_other_vm) == pytest.approx(0.3)
    ranked = hardware.nearest_hardware(
        ZEN3, [portable, more_cores, smaller_l2, same_kind_other_vm, avx512, arm, ZEN3])
    assert [spec for _, spec in ranked] == [ZEN3, same_kind_other_vm, smaller_l2, more_cores,
                                            portable]
    # Code for an ISA the machine lacks, or another architecture, is never a neighbour.
    assert hardware.hardware_distance(ZEN3, avx512) is None
    assert hardware.hardware_distance(ZEN3, arm) is None
    # An AVX-512 machine can borrow from AVX2 ones, at a cost.
    assert hardware.hardware_distance(avx512, ZEN3) == pytest.approx(8.0)


def test_low_precision_features_are_detected_and_in_the_hw_id(tmp_path: Path) -> None:
    flags = "avx512f avx512bw avx512dq avx512vl avx512_vnni amx_tile amx_int8 sse4_2"
    spec = detect(fake_machine(tmp_path / "amx", flags=flags))
    assert spec.features == ("amx_int8", "amx_tile", "avx512_vnni")  # sorted, known ones only
    plain = replace(spec, features=())
    assert spec.hw_id != plain.hw_id
    # A spec without features keeps the id (and canonical JSON) it had before they existed.
    assert "features" not in json.loads(plain.canonical_json())
    assert HardwareSpec.from_json(spec.to_json()) == spec
    assert spec.with_isa("avx2").features == () and spec.with_isa("generic").features == ()
    assert detect(fake_machine(tmp_path / "zen3", flags="avx_vnni")).features == ("avx_vnni",)


@pytest.mark.parametrize(("features", "fragment"), [
    (["amx_int8", "neon_dot"], "unknown feature(s) neon_dot for x86_64"),
    ("avx512_vnni", "must be a list of names"),
])
def test_bad_features_are_refused(features: object, fragment: str) -> None:
    data = {**json.loads(ZEN3.with_isa("avx2").to_json()), "isa": "avx512", "vector_bits": 512,
            "features": features}
    with pytest.raises(HardwareError) as err:
        HardwareSpec.from_dict(data)
    assert fragment in str(err.value)


def test_a_pinned_spec_claiming_a_feature_the_cpu_lacks_is_refused() -> None:
    from tunecache.compiler import hardware

    spec = replace(hardware.local_spec().with_isa("avx512"),
                               features=("amx_bf16", "amx_int8", "amx_tile"))
    with pytest.raises(HardwareError, match=r"claims amx_bf16, amx_int8, amx_tile, which this "
                                            r"CPU lacks \(it has: avx512_vnni\)"):
        hardware.ensure_runnable(spec, cpu="avx512", features=("avx512_vnni",))
    hardware.ensure_runnable(spec, cpu="avx512", features=spec.features)


@pytest.mark.skipif("amx_int8" in __import__("tunecache.compiler.hardware",
                                             fromlist=["cpu_features"]).cpu_features(),
                    reason="needs a CPU without AMX to pin a spec claiming it")
def test_cli_with_a_pinned_spec_claiming_amx_says_so_in_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tunecache.compiler import hardware

    here = hardware.local_spec()
    level = hardware.isa_level(here.isa)
    if "amx_int8" not in level.features:
        pytest.skip(f"isa {here.isa} has no AMX to claim")
    pinned = replace(here, features=("amx_int8", "amx_tile")).to_json()
    env = {**os.environ, "TUNECACHE_HARDWARE": pinned, "TUNECACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "bench-op",
                           "matmul(M=8,N=8,K=8)", "--no-baseline"],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines[-1].startswith("error: "), done.stderr
    assert "claims amx_int8, amx_tile, which this CPU lacks" in lines[-1]
    assert "Traceback" not in done.stderr
