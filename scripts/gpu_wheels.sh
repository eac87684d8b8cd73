#!/usr/bin/env bash
# The wheels bench/gpu_smoke.py needs on the lent GPU machine, downloaded into DIR; prints each with its size and
# the total, and fails over 64 MiB (what one device call carries).
#
# Why this list: the GPU machine has Python 3.12, torch, transformers, numpy, Pillow, safetensors, aiohttp, PyYAML
# and more preinstalled (its package list: the device tool's KINDS.md) and reaches no registry. What AReaL's FSDP
# engine and our row code import beyond that is below, found by importing them (and running the smoke check) with
# every package outside the machine's list blocked. Not here: torch and transformers (theirs), cua_rl (our tree
# travels as the working tree, on PYTHONPATH), ray (79 MB; bench/gpu_smoke.py stubs it: a one-process FSDP engine
# never calls it). Versions are scripts/requirements-gpu.lock's, the ones our tests run. Installed there with
# --no-deps, which knowingly overrides AReaL 1.0.4's pins (torch<2.11, transformers<=5.3.0; the machine has torch
# 2.11, transformers 5.17).
#
#   scripts/gpu_wheels.sh .whl      # then carry .whl (see bench/gpu_smoke.py's docstring for the one-line call)
set -euo pipefail

DIR=${1:?usage: scripts/gpu_wheels.sh DIR}
LOCK="$(cd "$(dirname "$0")" && pwd)/requirements-gpu.lock"
LIMIT=$((64 * 1024 * 1024))

PACKAGES=(
  areal                                             # the FSDP engine itself
  colorlog tenacity lark torchdata orjson           # AReaL's module-level imports
  hydra-core omegaconf antlr4-python3-runtime       # AReaL's config classes; our recipe loader
  flask blinker itsdangerous                        # AReaL's rollout controller (imported by areal/__init__)
  pydantic pydantic-core typing-inspection annotated-types   # AReaL's RPC serialization
  openai sniffio distro jiter                       # AReaL's experimental OpenAI client (imported by areal.infra)
  starlette python-multipart fastapi ujson uvicorn  # our cua_rl.http and agent packages
  opentelemetry-api importlib-metadata annotated-doc          # fastapi's telemetry module
  python-xlib mss simplejpeg zlib-ng                # our local_gym package (the row code imports its curriculum)
)

specs=()
for name in "${PACKAGES[@]}"; do
  spec=$(grep -i "^${name}==" "$LOCK") || { echo "gpu_wheels.sh: $name is not in $LOCK" >&2; exit 1; }
  specs+=("$spec")
done

mkdir -p "$DIR"
PIP=${PIP:-python3 -m pip}
$PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 -d "$DIR" "${specs[@]}"

total=0
for whl in "$DIR"/*.whl; do
  size=$(stat -c %s "$whl")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$whl")"
done
printf '%10d  total (%s MiB; %d wheels)\n' "$total" "$(awk "BEGIN {printf \"%.1f\", $total / 1048576}")" \
  "$(ls "$DIR"/*.whl | wc -l)"
if [ "$total" -gt "$LIMIT" ]; then
  echo "gpu_wheels.sh: $total bytes is over the 64 MiB a device call carries" >&2
  exit 1
fi
