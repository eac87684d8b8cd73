"""Training rows whose images are palette codes (cua_rl/trajectory/pixels.py) in AReaL's FSDP engine: merged per
micro-batch, moved to the device as codes, decoded right before that micro-batch's forward.

Why here: AReaL 1.0.4 concatenates each micro-batch's ``pixel_values`` (``_prepare_multimodal_forward_inputs``)
for every micro-batch of the call at once and then moves them all to the device, so with float rows a step
holds the whole batch's images twice on the host and once on the device. With codes it holds a quarter of
that, plus one micro-batch's floats during its forward and backward.

``enable()`` wraps two points, process-wide and idempotent (``cua_rl.areal_ext.worker`` calls it in every
training worker; tests that hand rows to an actor in their own process call it too):
- ``fsdp_engine._prepare_multimodal_forward_inputs``: the micro-batch's rows put on one palette
  (``pixels.merge``) before AReaL concatenates their codes; the palette rides along as ``pixel_palette``;
- ``FSDPEngine._prepare_mb_inputs``: the forward's inputs get the decoded floats in a copy of the dict, so the
  micro-batch list keeps only the codes.
A batch without palettes passes through both untouched.
"""

from __future__ import annotations

from cua_rl.trajectory.pixels import PALETTE, PIXELS, decode, merge

_enabled = False


def merged_forward_inputs(original):
    """``_prepare_multimodal_forward_inputs(mb, padded_mb)`` that merges the rows' palettes first."""

    def prepare(mb, padded_mb):
        source = mb if mb.get("multi_modal_input") is not None else padded_mb
        palette = None
        if source.get("multi_modal_input"):
            source["multi_modal_input"], palette = merge(source["multi_modal_input"])
        original(mb, padded_mb)
        if palette is not None:
            padded_mb[PALETTE] = palette

    return prepare


def decoded_inputs(original):
    """``_prepare_mb_inputs(self, mb_item)`` whose model inputs carry float pixels (a copy of the dict)."""

    def prepare(self, mb_item):
        inputs, ctx = original(self, mb_item)
        if PALETTE in inputs:
            inputs = dict(inputs)
            inputs[PIXELS] = decode(inputs[PIXELS], inputs.pop(PALETTE))
            ctx.model_inputs = inputs
        return inputs, ctx

    return prepare


def enable() -> None:
    global _enabled
    if _enabled:
        return
    from areal.engine import fsdp_engine

    fsdp_engine._prepare_multimodal_forward_inputs = merged_forward_inputs(
        fsdp_engine._prepare_multimodal_forward_inputs)
    fsdp_engine.FSDPEngine._prepare_mb_inputs = decoded_inputs(fsdp_engine.FSDPEngine._prepare_mb_inputs)
    _enabled = True
