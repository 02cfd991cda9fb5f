"""Uniform KIVI-style quantisation of every KV entry (Liu et al., "KIVI", ICML 2024), as a codec press.

Also home of the asymmetric min-max quantiser that QEvict's int4 tier shares (`min_max_params`, `encode`,
`decode`, `pack_bits`, `unpack_bits`): one quantiser, so both presses round the same way.
"""

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from kvpress import BasePress
from torch import nn

BITS = (8, 4, 2)  # the widths the press offers, widest first (the order the budget is tried in)
GROUP = 32  # tokens per key group and channels per value group (KIVI's group size; see QuantPress)


def store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The 16-bit type a store keeps full-precision entries in: bfloat16 for bfloat16 models, else float16."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float16


def as_stored(x: torch.Tensor) -> torch.Tensor:
    """`x` as a 16-bit store gives it back (rounded through the store's dtype), in x's dtype."""
    return x.to(store_dtype(x.dtype)).to(x.dtype)


def min_max_params(low: torch.Tensor, high: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16 scale and zero-point of asymmetric min-max quantisation of [low, high] to 2**bits levels.

    The zero-point is the minimum itself (as KIVI and QEvict's code): codes = round((x - zero) / scale). A
    constant group (or one whose range underflows fp16) gets scale 1, so every code is 0 and decodes to zero.
    """
    scale = ((high.float() - low.float()) / (2**bits - 1)).to(torch.float16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale, low.to(torch.float16)


def encode(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes in [0, 2**bits) of x with these (broadcastable) parameters; arithmetic in float32."""
    return ((x.float() - zero.float()) / scale.float()).round().clamp(0, 2**bits - 1).to(torch.uint8)


def decode(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """float32 reconstruction code * scale + zero."""
    return codes.float() * scale.float() + zero.float()


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """8 // bits codes per byte along the last dimension (first code in the high bits)."""
    per_byte = 8 // bits
    grouped = codes.view(*codes.shape[:-1], -1, per_byte)
    shifts = torch.arange(per_byte - 1, -1, -1, device=codes.device, dtype=torch.uint8) * bits
    return (grouped << shifts).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    per_byte = 8 // bits
    shifts = torch.arange(per_byte - 1, -1, -1, device=packed.device, dtype=torch.uint8) * bits
    codes = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return codes.view(*packed.shape[:-1], -1)


def value_group(head_dim: int) -> int:
    """Channels per value group: GROUP, or the whole head when GROUP does not divide it."""
    return GROUP if head_dim % GROUP == 0 else head_dim


def quantised_tokens(length: int) -> int:
    """Tokens in whole key groups; the rest (at most GROUP - 1, the most recent) stay at 16 bits."""
    return length // GROUP * GROUP


def quant_bytes(length: int, head_dim: int, bits: int) -> int:
    """Bytes one (sequence, KV head) of `length` tokens takes in the store at `bits` (metadata included)."""
    n = quantised_tokens(length)
    codes = 2 * n * head_dim * bits // 8  # keys and values
    key_params = n // GROUP * head_dim * 2 * 2  # fp16 scale + zero-point per (group of tokens, channel)
    value_params = n * (head_dim // value_group(head_dim)) * 2 * 2  # per (token, group of channels)
    residual = (length - n) * 2 * head_dim * 2
    return codes + key_params + value_params + residual


def quantise_keys(keys: torch.Tensor, bits: int):
    """Keys per channel over groups of GROUP tokens: codes (b, h, groups, GROUP, d), scale and zero-point
    (b, h, groups, d)."""
    b, h, n, d = keys.shape
    grouped = keys.reshape(b, h, n // GROUP, GROUP, d)
    scale, zero = min_max_params(grouped.amin(3), grouped.amax(3), bits)
    return encode(grouped, scale.unsqueeze(3), zero.unsqueeze(3), bits), scale, zero


def quantise_values(values: torch.Tensor, bits: int):
    """Values per token over groups of channels: codes (b, h, n, groups, size), scale and zero-point
    (b, h, n, groups)."""
    b, h, n, d = values.shape
    grouped = values.reshape(b, h, n, d // value_group(d), value_group(d))
    scale, zero = min_max_params(grouped.amin(-1), grouped.amax(-1), bits)
    return encode(grouped, scale.unsqueeze(-1), zero.unsqueeze(-1), bits), scale, zero


def pack(keys: torch.Tensor, values: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """The store of one layer as real tensors: packed codes, fp16 scales/zero-points, the 16-bit residual."""
    n = quantised_tokens(keys.shape[2])
    key_codes, key_scale, key_zero = quantise_keys(keys[:, :, :n], bits)
    value_codes, value_scale, value_zero = quantise_values(values[:, :, :n], bits)
    return {
        "key_codes": pack_bits(key_codes, bits),
        "key_scale": key_scale,
        "key_zero": key_zero,
        "value_codes": pack_bits(value_codes.flatten(-2), bits),
        "value_scale": value_scale,
        "value_zero": value_zero,
        "residual_keys": keys[:, :, n:].to(store_dtype(keys.dtype)),
        "residual_values": values[:, :, n:].to(store_dtype(values.dtype)),
    }


def unpack(packed: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (in `dtype`) from `pack`'s tensors; bits and groups are read off the shapes."""
    key_scale, value_scale = packed["key_scale"], packed["value_scale"]
    b, h, groups, d = key_scale.shape
    bits = 8 * packed["key_codes"].shape[-1] // d
    key_codes = unpack_bits(packed["key_codes"], bits)
    keys = decode(key_codes, key_scale.unsqueeze(3), packed["key_zero"].unsqueeze(3))
    n = groups * GROUP
    value_codes = unpack_bits(packed["value_codes"], bits).view(b, h, n, value_scale.shape[-1], -1)
    values = decode(value_codes, value_scale.unsqueeze(-1), packed["value_zero"].unsqueeze(-1))
    keys = torch.cat([keys.reshape(b, h, n, d).to(dtype), packed["residual_keys"].to(dtype)], dim=2)
    values = torch.cat([values.reshape(b, h, n, d).to(dtype), packed["residual_values"].to(dtype)], dim=2)
    return keys, values


@dataclass
class QuantPress(BasePress):
    """Quantise every key and value, KIVI's way: keys per channel over groups of tokens, values per token
    over groups of channels, asymmetric min-max with an fp16 scale and fp16 zero-point per group.

    Keeps every entry; `compress` returns the dequantised keys/values (what attention reads).

    Defaults and where they come from:
    - `bits`: None = the widest of 8/4/2 whose bytes fit `memory` (at this layer's length); given, it must
      fit or compress raises ValueError. KIVI evaluates 2 and 4 bits; 8 is the usual safe width.
    - group size 32 (tokens per key group, channels per value group): KIVI's own setting (G = 32 in its
      experiments). Heads whose dimension 32 does not divide get one value group per token.
    - residual: the tokens after the last whole key group (at most 31, the most recent) stay at 16 bits,
      keys and values both, as KIVI's full-precision residual; they are counted at 16 bits.
    - `memory`: the budget as a fraction of the 16-bit full cache, given by the registry.
    The residual is returned as a 16-bit store holds it (rounded through float16, bfloat16 for bfloat16
    models), so `unpack(pack(...))` gives back exactly what attention reads.
    A repeated call (decode-time, streaming, multi-turn: kvpress's DecodingPress around it) quantises the
    whole cache again: dequantised groups come back through min-max quantisation at the same codes, up to
    the fp16 rounding of their parameters. There the DecodingPress sets `compression_ratio` to its target,
    and the budget is that of the evictors beside it, (1 - ratio) of the current length in 16-bit entries
    (as QEvict reads it), so that the cache stays under the same cap as the answer grows; where even 2 bits
    exceed that cap (a small memory and a long answer), the press stores 2 bits rather than fail mid-answer,
    and the bytes accounted say so.
    """

    memory: float = 1.0
    bits: int | None = None
    compression_ratio: float | None = None  # set by a DecodingPress only (above)
    layer_bytes: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    shares_prefill: ClassVar[bool] = True

    def __post_init__(self):
        if self.bits is not None and self.bits not in BITS:
            raise ValueError(f"quant: bits must be one of 2, 4, 8, got {self.bits}")
        if not 0 < self.memory <= 1:
            raise ValueError(f"quant: memory must be in (0, 1], got {self.memory}")
        # Fail before any work when even the cheapest case cannot meet the budget: whole groups (no 16-bit
        # residual) of a head_dim that 32 divides. compress checks the real length and head_dim.
        bits = self.bits or BITS[-1]
        cheapest = quant_bytes(GROUP, 128, bits) / (GROUP * 2 * 128 * 2)
        if self.memory < cheapest:
            raise ValueError(
                f"quant: memory {self.memory} is below what {bits} bits need: at least {cheapest:.3g} of the"
                " 16-bit cache"
            )

    def choose_bits(self, length: int, head_dim: int) -> int:
        full = length * 2 * head_dim * 2
        live = self.compression_ratio is not None
        memory = int(length * (1 - self.compression_ratio)) / length if live else self.memory
        for bits in [self.bits] if self.bits else BITS:
            if quant_bytes(length, head_dim, bits) / full <= memory:  # as memory_ratio is compared
                return bits
        bits = self.bits or BITS[-1]
        if live:
            return bits
        needed = quant_bytes(length, head_dim, bits) / (length * 2 * head_dim * 2)
        raise ValueError(
            f"quant: memory {self.memory} is below what {bits} bits need: {needed:.3g} of the 16-bit cache"
            f" ({length} tokens, head_dim {head_dim})"
        )

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, length, head_dim = keys.shape
        if head_dim % 4:
            raise ValueError(f"quant: head_dim must be a multiple of 4 to pack codes, got {head_dim}")
        bits = self.choose_bits(length, head_dim)
        self.layer_bytes[int(module.layer_idx)] = batch * heads * quant_bytes(length, head_dim, bits)
        n = quantised_tokens(length)
        key_codes, key_scale, key_zero = quantise_keys(keys[:, :, :n], bits)
        value_codes, value_scale, value_zero = quantise_values(values[:, :, :n], bits)
        dequantised_keys = decode(key_codes, key_scale.unsqueeze(3), key_zero.unsqueeze(3))
        dequantised_values = decode(value_codes, value_scale.unsqueeze(-1), value_zero.unsqueeze(-1))
        shape = (batch, heads, n, head_dim)
        keys = torch.cat([dequantised_keys.view(shape).to(keys.dtype), as_stored(keys[:, :, n:])], dim=2)
        values = torch.cat(
            [dequantised_values.view(shape).to(values.dtype), as_stored(values[:, :, n:])], dim=2
        )
        return keys, values
