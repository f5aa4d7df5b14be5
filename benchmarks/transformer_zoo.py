"""Full-size transformers as users export them, for ``model_zoo_latency.py --zoo transformers``.

Each entry builds a Hugging Face ``transformers`` model from its config with seeded random
weights (nothing is downloaded), exports it with ``torch.onnx.export``'s TorchScript path at
opset 17 with symbolic batch and sequence axes (the path and axes of
``tools/export_fixtures.py``, at full size), and returns the inputs of one inference:

================  ===========================================================================
key               model and inputs
================  ===========================================================================
bert_base_s128    BERT-base (12 layers, 768 wide, SDPA attention), sequence 128, padding mask
bert_base_s384    the same at sequence 384
gpt2_prefill      GPT-2 small (12 layers, 768 wide, vocabulary 50257), 128-token prompt
gpt2_decode       GPT-2 small, one decode step after a 128-token past (past keys/values in)
vit_b16           ViT-B/16 at 224x224 (12 layers, 768 wide, 197 tokens)
llama_small       a Llama-style decoder: 8 layers, 512 wide, 8 heads of 64 with 4 key/value
                  heads (grouped-query attention), SiLU-gated MLP of 1408, RMSNorm, rotary
                  embeddings, vocabulary 32000; 128-token prompt
================  ===========================================================================

A key ending in ``_b8`` (``bert_base_s128_b8``, ``gpt2_prefill_b8``, ...) runs batch 8.
Needs torch and transformers (``pip install torch==2.13.0 transformers``), which are not
tunecache dependencies: the benchmark reports an install hint without them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEQ, PAST = 128, 128
INSTALL_HINT = ("error: the transformer zoo exports with torch and transformers; install them "
                "with pip install torch==2.13.0 transformers")


@dataclass(frozen=True, slots=True)
class Entry:
    """One benchmark model: which network, and the shape of the inference timed."""

    network: str
    seq: int = SEQ
    past: int = 0
    images: bool = False


BASE: dict[str, Entry] = {
    "bert_base_s128": Entry("bert"),
    "bert_base_s384": Entry("bert", seq=384),
    "gpt2_prefill": Entry("gpt2"),
    "gpt2_decode": Entry("gpt2", seq=1, past=PAST),
    "vit_b16": Entry("vit", images=True),
    "llama_small": Entry("llama"),
}
ZOO: dict[str, Entry] = {**BASE, **{f"{k}_b8": v for k, v in BASE.items()}}
DEFAULT = tuple(BASE)


def batch_of(key: str) -> int:
    return 8 if key.endswith("_b8") else 1


def _fixtures() -> Any:
    """``tools/export_fixtures.py``, whose builders and exporter this zoo reuses at full size."""
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import export_fixtures

    return export_fixtures


def _configs() -> dict[str, Callable[[], Any]]:
    from transformers import BertConfig, GPT2Config, LlamaConfig, ViTConfig

    return {
        "bert": lambda: BertConfig(attn_implementation="sdpa"),
        "gpt2": lambda: GPT2Config(attn_implementation="sdpa"),
        "vit": lambda: ViTConfig(attn_implementation="sdpa"),
        "llama": lambda: LlamaConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
            attn_implementation="sdpa"),
    }


def _step_module(model: Any, config: Any, layers: int) -> Any:
    """input_ids, attention_mask, past keys and values of every layer -> logits, present."""
    import torch
    from transformers import DynamicCache

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *past: Any) -> tuple[Any, ...]:
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=DynamicCache(pairs, config=config), use_cache=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys,
                                                                           layer.values)]
            return (out.logits, *present)

    return Step()


def _case(key: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The export case of ``key`` (``tools/export_fixtures.Case``) and its inputs."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    fx = _fixtures()
    entry, batch = ZOO[key], batch_of(key)
    config = _configs()[entry.network]()
    rng = np.random.default_rng(0)
    if entry.images:
        feeds = {"pixel_values": rng.standard_normal(
            (batch, 3, config.image_size, config.image_size)).astype(np.float32)}
        axes = {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}}
        build: Callable[[], Any] = lambda: fx._Vit(config)  # noqa: E731
        return _as_case(fx, key, build, feeds, ("last_hidden_state",), axes), feeds
    total = entry.seq + entry.past
    mask = np.ones((batch, total), np.int64)
    mask[0, 0] = 0  # one padded position, as in a batch of prompts of different lengths
    feeds = {"input_ids": rng.integers(0, config.vocab_size, (batch, entry.seq)).astype(np.int64),
             "attention_mask": mask}
    axes = {"input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "total_sequence"}}
    if entry.network == "bert":
        axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
        return _as_case(fx, key, lambda: fx._Encoder(config), feeds, ("last_hidden_state",),
                        axes), feeds
    lm = GPT2LMHeadModel if entry.network == "gpt2" else LlamaForCausalLM
    axes["logits"] = {0: "batch", 1: "sequence"}
    if not entry.past:
        return _as_case(fx, key, lambda: fx._Decoder(lm(config)), feeds, ("logits",), axes), feeds
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    outputs = ["logits"]
    for i in range(layers):
        for kv in ("key", "value"):
            feeds[f"past.{i}.{kv}"] = rng.standard_normal(
                (batch, heads, entry.past, head_dim)).astype(np.float32)
            axes[f"past.{i}.{kv}"] = {0: "batch", 2: "past_sequence"}
            outputs.append(f"present.{i}.{kv}")
            axes[outputs[-1]] = {0: "batch", 2: "total_sequence"}
    return _as_case(fx, key, lambda: _step_module(lm(config), config, layers), feeds,
                    tuple(outputs), axes), feeds


def _as_case(fx: Any, key: str, build: Callable[[], Any], feeds: dict[str, np.ndarray],
             outputs: tuple[str, ...], axes: dict[str, dict[int, str]]) -> Any:
    import torch

    example = tuple(torch.from_numpy(v) for v in feeds.values())
    return fx.Case(key, fx._seeded(build), lambda: example, tuple(feeds), outputs, axes)


def export(key: str, out_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Export ``key`` into ``out_dir`` (``{key}.onnx``); returns the path and its inputs."""
    case, feeds = _case(key)
    written = _fixtures().export(case, False, out_dir)
    path = out_dir / f"{key}.onnx"
    written.replace(path)
    return path, feeds
