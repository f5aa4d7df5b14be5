"""Turn measurement results into store records (provenance included)."""

from __future__ import annotations

from collections.abc import Iterable

from tunecache.compiler.hardware import HardwareSpec
from tunecache.datasets.records import Record
from tunecache.tuner.measure.runner import MeasureResult


def to_record(result: MeasureResult, hw: HardwareSpec, *, job_id: str | None = None,
              model_version: str | None = None) -> Record:
    """One store record for ``result`` measured on ``hw`` (failures included)."""
    return Record.create(
        op=result.op,
        hw=hw,
        status=result.status,
        schedule=result.schedule,
        runtimes_s=result.runtimes_s or None,
        codegen_version=result.codegen_version,
        error=result.error,
        compiler=result.compiler,
        flags=result.flags,
        source_hash=result.source_hash,
        compile_s=result.compile_s,
        job_id=job_id,
        source=result.source,
        predicted=result.predicted,
        model_version=model_version,
    )


def to_records(results: Iterable[MeasureResult], hw: HardwareSpec, *,
               job_id: str | None = None, model_version: str | None = None) -> list[Record]:
    """Records for every result that measured a kernel (numpy baselines are skipped)."""
    return [to_record(r, hw, job_id=job_id, model_version=model_version)
            for r in results if r.schedule is not None]
