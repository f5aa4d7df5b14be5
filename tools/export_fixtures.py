"""Regenerate the exporter fixtures in tests/data/exporters/ (BERT, GPT-2, Llama, ViT).

Each model is built from a transformers config object with tiny dimensions and seeded random
weights (nothing is downloaded), and exported with ``torch.onnx.export`` the way users do:
the TorchScript path at opset 17 (``dynamo=False``) and the dynamo path at opset 18
(``dynamo=True``, default optimisation), with symbolic batch and sequence axes. The decoders
are exported twice: a first pass (no cache) and a decode step whose past keys and values are
inputs and whose present ones are outputs.

Needs torch, transformers and onnxscript, which are not tunecache dependencies (the tests
read the committed .onnx files and compare against onnxruntime)::

    .venv/bin/pip install torch==2.13.0 transformers onnxscript
    .venv/bin/python tools/export_fixtures.py [--only NAME ...] [--out DIR]

A failing export is reported and skipped; the script exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
import transformers
from transformers import (
    BertConfig,
    BertModel,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTModel,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "exporters"
SEED = 0
VOCAB = 100
LAYERS = 2
HIDDEN = 32
# Example sizes; every one differs, so that no dynamic axis is specialised to another's
# value (a decode step of one token would make the exporter specialise the sequence to 1).
BATCH, SEQ, PAST, STEP = 2, 5, 3, 4
MAX_POSITIONS = 64


@dataclass(frozen=True)
class Case:
    """One model to export: how to build it, its example inputs, names and dynamic axes."""

    name: str
    build: Callable[[], torch.nn.Module]
    example: Callable[[], tuple[torch.Tensor, ...]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    axes: dict[str, dict[int, str]]


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(SEED)
        model = make()
        model.eval()
        return model
    return build


class _Encoder(torch.nn.Module):
    """input_ids, attention_mask -> last_hidden_state (BERT; tiny unless given a config)."""

    def __init__(self, config: BertConfig | None = None) -> None:
        super().__init__()
        config = config or BertConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=2, intermediate_size=64, max_position_embeddings=MAX_POSITIONS,
            attn_implementation="sdpa")
        self.model = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Vit(torch.nn.Module):
    """pixel_values -> last_hidden_state (ViT; tiny, 32x32 images in 8x8 patches, unless
    given a config)."""

    def __init__(self, config: ViTConfig | None = None) -> None:
        super().__init__()
        config = config or ViTConfig(
            image_size=32, patch_size=8, num_channels=3, hidden_size=HIDDEN,
            num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=64,
            attn_implementation="sdpa")
        self.model = ViTModel(config, add_pooling_layer=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


def _gpt2_config() -> GPT2Config:
    return GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=2, n_positions=MAX_POSITIONS,
                      bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")


def _llama_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64,
                       num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=MAX_POSITIONS, attn_implementation="sdpa")


class _Decoder(torch.nn.Module):
    """input_ids, attention_mask -> logits (a first pass, no cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


class _DecoderStep(torch.nn.Module):
    """input_ids, attention_mask (past + new), past k/v per layer -> logits, present k/v."""

    def __init__(self, model: torch.nn.Module, config: Any) -> None:
        super().__init__()
        self.model = model
        self.config = config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                key0: torch.Tensor, value0: torch.Tensor, key1: torch.Tensor,
                value1: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Named arguments, not *past: the dynamo exporter matches dynamic_shapes to them.
        cache = DynamicCache([(key0, value0), (key1, value1)], config=self.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
        present: list[torch.Tensor] = []
        for layer in out.past_key_values.layers:
            present.extend((layer.keys, layer.values))
        return (out.logits, *present)


def _ids(batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))


def _mask(batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, 0] = 0  # a padded position, so the mask is not all ones
    return mask


def _past(kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    return tuple(torch.randn(BATCH, kv_heads, PAST, head_dim, generator=g)
                 for _ in range(2 * LAYERS))


def _past_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    assert LAYERS == 2  # _DecoderStep.forward names two layers' past keys and values
    past = tuple(f"past.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value"))
    present = tuple(f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value"))
    return past, present


def _step_case(name: str, build: Callable[[], torch.nn.Module], kv_heads: int,
               head_dim: int) -> Case:
    past, present = _past_names()
    axes = {"input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "total_sequence"},
            "logits": {0: "batch", 1: "sequence"}}
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in past})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in present})
    return Case(name, build,
                lambda: (_ids(BATCH, STEP), _mask(BATCH, PAST + STEP), *_past(kv_heads, head_dim)),
                ("input_ids", "attention_mask", *past), ("logits", *present), axes)


