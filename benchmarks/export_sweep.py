"""Architectures outside our zoos, exported as a new user would, compiled and checked against
onnxruntime: does every one compile and match?

Each entry builds a small Hugging Face ``transformers`` model from its config (seeded random
weights, two layers, nothing downloaded) and exports it with ``torch.onnx.export``: the
TorchScript path at opset 17, and the dynamo path at opset 18 (``--exporters``). tunecache
compiles it untuned (analytic policy, empty store) and runs it on the same inputs as
onnxruntime (one thread); a model matches when every output has onnxruntime's shape and is
within 1e-4 relative to its largest magnitude. Failures are rows, not exceptions: the
export failed (torch's problem), onnxruntime refused the file, tunecache refused it (the
error line), or the answer differs (the relative error). Also the share of run time inside
generated kernels (``run --profile``).

    python benchmarks/export_sweep.py [--only bert,gpt2] [--exporters torchscript,dynamo]
        [--no-write]

Needs torch and transformers (``pip install torch transformers``), which are not tunecache
dependencies: the script prints an install hint without them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

INSTALL_HINT = ("error: the export sweep needs torch and transformers; install them with "
                "pip install torch transformers")
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "intermediate_size": 128}
TEXT = "text"
IMAGE = "image"
AUDIO = "audio"


@dataclass(frozen=True)
class Family:
    """A transformers model class, its config class, what it reads, config overrides."""

    model: str
    config: str
    inputs: str = TEXT
    overrides: tuple[tuple[str, Any], ...] = ()


FAMILIES: dict[str, Family] = {
    "bert": Family("BertModel", "BertConfig"),
    "distilbert": Family("DistilBertModel", "DistilBertConfig",
                         overrides=(("n_layers", 2), ("dim", 64), ("n_heads", 4),
                                    ("hidden_dim", 128))),
    "roberta": Family("RobertaModel", "RobertaConfig"),
    "albert": Family("AlbertModel", "AlbertConfig", overrides=(("embedding_size", 32),)),
    "electra": Family("ElectraModel", "ElectraConfig", overrides=(("embedding_size", 32),)),
    "deberta_v2": Family("DebertaV2Model", "DebertaV2Config"),
    "gpt2": Family("GPT2Model", "GPT2Config",
                   overrides=(("n_layer", 2), ("n_embd", 64), ("n_head", 4))),
    "gpt_neo": Family("GPTNeoModel", "GPTNeoConfig",
                      overrides=(("num_layers", 2), ("attention_types", [[["global", "local"],
                                                                          1]]),
                                 ("num_heads", 4))),
    "opt": Family("OPTModel", "OPTConfig", overrides=(("ffn_dim", 128),
                                                      ("word_embed_proj_dim", 64))),
    "bloom": Family("BloomModel", "BloomConfig", overrides=(("n_layer", 2), ("n_head", 4))),
    "llama": Family("LlamaModel", "LlamaConfig", overrides=(("num_key_value_heads", 2),)),
    "mistral": Family("MistralModel", "MistralConfig", overrides=(("num_key_value_heads", 2),)),
    "qwen2": Family("Qwen2Model", "Qwen2Config", overrides=(("num_key_value_heads", 2),)),
    "phi": Family("PhiModel", "PhiConfig"),
    "t5_encoder": Family("T5EncoderModel", "T5Config",
                         overrides=(("num_layers", 2), ("d_model", 64), ("d_kv", 16),
                                    ("d_ff", 128), ("num_heads", 4))),
    "vit": Family("ViTModel", "ViTConfig", IMAGE, (("image_size", 64), ("patch_size", 16))),
    "deit": Family("DeiTModel", "DeiTConfig", IMAGE, (("image_size", 64), ("patch_size", 16))),
    "swin": Family("SwinModel", "SwinConfig", IMAGE,
                   (("image_size", 64), ("embed_dim", 32), ("depths", [2, 2]),
                    ("num_heads", [2, 4]), ("window_size", 4), ("num_hidden_layers", None),
                    ("hidden_size", None), ("num_attention_heads", None),
                    ("intermediate_size", None))),
    "convnext": Family("ConvNextModel", "ConvNextConfig", IMAGE,
                       (("hidden_sizes", [32, 64]), ("depths", [1, 1]), ("num_stages", 2),
                        ("image_size", 64))),
    "resnet_hf": Family("ResNetModel", "ResNetConfig", IMAGE,
                        (("hidden_sizes", [32, 64]), ("depths", [1, 1]),
                         ("embedding_size", 16))),
    "segformer": Family("SegformerModel", "SegformerConfig", IMAGE,
                        (("num_encoder_blocks", 2), ("depths", [1, 1]),
                         ("hidden_sizes", [32, 64]), ("num_attention_heads", [1, 2]),
                         ("sr_ratios", [2, 1]), ("strides", [4, 2]),
                         ("patch_sizes", [7, 3]))),
    "mobilevit": Family("MobileViTModel", "MobileViTConfig", IMAGE,
                        (("image_size", 64), ("hidden_sizes", [32, 48, 64]),
                         ("neck_hidden_sizes", [16, 16, 24, 24, 32, 32, 64]))),
    "wav2vec2": Family("Wav2Vec2Model", "Wav2Vec2Config", AUDIO,
                       (("conv_dim", [32, 32]), ("conv_stride", [5, 2]),
                        ("conv_kernel", [10, 3]), ("num_conv_pos_embeddings", 16),
                        ("num_conv_pos_embedding_groups", 4))),
    "whisper_encoder": Family("WhisperEncoder", "WhisperConfig", AUDIO,
                              (("d_model", 64), ("encoder_layers", 2),
                               ("encoder_attention_heads", 4), ("encoder_ffn_dim", 128),
                               ("num_mel_bins", 16), ("max_source_positions", 50))),
}


def _module(key: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The model of ``key`` in eval mode (returning its first output) and its inputs."""
    import torch
    import transformers

    family = FAMILIES[key]
    config_class = getattr(transformers, family.config)
    config = config_class(**{k: v for k, v in {**SMALL, **dict(family.overrides)}.items()
                             if v is not None})
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"
    if family.model == "WhisperEncoder":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        net: Any = WhisperEncoder(config)
    else:
        net = getattr(transformers, family.model)(config)
    torch.manual_seed(0)
    for p in net.parameters():
        p.data = torch.randn_like(p) * 0.05
    rng = np.random.default_rng(0)
    if family.inputs == IMAGE:
        feeds = {"pixel_values": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    elif family.inputs == AUDIO and key == "whisper_encoder":
        feeds = {"input_features": rng.standard_normal((1, 16, 100)).astype(np.float32)}
    elif family.inputs == AUDIO:
        feeds = {"input_values": rng.standard_normal((1, 1600)).astype(np.float32)}
    else:
        feeds = {"input_ids": rng.integers(0, 100, (1, 16)).astype(np.int64)}

    class First(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net.eval()

        def forward(self, x: Any) -> Any:
            out = self.net(x)
            return out[0] if isinstance(out, tuple) else out.last_hidden_state
    return First().eval(), feeds


def _export(key: str, exporter: str, work: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import torch

    module, feeds = _module(key)
    path = work / f"{key}-{exporter}.onnx"
    (name, value), = feeds.items()
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # the exporters' progress
        torch.onnx.export(module, (torch.from_numpy(value),), str(path), input_names=[name],
                          opset_version=18 if exporter == "dynamo" else 17,
                          dynamo=exporter == "dynamo")
    return path, feeds


def _check(key: str, exporter: str, work: Path) -> dict[str, Any]:
    """One row: what happened to ``key`` through ``exporter``."""
    row: dict[str, Any] = {"model": key, "exporter": exporter}
    try:
        path, feeds = _export(key, exporter, work)
    except Exception as exc:  # torch's failure: a row, not our error
        row["status"] = f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        return row
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        want = ort.InferenceSession(str(path), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    except Exception as exc:
        row["status"] = f"onnxruntime refused: {str(exc).splitlines()[0][:80]}"
        return row
    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model

    try:
        started = time.perf_counter()
        compiled = compile_model(path, store=Store(work / "store"), policy="analytic")
        row["compile_s"] = time.perf_counter() - started
        got = next(iter(compiled.run(feeds).values()))
        profile = compiled.profile(feeds, runs=3)
    except Exception as exc:
        row["status"] = f"tunecache: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        traceback.print_exc(file=sys.stderr)
        return row
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    error = (float(np.max(np.abs(got - want), initial=0.0)) / scale
             if got.shape == want.shape else float("inf"))
    row["error"] = error
    where = profile.seconds_by("where")
    row["in_kernels"] = where.get("kernel", 0.0) / max(sum(where.values()), 1e-12)
    row["status"] = "match" if error <= 1e-4 else "WRONG"
    return row


def _line(r: dict[str, Any]) -> str:
    """One export's progress line: model, exporter, status, error, in kernels, compile."""
    err = f"{r['error']:.1e}" if "error" in r else "—"
    share = f"{100 * r['in_kernels']:.0f}%" if "in_kernels" in r else "—"
    took = f"{r['compile_s']:.1f} s" if "compile_s" in r else "—"
    return f"| {r['model']} | {r['exporter']} | {r['status']} | {err} | {share} | {took} |"


def _table(rows: list[dict[str, Any]], exporters: list[str]) -> list[str]:
    """One row per family, one column per exporter: status, error and in-kernels share."""
    def cell(r: dict[str, Any] | None) -> str:
        if r is None or "error" not in r:
            return "—" if r is None else r["status"]
        return f"{r['status']} ({r['error']:.0e}, {100 * r['in_kernels']:.0f}% in kernels)"

    found = {(r["model"], r["exporter"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    return ["| model | " + " | ".join(exporters) + " |", "|---" * (len(exporters) + 1) + "|",
            *(f"| {m} | " + " | ".join(cell(found.get((m, e))) for e in exporters) + " |"
              for m in models)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated family keys")
    parser.add_argument("--exporters", default="torchscript,dynamo")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    keys = args.only.split(",") if args.only else list(FAMILIES)
    unknown = [k for k in keys if k not in FAMILIES]
    exporters = args.exporters.split(",")
    if unknown or not set(exporters) <= {"torchscript", "dynamo"}:
        print(f"error: unknown family {unknown[0]!r}; choose from {', '.join(FAMILIES)}"
              if unknown else "error: --exporters takes torchscript and/or dynamo",
              file=sys.stderr)
        return 2
    if any(importlib.util.find_spec(p) is None for p in ("torch", "transformers",
                                                          "onnxruntime")):
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="export-sweep-") as tmp:
        for key in keys:
            for exporter in exporters:
                rows.append(_check(key, exporter, Path(tmp)))
                print(_line(rows[-1]), flush=True)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("match", "WRONG")}
    summary = (f"{counts['match']} of {len(rows)} exports match onnxruntime, "
               f"{counts['WRONG']} wrong; the others are listed with what failed.")
    print(summary)
    if not args.no_write:
        _write(_table(rows, exporters), summary)
    return 0


def _write(table: list[str], summary: str) -> None:
    import torch
    import transformers
    from _report import git_revision, machine_summary, write_section

    write_section("\n".join([
        machine_summary(), "",
        f"Revision `{git_revision()}`; torch {torch.__version__}, transformers "
        f"{transformers.__version__}. Small configs (two layers, width 64, random weights), "
        "batch 1; untuned (analytic policy). " + summary, "", *table]))


if __name__ == "__main__":
    sys.exit(main())
