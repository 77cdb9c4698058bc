"""The module kinds a sharded model needs beyond plain nn.Linear (column-parallel layers are plain nn.Linear with
fewer output rows): a row-parallel linear, the RMSNorm that sums its output over the ranks, and a vocab-parallel
embedding."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from verifier_service.model.cpu_linear import PrepackedLinear
from verifier_service.model.layers import RMSNorm
from verifier_service.sharding.collectives import all_reduce_, all_reduce_add_rms_norm, fuses_add_rms_norm


class RowParallelLinear(nn.Linear):
    """y = sum over ranks (x_r W_r^T) + b: this rank holds the input columns W_r of its heads / MLP slice.

    The bias is the whole bias on every rank, added after the all-reduce (so it counts once). A subclass
    of nn.Linear so that parameter names and shapes load as the checkpoint's; the CPU's oneDNN prepacking
    (model/cpu_linear.py), which replaces plain nn.Linear only, leaves it alone.

    reduce_output False (a layer without bias whose output feeds a ReducingRMSNorm): forward returns this rank's
    partial sum x_r W_r^T and the norm sums it.

    `product` (None: F.linear), when set, computes x_r W_r^T instead: the CPU's deterministic mode sets the
    fixed-row oneDNN linear (use_fixed_rows).
    """

    def __init__(self, *args, reduce_output: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reduce_output = reduce_output
        self.product: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, in_features / N] -> [num_tokens, out_features], the same on every rank."""
        out = F.linear(x, self.weight) if self.product is None else self.product(x)
        if not self.reduce_output:
            return out
        all_reduce_(out)
        return out if self.bias is None else out + self.bias


def use_fixed_rows(model: nn.Module, rows: int) -> None:
    """Every RowParallelLinear of model computes its product in oneDNN chunks of exactly `rows` rows, as
    model/cpu_linear.py's prepack_linears does for the plain linears (the CPU's deterministic mode)."""
    for module in model.modules():
        if type(module) is RowParallelLinear:
            module.product = PrepackedLinear(module, rows, bias=False)  # the bias comes after the sum


class ReducingRMSNorm(RMSNorm):
    """The norm after a row-parallel layer that leaves its sum to it: add_forward(x, residual) sums x (the layer's
    partial output) over the ranks, then adds and norms. With the one-shot all-reduce that is one kernel
    (collectives.all_reduce_add_rms_norm); else NCCL's all-reduce, then the add and norm the compiler fuses."""

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fuses_add_rms_norm(x):
            return all_reduce_add_rms_norm(x, residual, self.weight, self.eps)
        all_reduce_(x)
        return super().add_forward(x, residual)


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + num_embeddings) of the embedding matrix; other ids give zeros
    here and their row on the rank that holds it, and the all-reduce adds them up."""

    def __init__(self, vocab_start: int, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.vocab_start, self.num_embeddings = vocab_start, num_embeddings
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [num_tokens] -> [num_tokens, embedding_dim]."""
        local_ids = input_ids - self.vocab_start
        here = (local_ids >= 0) & (local_ids < self.num_embeddings)
        rows = F.embedding(local_ids.masked_fill(~here, 0), self.weight).masked_fill(~here.unsqueeze(-1), 0)
        all_reduce_(rows)
        return rows

    def extra_repr(self) -> str:
        return f"vocab_start={self.vocab_start}, num_embeddings={self.num_embeddings}"
