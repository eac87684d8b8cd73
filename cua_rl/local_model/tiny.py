"""Offline builder of a tiny Qwen3-VL checkpoint (random weights, own BPE tokenizer, own chat template).

Why: CI and laptops must run the real loop (inference server, PPO, weight updates) with no model hub and
no GPU. The checkpoint is a real Qwen3-VL directory (config, safetensors, tokenizer, processor, chat
template) so every consumer loads it with ``AutoProcessor`` / ``AutoModelForImageTextToText`` exactly as
it would a released model. Everything is deterministic from ``seed``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig


logger = logging.getLogger(__name__)

# Qwen2/Qwen3 pre-tokenisation (same regex as transformers' Qwen2Tokenizer, so the tokenizer behaves the
# same whether it is rebuilt from vocab/merges or loaded from tokenizer.json).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Order matters: ids are assigned in this order right after the byte alphabet, like Qwen's added tokens.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
# Markup tokens that Qwen keeps in decoded text (special=False) so tool calls survive skip_special_tokens.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# A small built-in corpus: enough English, JSON and UI words that common agent text tokenises compactly.
_CORPUS = """
You are a helpful assistant that operates a computer. Look at the screenshot and decide the next action.
Click the button labelled OK. Double click the file icon. Right click on the desktop. Scroll down the page.
Type the text into the search box and press Enter. Open the terminal, the text editor and the file manager.
Save the document with ctrl+s. Close the window. Select all with ctrl+a, copy with ctrl+c, paste with ctrl+v.
The task is complete. I will click on the menu, then choose Settings, then toggle the switch.
{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}}
{"name": "computer_use", "arguments": {"action": "type", "text": "hello world"}}
{"name": "computer_use", "arguments": {"action": "key", "keys": ["ctrl", "s"]}}
{"name": "computer_use", "arguments": {"action": "scroll", "pixels": -300}}
{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}
{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [120, 640]}}
{"type": "click", "x": 0.5, "y": 0.25, "button": "left", "count": 1}
answer: the value is 42. Thought: the window shows a dialog. Action: click at (0.31, 0.72).
0 1 2 3 4 5 6 7 8 9 10 100 250 500 750 999 1000 0.1 0.25 0.5 0.75 true false null
abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'"()[]{}<>/\\|-_=+*&^%$#@~`
"""


@dataclass(frozen=True)
class TinySpec:
    """Dimensions of the tiny model; defaults give a ~2.4 MB float32 checkpoint that runs fast on 1 core.

    ``head_dim`` is 64 because vLLM's CPU attention kernels accept only the head sizes real models use
    (64, 80, 96, 112, 128, 256; 16 kills the engine with "Unsupported CPU attention configuration").
    """

    vocab_target: int = 1024        # BPE vocabulary size to train (before special tokens)
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_heads: int = 2
    vision_intermediate: int = 64
    # Pixel limits of the processor: a 1280x800 screenshot becomes 320x192 px -> 240 patches -> 60 tokens.
    min_pixels: int = 32 * 32 * 4
    max_pixels: int = 32 * 32 * 64
    # Spread of the output logits: larger than HF's 0.02 so the next-token distribution is far from uniform
    # (otherwise a wrong temperature convention could hide inside logprob tolerances).
    lm_head_std: float = 0.3


def _train_tokenizer(spec: TinySpec):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_target, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    # Repeating the corpus does not change the merges; training is deterministic for a fixed input.
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line.strip()], trainer=trainer)
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def chat_template_text() -> str:
    return resources.files(__package__).joinpath("chat_template.jinja").read_text()


def build_tiny(out_dir: str | Path, seed: int = 0, spec: TinySpec | None = None) -> Path:
    """Write a tiny random Qwen3-VL checkpoint to ``out_dir`` and return its path.

    Loads with ``AutoProcessor.from_pretrained(out_dir)`` and
    ``AutoModelForImageTextToText.from_pretrained(out_dir)``. Same seed and spec -> same files' content.
    """
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_qwen2_vl_fast import Qwen2VLImageProcessorFast
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # one log line says it was built; no shard-writing bar
    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    raw_tok = _train_tokenizer(spec)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=raw_tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        model_max_length=32768, clean_up_tokenization_spaces=False,
    )
    ids = {t: raw_tok.token_to_id(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS}
    n_tokens = raw_tok.get_vocab_size(with_added_tokens=True)
    # Exactly the tokenizer's size: a random lm_head would otherwise sample padding rows no tokenizer knows.
    vocab_size = n_tokens

    rotary_half = spec.head_dim // 2
    mrope = [rotary_half - 2 * (rotary_half // 4), rotary_half // 4, rotary_half // 4]
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": mrope, "mrope_interleaved": True},
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"], dtype="float32",
        ),
        vision_config=dict(
            depth=spec.vision_depth, hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
            out_hidden_size=spec.hidden_size, num_position_embeddings=16 * 16,
            deepstack_visual_indexes=[spec.vision_depth - 1],
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        head = model.lm_head.weight
        head.copy_(torch.randn(head.shape, generator=gen) * spec.lm_head_std)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out, safe_serialization=True)

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    image_processor = Qwen2VLImageProcessorFast(
        size=size, patch_size=16, temporal_patch_size=2, merge_size=2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    video_processor = Qwen3VLVideoProcessor(size=size, patch_size=16, temporal_patch_size=2, merge_size=2)
    processor = Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=hf_tok, video_processor=video_processor,
        chat_template=chat_template_text(),
    )
    processor.save_pretrained(out)
    _fix_tokenizer_config(out)
    (out / "tiny_spec.json").write_text(json.dumps(_stamp(seed, spec), indent=2))
    logger.info("built tiny Qwen3-VL at %s (vocab %d, %d params)", out, vocab_size,
                sum(p.numel() for p in model.parameters()))
    return out


def _stamp(seed: int, spec: TinySpec) -> dict:
    """What a build depends on: seed, dimensions, chat template (tiny_spec.json records it)."""
    template = hashlib.sha256(chat_template_text().encode()).hexdigest()[:16]
    return {"seed": seed, **asdict(spec), "chat_template_sha256": template}


def is_current(model_dir: str | Path, seed: int = 0, spec: TinySpec | None = None) -> bool:
    """Whether ``model_dir`` holds the tiny model this code builds (a checkpoint from an older builder, e.g.
    with head_dim 16 that vLLM rejects or another chat template, is not)."""
    try:
        saved = json.loads((Path(model_dir) / "tiny_spec.json").read_text())
    except (OSError, ValueError):
        return False
    return saved == _stamp(seed, spec or TinySpec()) and (Path(model_dir) / "config.json").exists()


def ensure_embedded_model(config: CUAConfig) -> Path:
    """``actor.path`` of ``config``; when that is the embedded tiny model's directory, the model is built there
    first if it is missing or an older builder's (the launcher before vLLM starts, and the warm start before its
    key is taken: the key names the base weights, so a key taken before the build names no weights and the
    next run, which finds them, builds the warm start again)."""
    from cua_rl.config import resolve_tiny_model_dir

    model_dir = Path(config.actor.path).expanduser()
    if model_dir == Path(resolve_tiny_model_dir(config)) and not is_current(model_dir):
        logger.info("building the tiny offline model at %s", model_dir)
        build_tiny(model_dir)
    return model_dir


def _fix_tokenizer_config(out: Path) -> None:
    """Name the Qwen tokenizer class (as real Qwen checkpoints do) and keep the chat template visible.

    Why: AutoTokenizer for model_type qwen3_vl resolves to Qwen2Tokenizer; naming it keeps loading on the
    same class everywhere. Our pre-tokeniser equals Qwen2Tokenizer's, so ids are identical either way.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["add_bos_token"] = False
    cfg["errors"] = "replace"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
