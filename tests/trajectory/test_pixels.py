"""Palette codes for the rows' pixels (cua_rl/trajectory/pixels.py) and the engine's side of them
(cua_rl/areal_ext/compact_images.py): the real processor's output on a screenshot comes back bit for bit, rows with
different palettes share one after ``merge``, what does not fit stays float, and AReaL's own micro-batch
preparation hands the model the floats. (The same rows through the real actor give the same logprobs bit for
bit: tests/policy/test_gates_trainer.py.)"""

import torch

from cua_rl.policy import EndpointSettings, prompt_from_messages
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.trajectory.pixels import PALETTE, PIXELS, decode, merge, nbytes, pack, unpack
from tests.doubles.policy_helpers import png_data_url


def _screenshot_mmi(processor, colour):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Click."},
                                         {"type": "image_url", "image_url": {"url": png_data_url(colour)}}]}]
    return prompt_from_messages(processor, processor.tokenizer, EndpointSettings(), msgs).multi_modal_input


def test_the_processors_pixels_come_back_bit_for_bit_at_a_quarter_of_the_size(processor):
    mmi = _screenshot_mmi(processor, (30, 140, 220))
    packed = pack(mmi)
    assert packed[PIXELS].dtype == torch.uint8 and packed[PALETTE].dtype == torch.float32
    assert packed[PIXELS].shape == mmi[PIXELS].shape and torch.equal(packed["image_grid_thw"], mmi["image_grid_thw"])
    assert torch.equal(unpack(packed)[PIXELS], mmi[PIXELS])
    assert nbytes([packed]) < 0.26 * nbytes([mmi]) + 1100
    assert torch.equal(pack(packed)[PIXELS], packed[PIXELS])     # packing twice changes nothing
    assert pack({}) == {} and unpack({}) == {}


def test_many_distinct_values_take_int16_codes_and_too_many_stay_float():
    torch.manual_seed(0)
    some = {PIXELS: torch.randint(0, 1000, (64, 12)).float() / 7}
    packed = pack(some)
    assert packed[PIXELS].dtype == torch.int16 and torch.equal(unpack(packed)[PIXELS], some[PIXELS])
    many = {PIXELS: torch.randn(300, 200)}          # 60,000 distinct values: more than int16 codes hold
    assert PALETTE not in pack(many) and pack(many)[PIXELS] is many[PIXELS]
    half = {PIXELS: torch.randn(4, 4).half()}        # not float32: left as it is
    assert PALETTE not in pack(half)


def test_rows_with_different_palettes_share_one_after_merge():
    a = {PIXELS: torch.tensor([[0.5, -1.0], [0.25, 0.5]]), "image_grid_thw": torch.tensor([[1, 1, 2]])}
    b = {PIXELS: torch.tensor([[0.75, 0.0]])}
    items, palette = merge([pack(a), {}, pack(b)])
    assert palette is not None and items[1] == {} and all(PALETTE not in it for it in items)
    assert torch.equal(decode(items[0][PIXELS], palette), a[PIXELS])
    assert torch.equal(decode(items[2][PIXELS], palette), b[PIXELS])
    assert torch.equal(torch.cat([decode(it[PIXELS], palette) for it in (items[0], items[2])]),
                       torch.cat([a[PIXELS], b[PIXELS]]))
    mixed, none = merge([pack(a), b])                # one row float: everything decoded, no palette
    assert none is None and torch.equal(mixed[0][PIXELS], a[PIXELS]) and mixed[1][PIXELS] is b[PIXELS]
    plain, none = merge([a, b])                      # nothing packed: untouched
    assert none is None and plain[0] is a


def test_areals_micro_batch_preparation_hands_the_model_floats(processor):
    """AReaL's own ``_prepare_multimodal_forward_inputs`` and ``_prepare_mb_inputs`` with the patch: the model's
    inputs carry the concatenated floats; the micro-batch keeps only codes."""
    import types

    from areal.engine import fsdp_engine

    from cua_rl.areal_ext import compact_images
    from cua_rl.policy.records import Turn

    compact_images.enable()
    turns = [Turn(prompt_ids=[1, 2], output_ids=[3], output_logprobs=[-1.0], output_versions=[0],
                  multi_modal_input=_screenshot_mmi(processor, colour), n_images=1)
             for colour in ((200, 10, 10), (10, 200, 10))]
    batch = group_batch([EpisodeOutcome([t], float(i)) for i, t in enumerate(turns)])
    mb, padded = {"multi_modal_input": batch["multi_modal_input"]}, {}
    fsdp_engine._prepare_multimodal_forward_inputs(mb, padded)
    assert "multi_modal_input" not in mb and padded[PIXELS].dtype in (torch.uint8, torch.int16)
    engine = types.SimpleNamespace(parallel_helper=types.SimpleNamespace(sp_size=1))
    inputs, ctx = fsdp_engine.FSDPEngine._prepare_mb_inputs(engine, types.SimpleNamespace(
        padded_mb=padded, orig_mb=mb, padding_length=0))
    floats = torch.cat([t.multi_modal_input[PIXELS] for t in turns])
    assert torch.equal(inputs[PIXELS], floats) and PALETTE not in inputs and ctx.model_inputs is inputs
    assert padded[PIXELS].dtype != torch.float32                 # the micro-batch list still holds codes


def test_a_screenshot_repeated_in_later_rows_is_sorted_once_and_each_row_decodes_exactly(processor, monkeypatch):
    """Rows of one episode repeat its history's screenshots: ``pack_rows`` sorts each distinct one once and
    re-indexes its codes onto each row's palette."""
    from cua_rl.trajectory import pixels

    shots = [_screenshot_mmi(processor, c) for c in ((250, 250, 250), (10, 120, 60), (90, 90, 200))]
    rows = [{PIXELS: torch.cat([s[PIXELS] for s in shots[:n]]),
             "image_grid_thw": torch.cat([s["image_grid_thw"] for s in shots[:n]])} for n in (1, 2, 3)]
    sorted_blocks = []
    monkeypatch.setattr(pixels, "_unique", lambda t: sorted_blocks.append(t.shape) or torch.unique(
        t.contiguous().view(torch.int32), return_inverse=True))
    packed = pixels.pack_rows(rows)
    assert len(sorted_blocks) == 3                       # three distinct screenshots, six occurrences
    for row, p in zip(rows, packed):
        assert p[PIXELS].dtype == torch.uint8 and torch.equal(unpack(p)[PIXELS], row[PIXELS])
