"""The memory estimate of ``train.sh --dry-run`` (cua_rl/run/estimate.py) against measured peaks, on the CPU,
at three scaled sizes of the Qwen3-VL architecture; prints one JSON object.

Per size: a Qwen3-VL built offline (cua_rl/local_model/tiny.py, the dimensions below), loaded in float32 in a
fresh process, one training step as AReaL's actor takes it: gradient checkpointing on, one packed micro-batch
of ``--tokens`` tokens (text only), the fp32 log-softmax of the logits, backward, one AdamW step. Measured:
the process's peak resident memory over what it held before the model was built (``ru_maxrss`` minus
``VmRSS`` after the imports). Estimated: ``estimate(dtype=float32, optimizer_dtype=float32,
dense_attention=True)`` (sdpa's math kernel on the CPU stores the score matrices): weights, gradients,
AdamW's two states and one micro-batch's activations. The ratio (measured / estimated) says how far
the arithmetic is from a real allocator's peak; on a GPU the CUDA caching allocator and NCCL buffers add
their own, so treat the GPU figures as a lower bound with this ratio's margin.

  python bench/memory_estimate_bench.py                 # ~3 minutes on 2 cores
  python bench/memory_estimate_bench.py --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (hidden, intermediate, layers, heads): the tiny model's head_dim of 64, one KV head per two query heads
SIZES = [(256, 1024, 4, 4), (512, 2048, 6, 8), (1024, 4096, 8, 16)]

_STEP = r'''
import json, resource, sys, torch
from transformers import AutoModelForImageTextToText
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
model_dir, tokens = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
ids = torch.randint(10, 600, (1, tokens))
before = rss()
model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
model.train()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
logits = model(input_ids=ids, use_cache=False).logits
logp = torch.log_softmax(logits.float(), dim=-1)
loss = -logp[0, :-1].gather(-1, ids[0, 1:, None]).mean()
loss.backward()
opt.step()
print(json.dumps({"before": before, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "params": sum(p.numel() for p in model.parameters())}))
'''


def measure(model_dir: Path, tokens: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _STEP, str(model_dir), str(tokens)], capture_output=True,
                         text=True, cwd=ROOT, timeout=1200)
    if out.returncode != 0:
        raise SystemExit(f"the training step failed for {model_dir}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens in the micro-batch")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from cua_rl.local_model.tiny import TinySpec, build_tiny
    from cua_rl.run.estimate import GIB, estimate, shape_of

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, inter, layers, heads in SIZES:
            spec = TinySpec(hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
                            num_kv_heads=heads // 2)
            model_dir = build_tiny(Path(tmp) / f"h{hidden}", spec=spec)
            shape = shape_of(str(model_dir))
            est = estimate(shape, dtype="float32", optimizer_dtype="float32", tokens_per_mb=args.tokens,
                           row_tokens=args.tokens, dense_attention=True)
            got = measure(model_dir, args.tokens)
            measured = got["peak"] - got["before"]
            rows.append({"hidden": hidden, "intermediate": inter, "layers": layers, "params": shape.params,
                         "params_loaded": got["params"],
                         "estimated_gib": round(est.actor / GIB, 3),
                         "estimated_parts_gib": {k: round(getattr(est, k) / GIB, 3) for k in
                                                 ("weights", "grads", "optimizer", "activations")},
                         "measured_gib": round(measured / GIB, 3),
                         "ratio_measured_over_estimated": round(measured / est.actor, 3)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "memory_estimate", "tokens_per_micro_batch": args.tokens, "dtype": "float32",
                      "device": "cpu (peak RSS of a fresh process over its RSS after the imports)",
                      "sizes": rows}, indent=2))


if __name__ == "__main__":
    main()
