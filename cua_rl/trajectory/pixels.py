"""A training row's ``pixel_values`` as palette codes: the same floats at a quarter of the size, rebuilt bit-equal
in the trainer just before the model sees them.

Why: a screenshot's ``pixel_values`` are float32, about 24 MB per 1000-token image (4000 patches of
3x2x16x16), and a multi-turn row repeats every screenshot of its history. They travel from the rollout
worker to the trainer (AReaL serialises each batch shard), wait there for the whole step, and are copied once
more per micro-batch. Yet a processor that resizes 8-bit pixels and then rescales and normalises them gives
at most 256 distinct values per channel (Qwen3-VL normalises every channel alike: 256 values in all). So a
row keeps, per image tensor, the sorted distinct values (``pixel_palette``, float32) and one ``uint8`` code
per value (``int16`` when a row has up to 32768 distinct values, e.g. per-channel means; more than that and
the row keeps its floats). ``palette[codes]`` is the original tensor bit for bit: the codes are
``torch.unique``'s inverse, nothing is rounded. What vLLM saw is therefore what the trainer sees (both cast the
floats to the vision tower's dtype themselves).

The trainer side (``cua_rl.areal_ext.compact_images``): each micro-batch's rows are put on one palette
(``merge``), travel to the device as codes, and are decoded (``decode``) right before that micro-batch's
forward, so the step holds codes and only one micro-batch's floats at a time.
"""

from __future__ import annotations

import math

import torch

PALETTE = "pixel_palette"   # the row's key for the palette of its ``pixel_values`` codes
PIXELS = "pixel_values"
_U8, _I16 = 256, 32768      # distinct values that fit uint8 and int16 codes


def _code_dtype(n: int) -> torch.dtype | None:
    return torch.uint8 if n <= _U8 else torch.int16 if n <= _I16 else None


def _unique(pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted distinct values as int32 bits, each value's index among them)."""
    return torch.unique(pixels.contiguous().view(torch.int32), return_inverse=True)


def image_blocks(mmi: dict) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Each image of ``mmi``: its ``(t, h, w)`` grid and its rows of ``pixel_values``, in order."""
    grids = [tuple(g) for g in mmi["image_grid_thw"].tolist()]
    return list(zip(grids, torch.split(mmi[PIXELS], [math.prod(g) for g in grids])))


def pack(mmi: dict) -> dict:
    """``mmi`` with its float32 ``pixel_values`` as codes plus ``pixel_palette``; unchanged (a copy) when it
    has no float32 pixels, is packed already, or has too many distinct values."""
    return pack_rows([mmi])[0]


def pack_rows(items: list[dict]) -> list[dict]:
    """``pack`` for each of the rows' ``multi_modal_input`` dicts, sorting each distinct screenshot once: the
    rows of an episode repeat its history's screenshots (one row per turn), so each image block (its
    ``image_grid_thw`` patches) is looked up among the blocks seen before (sampled values, then ``torch.equal``)
    and its codes reused, re-indexed onto the row's palette."""
    seen: dict[tuple, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def block_codes(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = block.reshape(-1)
        key = (tuple(block.shape), flat[:: max(1, flat.numel() // 64)].numpy().tobytes())
        for other, bits, inverse in seen.get(key, []):
            if torch.equal(other, block):
                return bits, inverse
        bits, inverse = _unique(block)
        inverse = inverse.to(_code_dtype(bits.numel()) or torch.int32)   # kept for the group: small codes
        seen.setdefault(key, []).append((block, bits, inverse))
        return bits, inverse

    out = []
    for mmi in items:
        row = dict(mmi)
        pixels = row.get(PIXELS)
        if PALETTE in row or not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.float32:
            out.append(row)
            continue
        grids = row.get("image_grid_thw")
        whole = not isinstance(grids, torch.Tensor) or int(grids.prod(-1).sum()) != pixels.shape[0]
        blocks = [pixels] if whole else [b for _, b in image_blocks(row)]
        packed = [block_codes(b) for b in blocks]
        bits = packed[0][0] if len(packed) == 1 else torch.unique(torch.cat([b for b, _ in packed]))
        dtype = _code_dtype(bits.numel())
        if dtype is not None:
            # each block's codes re-indexed onto the row's palette through a lookup table of its own
            codes = [inv.to(dtype) if b is bits else decode(inv, torch.searchsorted(bits, b).to(dtype))
                     for b, inv in packed]
            row[PIXELS], row[PALETTE] = torch.cat(codes) if len(codes) > 1 else codes[0], bits.view(torch.float32)
        out.append(row)
    return out


def decode(codes: torch.Tensor, palette: torch.Tensor) -> torch.Tensor:
    """The float pixels the codes stand for (on the codes' device)."""
    flat = palette.to(codes.device).index_select(0, codes.reshape(-1).to(torch.int32))
    return flat.view(codes.shape)


def unpack(mmi: dict) -> dict:
    """``mmi`` with float ``pixel_values`` again (a copy; unchanged when it was not packed)."""
    out = dict(mmi)
    if PALETTE in out:
        out[PIXELS] = decode(out[PIXELS], out.pop(PALETTE))
    return out


def merge(items: list[dict]) -> tuple[list[dict], torch.Tensor | None]:
    """The items (rows' ``multi_modal_input`` dicts, in order) with their codes re-indexed onto one palette, and
    that palette; ``(items with float pixels, None)`` when some row is not packed or the union does not fit
    int16 codes. Items without pixels pass through."""
    with_pixels = [it for it in items if PIXELS in it]
    if not with_pixels or not any(PALETTE in it for it in with_pixels):
        return list(items), None
    if not all(PALETTE in it for it in with_pixels):
        return [unpack(it) for it in items], None
    palettes = [it[PALETTE] for it in with_pixels]
    if all(torch.equal(p, palettes[0]) for p in palettes[1:]):
        merged = palettes[0]
    else:
        merged = torch.unique(torch.cat([p.view(torch.int32) for p in palettes])).view(torch.float32)
    dtype = _code_dtype(merged.numel())
    if dtype is None:
        return [unpack(it) for it in items], None
    merged_bits = merged.view(torch.int32)
    out = []
    for it in items:
        if PIXELS not in it:
            out.append(it)
            continue
        it = dict(it)
        palette = it.pop(PALETTE)
        if palette is not merged and not torch.equal(palette, merged):
            lut = torch.searchsorted(merged_bits, palette.view(torch.int32)).to(dtype)
            it[PIXELS] = decode(it[PIXELS], lut)
        elif it[PIXELS].dtype != dtype:
            it[PIXELS] = it[PIXELS].to(dtype)
        out.append(it)
    return out, merged


def nbytes(rows_mmi: list[dict]) -> int:
    """Bytes of the tensors in these ``multi_modal_input`` dicts (what a step holds of its images)."""
    return sum(v.numel() * v.element_size() for it in rows_mmi for v in it.values() if isinstance(v, torch.Tensor))
