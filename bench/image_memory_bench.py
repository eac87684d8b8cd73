"""The trainer's memory for a step's images, rows with float ``pixel_values`` against rows with palette codes
(cua_rl/trajectory/pixels.py, decoded per micro-batch by cua_rl/areal_ext/compact_images.py); prints JSON.

    python bench/image_memory_bench.py                  # ~5 minutes on 2 cores
    python bench/image_memory_bench.py --turns 3

``config.yaml``'s shape, scaled to fit this machine: one GRPO group of its ``n_samples`` (4) episodes, each of
``--turns`` turns (config.yaml allows 20) with its history of up to ``max_screenshots_in_history`` (3)
screenshots of 1280x800 at its ``max_pixels`` (about 1000 visual tokens each), one row per turn (its export
style). The screenshots are real PNGs of a drawn desktop, through the real processor of the tiny Qwen3-VL
(the same image processor as Qwen3-VL's) and the policy endpoint's prompt builder. Each variant in a fresh
process: AReaL's FSDPPPOActor on the tiny model (float32, CPU, gloo), the step's batch built as the workflow
builds it (``group_batch``), then ``compute_logp`` and one ``ppo_update`` with config.cpu.yaml's micro-batch size
(``max_tokens_per_mb`` 4096: at config.yaml's 16384 the CPU's dense attention scores, not the images, set the
peak). The tiny model is built with its processor at config.yaml's ``max_pixels`` (its default shrinks a
screenshot to 60 tokens). Measured: the images' bytes in the batch, the process's peak resident memory
over what it held after the model was built (``ru_maxrss`` minus ``VmRSS``), and the two calls' time; the
logprobs of the two variants must be equal bit for bit. The scaling: images are what grows with the step (the
tiny model's weights are 20 MB), and they grow linearly, so ``per_step_config_yaml_gb`` multiplies the bytes
per screenshot by the screenshots config.yaml's rows hold in a step of 20-turn episodes (4 tasks x 4 episodes x
57: turn t's row holds min(t, 3)).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_PIXELS = 1003520      # config.yaml's policy.max_pixels when measured (now 1024000: 1000 tokens, unresampled)
MAX_TOKENS_PER_MB = 4096  # config.cpu.yaml's micro-batch (config.yaml's 16384 makes the CPU's dense attention dominate)

_STEP = r'''
import io, json, os, resource, sys, time, base64
import torch
from PIL import Image, ImageDraw
sys.path.insert(0, sys.argv[1])
model_dir, compact, turns, work, mb = sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ[k] = v
from cua_rl.http.serve import free_port
os.environ["MASTER_PORT"] = str(free_port())
from areal.api import FinetuneSpec
from areal.api.cli_args import MicroBatchSpec, NameResolveConfig, OptimizerConfig, PPOActorConfig
from areal.engine import FSDPPPOActor
from areal.utils import name_resolve
from transformers import AutoProcessor
from cua_rl.areal_ext import compact_images
from cua_rl.areal_ext.packed_attention import enable_packed_sdpa
from cua_rl.policy import EndpointSettings, prompt_from_messages
from cua_rl.policy.records import Turn
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.trajectory.pixels import nbytes

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def screenshot(seed):
    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", (1280, 800), (235, 235, 240))
    d = ImageDraw.Draw(img)
    for _ in range(40):
        x, y, w, h = (int(v) for v in torch.randint(0, 1200, (4,), generator=g))
        colour = tuple(int(c) for c in torch.randint(0, 256, (3,), generator=g))
        d.rectangle([x, y % 760, x + w % 300, y % 760 + h % 200], fill=colour)
        d.text((x, y % 760), f"window {seed} {x}", fill=(0, 0, 0))
    buf = io.BytesIO(); img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=os.path.join(work, "nr")))
enable_packed_sdpa(); compact_images.enable()
processor = AutoProcessor.from_pretrained(model_dir)
settings = EndpointSettings(max_screenshots_in_history=3, max_pixels=1003520)
assert processor.image_processor.size["longest_edge"] >= 1003520, processor.image_processor.size
outcomes = []
for e in range(4):
    msgs, recorded = [{"role": "system", "content": "You operate a computer."}], []
    for t in range(turns):
        shot = {"type": "image_url", "image_url": {"url": screenshot(100 * e + t)}}
        msgs.append({"role": "user", "content": [shot]})
        p = prompt_from_messages(processor, processor.tokenizer, settings, msgs)
        out = processor.tokenizer(f"click({e}, {t})", add_special_tokens=False)["input_ids"]
        out.append(processor.tokenizer.eos_token_id)
        recorded.append(Turn(prompt_ids=p.input_ids, output_ids=out, output_logprobs=[-1.0] * len(out),
                             output_versions=[0] * len(out), prompt_mm_token_type_ids=p.mm_token_type_ids,
                             multi_modal_input=p.multi_modal_input, n_images=len(p.images)))
        msgs.append({"role": "assistant", "content": processor.tokenizer.decode(out[:-1])})
    outcomes.append(EpisodeOutcome(turns=recorded, reward=float(e % 2)))
actor = FSDPPPOActor(PPOActorConfig(experiment_name="bench", trial_name="images", path=model_dir, backend="fsdp:d1",
    attn_impl="sdpa", dtype="float32", temperature=1.0, ppo_n_minibatches=1, recompute_logprob=True,
    use_decoupled_loss=True, mb_spec=MicroBatchSpec(max_tokens_per_mb=mb),
    optimizer=OptimizerConfig(lr=1e-5, warmup_steps_proportion=0.0, weight_decay=0.0)))
actor.create_process_group()
actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=4))
base = rss()
t0 = time.perf_counter()
batch = group_batch(outcomes, compact_images=compact)
del outcomes
pack_s = time.perf_counter() - t0
rows, images = batch["input_ids"].shape[0], nbytes(batch["multi_modal_input"])
n_images = sum(len(m["image_grid_thw"]) for m in batch["multi_modal_input"] if m)
t0 = time.perf_counter()
(logp,) = actor.compute_logp([batch])
logp_s = time.perf_counter() - t0
batch["prox_logp"] = logp
t0 = time.perf_counter()
actor.ppo_update(actor.compute_advantages([batch]))
update_s = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
torch.save(logp, os.path.join(work, "logp.pt"))
print(json.dumps({"rows": rows, "images": n_images, "tokens": int(batch["attention_mask"].sum()),
                  "images_bytes": images,
                  "peak_over_model_gib": round((peak - base) / 2**30, 3), "group_batch_s": round(pack_s, 2),
                  "compute_logp_s": round(logp_s, 2), "ppo_update_s": round(update_s, 2)}))
actor.destroy()
'''


def _variant(model_dir: str, compact: bool, turns: int) -> tuple[dict, object]:
    import torch

    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run([sys.executable, "-c", _STEP, str(ROOT), model_dir, "1" if compact else "0", str(turns),
                               work, str(MAX_TOKENS_PER_MB)], capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"variant compact={compact} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1]), torch.load(Path(work) / "logp.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--model", default=None, help="model directory (default: the embedded stack's tiny Qwen3-VL)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from cua_rl.local_model import build_tiny
    from cua_rl.local_model.tiny import TinySpec

    with tempfile.TemporaryDirectory() as tmp:   # the processor at config.yaml's max_pixels, not the tiny default
        model_dir = args.model or str(build_tiny(Path(tmp) / "tiny-qwen3-vl", spec=TinySpec(max_pixels=MAX_PIXELS)))
        floats, logp_f = _variant(model_dir, False, args.turns)
        codes, logp_c = _variant(model_dir, True, args.turns)

    per_image = {k: v["images_bytes"] / v["images"] for k, v in (("floats", floats), ("codes", codes))}
    # config.yaml's step: 4 tasks x 4 episodes, up to 20 turns, turn t's row holding min(t, 3) screenshots
    config_images = 4 * 4 * sum(min(t, 3) for t in range(1, 21))
    print(json.dumps({
        "bench": "image_memory",
        "shape": {"episodes": 4, "turns": args.turns, "history_screenshots": 3, "screenshot": "1280x800",
                  "max_pixels": 1003520, "rows": floats["rows"], "tokens": floats["tokens"],
                  "max_tokens_per_mb": MAX_TOKENS_PER_MB,
                  "model": "tiny Qwen3-VL (float32, CPU), its processor at max_pixels 1003520"},
        "floats": floats, "codes": codes,
        "logprobs_bit_equal": bool(torch.equal(logp_f, logp_c)),
        "ratio": {"images_bytes": round(codes["images_bytes"] / floats["images_bytes"], 3),
                  "peak_over_model": round(codes["peak_over_model_gib"] / floats["peak_over_model_gib"], 3)},
        "per_step_config_yaml_gb": {k: round(v * config_images / 1e9, 1) for k, v in per_image.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
