"""bench/gpu_smoke.py, the GPU smoke check, kept working on the CPU: ``--device cpu --model tiny`` runs the
same code a lent GPU runs (our rows, AReaL's FSDP engine, the disk weight update) and prints only JSON on stdout.
Also: its 2B shape is Qwen3-VL-2B's parameter count (the figure the GPU placement test and the estimate use)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def test_the_cpu_run_of_the_smoke_check_prints_its_figures_as_json():
    out = subprocess.run([sys.executable, "bench/gpu_smoke.py", "--device", "cpu", "--model", "tiny",
                          "--episodes", "1", "--turns", "2", "--steps", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=170, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)   # stdout is the JSON and nothing else
    assert result["rows"] == 2 and result["attn_impl"] == "sdpa" and result["policy_max_pixels"] == 1024000
    assert result["tokens_per_step"] > 1000 and result["longest_row"] <= 8192   # images and the agent's prompt
    assert result["tokens_per_s"] > 0 and 0 < result["peak_memory_gb"] < 4 and result["estimate_gb"] > 0
    update = result["weight_update_disk"]
    assert update["bytes"] > 0 and update["loaded_bytes"] > 0.9 * update["bytes"]
    assert {"torch", "transformers", "areal"} <= set(result["versions"])


def test_the_2b_shape_is_qwen3_vl_2b():
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from bench.gpu_smoke import QWEN3_VL_2B

    config = Qwen3VLConfig(text_config=QWEN3_VL_2B["text"], vision_config=QWEN3_VL_2B["vision"],
                           tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == 2_127_532_032
