"""Reference GPT: the small decoder-only transformer every Unicron job trains.

Token + position embeddings, ``n_layer`` pre-LN blocks of causal self-attention and an MLP,
a final LayerNorm and a language-model head (tied to the token embedding by default).
It is deliberately plain so that CPU (gloo) and GPU (nccl) runs compute the same thing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from unicron.shared.contracts.models import ModelConfig
from unicron.trainer.data import derive_seed

_INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        # No bias: a key bias shifts every score of a query equally, so softmax gives it zero
        # gradient; Adam would normalise that zero's rounding noise into real updates, and
        # runs with different world sizes (different summation order) would drift apart.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads), the layout scaled_dot_product_attention wants.
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(batch, seq, width))
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """Decoder-only transformer over ``cfg.vocab`` tokens and contexts of ``cfg.seq_len``."""

    def __init__(self, cfg: ModelConfig, *, tie_weights: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.apply(_init_weights)
        if tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, seq, vocab) for token ids of shape (batch, seq)."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over every token of the batch."""
        logits = self(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=_INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=_INIT_STD)


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> GPT:
    """The job's initial model: identical on every rank and every device for the same seed.

    Parameters are drawn on the CPU from a generator seeded only by ``seed`` and moved
    afterwards, so a GPU rank and a CPU rank start from the same bits.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed))
        model = GPT(cfg)
    return model.to(device)
