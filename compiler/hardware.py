"""Hardware specs: what the kernels run on, detected from sysfs/procfs or pinned from JSON.

A :class:`HardwareSpec` records everything that changes how fast a kernel runs (ISA level,
vector width, cores, cache sizes and associativity, CPU model). ``hw_id`` is a stable,
path-safe key derived from exactly those fields, so identical machines share cache entries and
any change that matters gives a new key.

Farms pin their spec: ``TUNECACHE_HARDWARE`` may name a JSON file (or hold the JSON itself),
and every command that takes ``--hardware`` accepts the same file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tunecache.compiler.errors import HardwareError
from tunecache.compiler.files import read_regular
from tunecache.compiler.plugins import load_backends

ENV_VAR = "TUNECACHE_HARDWARE"
SPEC_VERSION = 1
MAX_SPEC_BYTES = 1 << 20
PLAUSIBLE_MAX = {"cores": 4096, "l1d_bytes": 16 << 20, "l2_bytes": 1 << 30,
                 "l3_bytes": 64 << 30, "cache_line": 1024, "l1d_ways": 256, "l2_ways": 256,
                 "l3_ways": 256, "l3_shared_by": 4096}
"""The largest value of each count a spec may claim: past these no CPU is, and a spec that
claims one would have an engine start that many threads or size tiles to caches no machine
has (cores, and caches per instance, of the largest CPUs made tenfold)."""


@dataclass(frozen=True, slots=True)
class IsaLevel:
    """One ISA level a backend generates code for: the vector width and architectural vector
    registers its kernels have, the architecture it belongs to, the CPU flags
    (``/proc/cpuinfo``) that say a CPU runs it, and its rank among that architecture's
    levels (code of a level runs on every CPU of that architecture whose level ranks at
    least as high)."""

    name: str
    arch: str
    vector_bits: int
    vector_registers: int
    cpu_flags: frozenset[str]
    rank: int
    features: frozenset[str] = frozenset()
    """Optional instruction sets a CPU of this level may have beside it (low-precision dot
    products, matrix tiles), by their cpuinfo names: detected into
    :attr:`HardwareSpec.features`, which kernels needing them require."""


_ISA_LEVELS: dict[str, IsaLevel] = {}


def register_isa_level(level: IsaLevel) -> IsaLevel:
    """Make ``level`` known to specs, detection and nearest-hardware ranking (a backend
    registers the levels it serves)."""
    _ISA_LEVELS[level.name] = level
    return level


def isa_levels() -> dict[str, IsaLevel]:
    """Every registered ISA level by name (the backends' registrations, loaded on first use)."""
    load_backends()
    return _ISA_LEVELS


def isa_level(name: str) -> IsaLevel:
    """The registered level ``name``; HardwareError naming the known ones if none."""
    level = isa_levels().get(name)
    if level is None:
        raise HardwareError(
            f"unknown ISA level {name!r}; expected one of {', '.join(isa_levels())}")
    return level


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """A CPU as far as kernel speed is concerned. Cache sizes are bytes per instance."""

    arch: str
    isa: str
    vector_bits: int
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cpu_model: str
    cache_line: int = 64
    l1d_ways: int = 8
    l2_ways: int = 8
    l3_ways: int = 16
    l3_shared_by: int = 1
    features: tuple[str, ...] = ()
    """Optional instruction sets of its ISA level it has (``avx512_vnni``, ``amx_int8``...),
    sorted; part of ``hw_id`` when present (a spec without any keeps the id it had before
    they were recorded)."""

    def __post_init__(self) -> None:
        for name in ("arch", "isa", "cpu_model"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise HardwareError(f"hardware {name} must be a string, got {value!r}")
        level = isa_level(self.isa)
        if self.vector_bits != level.vector_bits:
            raise HardwareError(
                f"vector_bits={self.vector_bits} does not match isa={self.isa} "
                f"(expected {level.vector_bits})"
            )
        for name in ("cores", "l1d_bytes", "l2_bytes", "l3_bytes", "cache_line", "l1d_ways",
                     "l2_ways", "l3_ways", "l3_shared_by"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HardwareError(f"hardware {name} must be a positive integer, got {value!r}")
            if value > PLAUSIBLE_MAX[name]:
                raise HardwareError(f"hardware {name}={value} is not plausible: at most "
                                    f"{PLAUSIBLE_MAX[name]}")
        if self.cache_line & (self.cache_line - 1) or self.cache_line < 16:
            raise HardwareError(f"hardware cache_line={self.cache_line} must be a power of two "
                                "of at least 16")
        if not re.fullmatch(r"[A-Za-z0-9_]+", self.arch):
            raise HardwareError(f"hardware arch {self.arch!r} must be letters, digits or _")
        self._check_features(level)

    def _check_features(self, level: IsaLevel) -> None:
        if not isinstance(self.features, tuple) or \
                any(not isinstance(f, str) for f in self.features):
            raise HardwareError(f"hardware features must be a list of names, got "
                                f"{self.features!r}")
        known = set().union(*(other.features for other in isa_levels().values()
                              if other.arch == level.arch))
        unknown = sorted(set(self.features) - known)
        if unknown:
            raise HardwareError(
                f"unknown feature(s) {', '.join(unknown)} for {self.arch}; known: "
                f"{', '.join(sorted(known)) or 'none'}")
        # A level below the one that has them (a spec restricted to AVX2, say) keeps only
        # those its own code may use.
        kept = tuple(sorted(set(self.features) & level.features))
        object.__setattr__(self, "features", kept)

    @property
    def lanes(self) -> int:
        """float32 elements per vector register."""
        return self.vector_bits // 32

    @property
    def vector_registers(self) -> int:
        return isa_level(self.isa).vector_registers

    @property
    def hw_id(self) -> str:
        """Stable key: readable prefix plus a hash of every speed-relevant field."""
        digest = hashlib.sha256(self.canonical_json().encode()).hexdigest()[:10]
        return f"{self.arch}-{self.isa}-{self.cores}c-{digest}"

    def canonical_json(self) -> str:
        data = asdict(self)
        if not self.features:
            del data["features"]  # the ids of specs recorded before features were
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def to_json(self) -> str:
        """Pretty JSON including ``hw_id`` (ignored when read back) and a spec version."""
        data: dict[str, Any] = {"spec_version": SPEC_VERSION, **asdict(self), "hw_id": self.hw_id}
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HardwareSpec:
        """Parse a spec written by :meth:`to_json` (or by hand); unknown keys are refused."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HardwareError(f"hardware spec is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HardwareError("hardware spec must be a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareSpec:
        data = dict(data)
        data.pop("hw_id", None)
        version = data.pop("spec_version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise HardwareError(
                f"hardware spec version {version} is not supported (this tunecache reads "
                f"version {SPEC_VERSION})"
            )
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise HardwareError(
                f"unknown hardware spec key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        if isinstance(data.get("features"), list):
            data["features"] = tuple(sorted(set(map(str, data["features"]))))
        if "isa" in data and "vector_bits" not in data:
            known = isa_levels().get(str(data["isa"]))
            data["vector_bits"] = known.vector_bits if known else 0
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise HardwareError(f"hardware spec is missing {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> HardwareSpec:
        try:
            data = read_regular(path, MAX_SPEC_BYTES, follow_links=True)
        except OSError as exc:
            raise HardwareError(f"cannot read hardware spec {path}: {exc.strerror}") from None
        return cls.from_json(data.decode(errors="replace"))

    def with_isa(self, isa: str) -> HardwareSpec:
        """The same machine restricted to a lower ISA level (e.g. to test AVX2 code)."""
        data = asdict(self)
        known = isa_levels().get(isa)
        kept = tuple(f for f in self.features if known is not None and f in known.features)
        data.update(isa=isa, vector_bits=known.vector_bits if known else 0, features=kept)
        return HardwareSpec(**data)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if match is None:
        raise HardwareError(f"unreadable cache size {text!r} in sysfs")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match.group(2).upper()]
    return int(match.group(1)) * scale


def _cpu_list_len(text: str) -> int:
    count = 0
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            count += int(hi) - int(lo) + 1
        elif part:
            count += 1
    return count


def _cpuinfo(proc: Path) -> tuple[str, set[str]]:
    text = _read(proc / "cpuinfo")
    if text is None:
        raise HardwareError(
            f"cannot detect hardware: {proc / 'cpuinfo'} is unreadable (not Linux?); pin a spec "
            f"with {ENV_VAR}=spec.json or --hardware spec.json"
        )
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model or platform.processor() or "unknown", flags


def _caches(sys_cpu: Path) -> dict[str, tuple[int, int, int, int]]:
    """Per level: (size, ways, line, cpus sharing) for data/unified caches of cpu0."""
    found: dict[str, tuple[int, int, int, int]] = {}
    cache_dir = sys_cpu / "cpu0" / "cache"
    if not cache_dir.is_dir():
        return found
    for index in sorted(cache_dir.glob("index*")):
        level, kind = _read(index / "level"), _read(index / "type")
        size = _read(index / "size")
        if level is None or kind not in ("Data", "Unified") or size is None:
            continue
        ways = int(_read(index / "ways_of_associativity") or 0) or 8
        line = int(_read(index / "coherency_line_size") or 0) or 64
        shared = _cpu_list_len(_read(index / "shared_cpu_list") or "0")
        found[f"l{level}"] = (_parse_size(size), ways, line, max(shared, 1))
    return found


PORTABLE_ISA = "generic"
"""The level of a CPU no registered level describes: portable C, built for the host."""


def _isa_of(flags: set[str], arch: str) -> str:
    """The best registered level of ``arch`` whose CPU flags ``flags`` has."""
    runs = [level for level in isa_levels().values()
            if level.arch == arch and flags >= level.cpu_flags]
    return max(runs, key=lambda level: level.rank).name if runs else PORTABLE_ISA


def _features_of(flags: set[str], isa: str) -> tuple[str, ...]:
    """The optional instruction sets of level ``isa`` among a CPU's ``flags``."""
    known = isa_levels().get(isa)
    return tuple(sorted(flags & known.features)) if known is not None else ()


_cpu_isa: str | None = None
_cpu_features: tuple[str, ...] | None = None


def cpu_isa() -> str:
    """The best ISA level this machine's CPU runs (from ``/proc/cpuinfo``, read once)."""
    global _cpu_isa
    if _cpu_isa is None:
        _cpu_isa = _isa_of(_cpuinfo(Path("/proc"))[1], _machine())
    return _cpu_isa


def cpu_features() -> tuple[str, ...]:
    """The optional instruction sets of this CPU's level it has (``/proc/cpuinfo``, once)."""
    global _cpu_features
    if _cpu_features is None:
        _cpu_features = _features_of(_cpuinfo(Path("/proc"))[1], cpu_isa())
    return _cpu_features


def machine_cpus() -> int:
    """The logical CPUs this process may run on: what bounds any engine's thread count
    here, whatever a pinned spec claims."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ensure_runnable(spec: HardwareSpec, cpu: str | None = None,
                    features: tuple[str, ...] | None = None) -> None:
    """Refuse to run kernels built for ``spec`` on a CPU (``cpu``: its ISA level, and
    ``features``: its optional instruction sets, detected by default) that lacks ``spec``'s
    instructions: they would die with SIGILL. Generating and building code for another
    machine stays allowed; only running it is refused."""
    cpu = cpu_isa() if cpu is None else cpu
    if spec.isa not in runnable_isas_for(cpu):
        raise HardwareError(
            f"the hardware spec in use ({spec.hw_id}, isa {spec.isa}) needs instructions this "
            f"CPU lacks (its ISA level: {cpu}); pin a spec of this machine (`tunecache hw "
            f"--json`) or unset {ENV_VAR}"
        )
    has = cpu_features() if features is None else features
    missing = sorted(set(spec.features) - set(has))
    if missing:
        raise HardwareError(
            f"the hardware spec in use ({spec.hw_id}) claims {', '.join(missing)}, which this "
            f"CPU lacks (it has: {', '.join(has) or 'none of its level'}); pin a spec of this "
            f"machine (`tunecache hw --json`) or unset {ENV_VAR}")


def runnable_isas_for(isa: str) -> tuple[str, ...]:
    """ISA levels whose code runs on a CPU of level ``isa`` (the levels of its architecture
    that rank no higher), best first."""
    top = isa_level(isa)
    runs = [level for level in isa_levels().values()
            if level.arch == top.arch and level.rank <= top.rank]
    return tuple(level.name for level in sorted(runs, key=lambda level: -level.rank))


def _machine() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", platform.machine() or "unknown")


def detect(root: str | os.PathLike[str] = "/") -> HardwareSpec:
    """Detect the local machine from ``/proc`` and ``/sys`` (``root`` is for tests)."""
    base = Path(root)
    model, flags = _cpuinfo(base / "proc")
    arch = _machine()
    isa = _isa_of(flags, arch)
    features = _features_of(flags, isa)
    caches = _caches(base / "sys" / "devices" / "system" / "cpu")
    if "l1" not in caches or "l2" not in caches:
        raise HardwareError(
            "cannot detect cache sizes: /sys/devices/system/cpu/cpu0/cache has no L1d/L2 "
            f"entries; pin a spec with {ENV_VAR}=spec.json or --hardware spec.json"
        )
    l1, l2 = caches["l1"], caches["l2"]
    l3 = caches.get("l3", (l2[0], l2[1], l2[2], 1))
    try:
        cores = len(os.sched_getaffinity(0)) if str(root) == "/" else 0
    except AttributeError:  # not Linux
        cores = 0
    if cores == 0:
        online = _read(base / "sys" / "devices" / "system" / "cpu" / "online")
        cores = _cpu_list_len(online) if online else (os.cpu_count() or 1)
    return HardwareSpec(
        arch=arch,
        isa=isa,
        vector_bits=isa_level(isa).vector_bits,
        cores=cores,
        l1d_bytes=l1[0],
        l2_bytes=l2[0],
        l3_bytes=l3[0],
        cpu_model=model,
        cache_line=l1[2],
        l1d_ways=l1[1],
        l2_ways=l2[1],
        l3_ways=l3[1],
        l3_shared_by=l3[3],
        features=features,
    )


_local: HardwareSpec | None = None


def local_spec(override: str | os.PathLike[str] | None = None) -> HardwareSpec:
    """The spec to tune for: ``override`` file, else ``$TUNECACHE_HARDWARE``, else detected.

    ``$TUNECACHE_HARDWARE`` holds a path to a JSON file, or the JSON text itself.
    """
    global _local
    if override is not None:
        return HardwareSpec.from_file(override)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        if env.startswith("{"):
            return HardwareSpec.from_json(env)
        return HardwareSpec.from_file(env)
    if _local is None:
        _local = detect()
    return _local


def runnable_isas(spec: HardwareSpec) -> tuple[str, ...]:
    """ISA levels whose code runs on ``spec``'s machine, best first."""
    return runnable_isas_for(spec.isa)


# How much each difference between two machines counts when ranking tuned hardware by how
# well its schedules should carry over: the ISA level decides the register tile, the core
# count the parallel split, cache sizes the blocking (per halving or doubling), and the CPU
# model and associativity only refine a tie.
_ISA_STEP_DISTANCE = 8.0
_CORES_DISTANCE = 2.0
_CACHE_DISTANCE = (("l1d_bytes", 1.0), ("l2_bytes", 1.0), ("l3_bytes", 0.5))
_MODEL_DISTANCE = 0.25
_WAYS_DISTANCE = 0.05
# Optional instruction sets change only the low-precision kernels, which a kernel that needs
# one says itself: float32 schedules carry over whole.
_FEATURE_DISTANCE = 0.05


def hardware_distance(local: HardwareSpec, other: HardwareSpec) -> float | None:
    """How far ``other``'s tuned schedules are from fitting ``local``: 0.0 for the same
    spec, growing with ISA level, cores and cache sizes (log scale), then model and
    associativity. None when ``other``'s code cannot run on ``local`` (another
    architecture, or an ISA level ``local`` lacks): such a machine is never a neighbour."""
    if other.arch != local.arch or other.isa not in runnable_isas(local):
        return None
    distance = _ISA_STEP_DISTANCE * (isa_level(local.isa).rank - isa_level(other.isa).rank)
    distance += _CORES_DISTANCE * abs(math.log2(other.cores / local.cores))
    for name, weight in _CACHE_DISTANCE:
        distance += weight * abs(math.log2(getattr(other, name) / getattr(local, name)))
    distance += _MODEL_DISTANCE * (other.cpu_model != local.cpu_model)
    distance += _WAYS_DISTANCE * sum(getattr(other, w) != getattr(local, w)
                                     for w in ("l1d_ways", "l2_ways", "l3_ways", "l3_shared_by"))
    distance += _FEATURE_DISTANCE * len(set(other.features) ^ set(local.features))
    return distance


def nearest_hardware(local: HardwareSpec, others: Iterable[HardwareSpec]
                     ) -> list[tuple[float, HardwareSpec]]:
    """``others`` whose code runs on ``local``, nearest first (ties by ``hw_id``); the exact
    spec itself, if among them, comes first at distance 0."""
    ranked = [(d, o) for o in others if (d := hardware_distance(local, o)) is not None]
    return sorted(ranked, key=lambda pair: (pair[0], pair[1].hw_id))