def cases() -> list[Case]:
    """The six models; each is exported on both paths."""
    seq_axes = {"input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"}}

    def gpt2() -> torch.nn.Module:
        return _Decoder(GPT2LMHeadModel(_gpt2_config()))

    def gpt2_step() -> torch.nn.Module:
        config = _gpt2_config()
        return _DecoderStep(GPT2LMHeadModel(config), config)

    def llama() -> torch.nn.Module:
        return _Decoder(LlamaForCausalLM(_llama_config()))

    def llama_step() -> torch.nn.Module:
        config = _llama_config()
        return _DecoderStep(LlamaForCausalLM(config), config)

    return [
        Case("bert", _seeded(_Encoder), lambda: (_ids(), _mask()),
             ("input_ids", "attention_mask"), ("last_hidden_state",),
             {**seq_axes, "last_hidden_state": {0: "batch", 1: "sequence"}}),
        Case("gpt2", _seeded(gpt2), lambda: (_ids(), _mask()),
             ("input_ids", "attention_mask"), ("logits",),
             {**seq_axes, "logits": {0: "batch", 1: "sequence"}}),
        _step_case("gpt2_past", _seeded(gpt2_step), 2, HIDDEN // 2),
        Case("llama", _seeded(llama), lambda: (_ids(), _mask()),
             ("input_ids", "attention_mask"), ("logits",),
             {**seq_axes, "logits": {0: "batch", 1: "sequence"}}),
        _step_case("llama_past", _seeded(llama_step), 2, HIDDEN // 4),
        Case("vit", _seeded(_Vit),
             lambda: (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(3)),),
             ("pixel_values",), ("last_hidden_state",),
             {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}),
    ]


def _dynamic_shapes(case: Case) -> tuple[dict[int, Any], ...]:
    # One named Dim per axis label, so that inputs sharing "batch" share the symbol.
    dims: dict[str, Any] = {}
    out = []
    for name in case.input_names:
        spec = {}
        for axis, label in case.axes.get(name, {}).items():
            if label not in dims:
                dims[label] = torch.export.Dim(label, min=1, max=MAX_POSITIONS)
            spec[axis] = dims[label]
        out.append(spec)
    return tuple(out)


def _strip(path: Path) -> None:
    """Drop doc strings and metadata (the dynamo exporter stores a stack trace per node):
    they do not change what the graph computes, and they were most of each file's bytes."""
    model = onnx.load(str(path))
    del model.metadata_props[:]
    model.doc_string = ""
    model.graph.doc_string = ""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in (*model.graph.value_info, *model.graph.input, *model.graph.output):
        del value.metadata_props[:]
        value.doc_string = ""
    for init in model.graph.initializer:
        del init.metadata_props[:]
    onnx.save(model, str(path))


def export(case: Case, dynamo: bool, out_dir: Path) -> Path:
    """Export ``case`` on one path; returns the file written."""
    path = out_dir / f"{case.name}_{'dynamo18' if dynamo else 'torchscript17'}.onnx"
    model = case.build()
    args = case.example()
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, args, dynamo=True, opset_version=18,
                                        input_names=list(case.input_names),
                                        output_names=list(case.output_names),
                                        dynamic_shapes=_dynamic_shapes(case))
            assert program is not None
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17,
                              input_names=list(case.input_names),
                              output_names=list(case.output_names),
                              dynamic_axes=case.axes)
    _strip(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failed = 0
    for case in cases():
        if options.only and case.name not in options.only:
            continue
        for dynamo in (False, True):
            label = f"{case.name} ({'dynamo, opset 18' if dynamo else 'TorchScript, opset 17'})"
            try:
                path = export(case, dynamo, options.out)
            except Exception as exc:
                failed += 1
                print(f"FAILED {label}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            print(f"{label}: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
                  f"({path.stat().st_size / 1024:.0f} KiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
