"""The memory and length estimate ``--dry-run`` prints (cua_rl/run/estimate.py), and the 1-GPU recipe.

The arithmetic against measured peaks at three scaled sizes is bench/memory_estimate_bench.py
(docs/bench/memory_estimate_bench.json); here: the parameter count is the model's own, the terms move the way
the layout says (FSDP shards the stored state, colocation takes the larger side, a dense attention adds the
score matrices), a run that does not fit is called so, and the dry run prints it for the recipes.
"""

import re

from cua_rl.run.estimate import GIB, Shape, estimate, shape_of
from cua_rl.run.launch import RECIPES

SHAPE = Shape(params=2_000_000_000, hidden=2048, layers=28, intermediate=6144, vocab=151_936, heads=16,
              screenshot=1000)


def test_the_parameter_count_is_the_models_own(tiny_model_dir):
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    shape = shape_of(tiny_model_dir)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.tokens_per_screenshot() == 60   # the tiny processor's pixel limit (cua_rl/local_model/tiny.py)
    assert shape_of(tiny_model_dir, max_pixels=32 * 32 * 16).tokens_per_screenshot() < 60   # policy.max_pixels


def test_the_terms_follow_the_layout_and_a_run_that_does_not_fit_is_called_so():
    kw = dict(dtype="bfloat16", optimizer_dtype="float32", tokens_per_mb=8192, row_tokens=8192,
              gpu_memory_utilization=0.3, gpu_gib=80)
    one, two = estimate(SHAPE, **kw), estimate(SHAPE, dp=2, **kw)
    assert one.weights == 4 * SHAPE.params and one.optimizer == 8 * SHAPE.params   # fp32 storage, AdamW
    assert two.weights == one.weights // 2 and two.optimizer == one.optimizer // 2
    assert two.compute_copy == one.compute_copy and two.activations == one.activations
    together = estimate(SHAPE, colocated=True, **kw)
    assert together.peak == max(together.actor, together.vllm) < together.actor + together.vllm
    assert one.peak == one.actor
    assert estimate(SHAPE, dense_attention=True, **kw).activations - one.activations == 2 * 8192**2 * 16 * 2
    assert "fits in 80 GiB" in one.lines(80, "x")[0]
    assert "DOES NOT FIT in 40 GiB" in one.lines(40, "x")[0]
    assert "at most 8 screenshots per row" in one.lines(80, "x")[1]
    assert one.actor / GIB > 30   # 2B parameters with fp32 master weights and AdamW: 32 GiB before activations


def test_the_dry_run_prints_the_estimate_for_the_cpu_stack_and_the_1gpu_recipe(launcher, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # the Hub is unreachable here: fail at once, not after retries
    # the CPU stack's model given as the launcher would find it once built (a fresh machine has none in its cache)
    rc, report, _, out = launcher(["--gym", "http://gym.example:5010", "--gym-id", "g1",
                                   f"actor.path={tiny_model_dir}"])
    assert rc == 0, out.err
    assert re.search(r"^memory \(estimated; the CPU stack, in host memory\): actor [\d.]+ GiB", out.out, re.M)
    assert re.search(r"^length: rows up to \d+ tokens", out.out, re.M)
    rc, report, _, out = launcher(["--config", str(RECIPES / "config.1gpu.yaml"), "--gym", "http://gym.example:5010",
                                   "--gym-id", "g1", f"actor.path={tiny_model_dir}"])
    assert rc == 0, out.err
    assert "colocated with vLLM on one GPU" in out.out and "fits in 80 GiB (an 80 GiB GPU assumed" in out.out
    # the recipe's own model is a Hub id, which this machine cannot read: said, not guessed
    rc, report, _, out = launcher(["--config", str(RECIPES / "config.1gpu.yaml"), "--gym", "http://gym.example:5010",
                                   "--gym-id", "g1"], device="gpu")
    assert rc == 0, out.err
    assert report["memory"].startswith("no estimate (the model config of Qwen/Qwen3-VL-2B-Instruct cannot be read")
