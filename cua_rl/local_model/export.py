"""``cua-model export CHECKPOINT OUT_DIR``: a trained checkpoint as a Hugging Face model directory to share.

A run's checkpoints are already Hugging Face directories (AReaL's saver: ``config.json``, the weights as
safetensors, the tokenizer, the chat template and the processor), which ``vllm serve`` and
``AutoModelForImageTextToText.from_pretrained`` load as they are. What this adds: the copy in a directory of its
own (AReaL's ``.../epoch0epochstep15globalstep15`` next to a run's other files), refusing a directory that is not a
checkpoint, and the processor files a transformers-4 stack reads. Transformers 5 writes the processor as one
``processor_config.json``; transformers 4 reads ``preprocessor_config.json`` (the image processor) and
``video_preprocessor_config.json``, so those are written from it too (transformers 5 ignores them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

LEGACY = {"image_processor": "preprocessor_config.json", "video_processor": "video_preprocessor_config.json"}


class ExportError(ValueError):
    """Not a checkpoint, or nowhere to put it: the message says which."""


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Copy ``checkpoint`` to ``out_dir`` (new or empty) with the transformers-4 processor files; returns it."""
    src, out = Path(checkpoint), Path(out_dir)
    if not (src / "config.json").is_file() or not any(src.glob("*.safetensors")):
        raise ExportError(f"{src} is not a model checkpoint (no config.json and *.safetensors): a run's final "
                          f"checkpoint is the one the end of the run names ('final checkpoint: ...')")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, out / item.name)
    processor = out / "processor_config.json"
    if processor.is_file():
        config = json.loads(processor.read_text())
        for section, name in LEGACY.items():
            if isinstance(config.get(section), dict) and not (out / name).exists():
                legacy = {**config[section], "processor_class": config.get("processor_class")}
                (out / name).write_text(json.dumps(legacy, indent=2) + "\n")
    return out
