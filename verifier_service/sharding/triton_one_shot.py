"""The one-shot all-reduce's kernel: push, poll, sum in one launch, with the residual add and RMSNorm after it.

Each rank's buffer (symmetric memory, mapped by every rank of the host) holds, per parity and sender, one slot as
large as the biggest tensor taken. A rank stores its own 16-bit words straight into its slot of every peer's buffer,
then polls its own buffer until every peer's words are there and sums them in rank order (so every rank gets the
same bits), then marks what it read empty again. A word is empty while it holds -0.0 (the "Lamport" scheme of
TensorRT-LLM's low-latency all-reduce): senders send -0.0 as +0.0, so a value is its own arrival flag, and no
barrier or signal is needed.

Program i of a launch owns the same words at every rank and flips its parity at the end; the next launch that runs
program i uses the other parity's slots. A peer can reuse the slots program i read only two of its launches later,
which it cannot reach before this rank has sent it the launch in between, i.e. after this launch has finished (and
emptied them). Ranks run the same launches in the same order (they run the same forward), so their parities agree.
"""
from __future__ import annotations

import triton
import triton.language as tl

from verifier_service.kernels.triton_pdl import prologue

EMPTY = tl.constexpr(-32768)  # the bits of -0.0 in bf16 and fp16


@triton.jit
def one_shot_kernel(words, out, residual, weight, residual_out, numel, width, eps, buffer_ptrs, base, slot, parities,
                    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr,
                    PDL: tl.constexpr):
    """Program i sums words[i * width : (i + 1) * width] (the 16-bit view of a bf16 / fp16 tensor) over the ranks.
    The slots start `base` words into each rank's buffer (buffer_ptrs: the ranks' buffers, 16-bit words), `slot`
    words per parity and sender. NORM False: the sum goes to out. NORM True (a row per program, width = hidden
    size): residual_out = residual + sum, out = weight * rms_norm(residual_out), rounded as the model's RMSNorm
    rounds (model/layers.py). PDL: launched with programmatic dependent launch (kernels/pdl.py)."""
    prologue(PDL)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    offsets = pid * width + cols
    mask = (cols < width) & (offsets < numel)
    parity = tl.load(parities + pid)
    mine = tl.load(words + offsets, mask=mask, other=0)
    mine = tl.where(mine == EMPTY, tl.zeros_like(mine), mine)  # -0.0 is sent as +0.0: -0.0 means "not here yet"
    buffers = buffer_ptrs.to(tl.pointer_type(tl.uint64))
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            peer_buffer = tl.load(buffers + peer).to(tl.pointer_type(tl.int16))
            tl.store(peer_buffer + base + (parity * WORLD + RANK) * slot + offsets, mine, mask=mask)
    own_buffer = tl.load(buffers + RANK).to(tl.pointer_type(tl.int16))
    dtype = out.dtype.element_ty
    if NORM:  # loaded while the peers' words travel, not after
        before = tl.load(residual + offsets, mask=mask, other=0).to(tl.float32)
        scale = tl.load(weight + cols, mask=mask, other=0).to(tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for sender in tl.static_range(WORLD):
        if sender == RANK:
            got = mine
        else:
            inbox = own_buffer + base + (parity * WORLD + sender) * slot + offsets
            got = tl.load(inbox, mask=mask, other=0, volatile=True)
            while tl.max(tl.where(got == EMPTY, 1, 0)) > 0:
                got = tl.load(inbox, mask=mask, other=0, volatile=True)
            tl.store(inbox, tl.full([BLOCK], EMPTY, tl.int16), mask=mask)
        total += got.to(dtype, bitcast=True).to(tl.float32)
    reduced = total.to(dtype)  # what an all-reduce returns
    if NORM:
        stream = (before + reduced.to(tl.float32)).to(dtype)
        tl.store(residual_out + offsets, stream, mask=mask)
        h = stream.to(tl.float32)
        normed = (h * tl.rsqrt(tl.sum(h * h) / width + eps)).to(dtype)
        tl.store(out + offsets, (scale * normed.to(tl.float32)).to(dtype), mask=mask)
    else:
        tl.store(out + offsets, reduced, mask=mask)
    tl.store(parities + pid, 1 - parity)
