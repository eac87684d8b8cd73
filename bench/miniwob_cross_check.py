"""Issue 85 item 6: a checkpoint plays the ``miniwob`` package's own Gymnasium environment on the instances our
MiniWoB++ gym scored it on, and the per-episode rewards are compared.

    python bench/miniwob_cross_check.py --checkpoint DIR --eval FILE.json [--per-task 6] [--out OUT.json]

``FILE.json`` is ``cua-eval --suite miniwob:yardstick --checkpoint DIR --greedy ... --out FILE.json`` of the same
checkpoint: its ``outcomes`` rows ``[task, seed, successes, regime, content]`` are our gym's side (greedy: one
episode per instance, so ``successes`` is the episode's reward, 0 or 1). The reference side is played here, greedy,
with the same policy stack, on the first ``--per-task`` held-out seeds (2**40 + i) of every yardstick task
(cua_rl/local_gym/external_yardstick_plan.json, train + held-out tasks) that the eval JSON has:

- the environment: ``gymnasium.make("miniwob/<task>-v1")`` as bench/miniwob_reference.py builds it (headless
  Chromium, Selenium, Debian's chromedriver), one per task, ``reset(seed=seed)`` (the package's seeded start);
- what the policy sees: the package's own screenshot function (``miniwob.screenshot.get_screenshot``) on a
  browser started with ``--force-device-scale-factor=3`` (the flag our gym starts Chromium with at zoom 3), its
  crop scaled by 3: the 160x210 task area as a 480x630 image, the size the model saw in our gym. The package's
  ``create_driver`` takes no Chrome options, so the flag is added while the environment is built
  (``scaled_chrome``); the JSON's ``observation`` says which scale the browser really had, and if it ever came
  back at 1 the 160x210 observation would be upscaled 3x (nearest) and the JSON would say so;
- the agent: our agent's own loop (``cua_rl.local_agent.runner.AgentRun``: the qwen3-vl format's messages, its
  history of screenshots, its parse, invalid-reply feedback, ``terminate`` ends the run) with the eval's limits
  (the config cua-eval loads: ``max_turns`` 3 on the CPU recipe), on a gym adapter (``ReferenceGym``) whose
  actions are the package's: a click on the 0-1000 grid of the 480x630 screen lands on the device pixel our gym
  would press (``min(int(f * 480), 479)``), i.e. CSS pixel ``px / 3`` of the task area, sent as ``CLICK_COORDS``;
- the model: our policy endpoint (``cua_rl.policy.endpoint.PolicyEndpoint``: the same prompt ids, image
  preparation and reply building as cua-eval, with the config's gconfig made greedy) in front of a transformers
  greedy ``generate`` (``HFGreedyEngine``) instead of cua-eval's vLLM server: the endpoint gives it the prompt ids
  and the prepared screenshots, and it runs the processor on those images as vLLM would. ``model_server`` in the
  JSON says so; a greedy token can differ between the two backends where two logits nearly tie;
- the reward: the package's raw reward mapped as our gym maps it (``cua_rl.local_gym.miniwob.score_of``: clipped
  to [0, 1] once done, 0 while not), taken when the package's step first reports the episode done (its later
  steps are no-ops, as clicks on our gym's DONE cover are). Our gym lifts the page's 10-30 s timer (a slow model
  never loses an episode to it); here the same is done (``core.EPISODE_MAX_TIME`` set before each start,
  ``--page-time-limit-s``), else a CPU model's think time would time out episodes our gym scores.

``agree`` counts the compared episodes whose two rewards are equal. click-dialog and click-dialog-2 are flagged
nondeterministic by the package (a seed does not pin the whole page): the JSON reports agreement per task.
Differences that remain by construction: the reference screenshots as soon as a step returns (ours once the
screen is still), its viewport is the package's headless one (780x437 CSS pixels, ``CHROME_FLAGS``; ours is exactly
the task area) and input goes through WebDriver (ours through XTest).

Measured (2026-12-07, 2 cores under other work, warm start /work/y85/warm-b against its own ``cua-eval`` of 2 seeds
per task): 18 of 18 episodes agree, its 2 successes (click-tab, focus-text-2) and 2 wrong answers (raw -1) among
them; 44 s for the 18 after the model loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import logging
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cua_rl.local_gym.miniwob import TASK_CSS_SIZE, score_of  # noqa: E402

logger = logging.getLogger("miniwob_cross_check")

ZOOM = 3                                                     # our gym's default: 480x630 screen, task area 160x210
SCREEN = (TASK_CSS_SIZE[0] * ZOOM, TASK_CSS_SIZE[1] * ZOOM)
HELDOUT_FIRST = 2 ** 40                                      # the plan's held-out seeds: 2**40 + i
GYM_ID = "miniwob-reference"


class Unmappable(ValueError):
    """An action of ours the package's action space has no counterpart for."""


# ---- the mapping: our wire actions -> the package's, and its reward -> ours ------------------------------------

def css_point(fx: float, fy: float, screen: tuple[int, int] = SCREEN, zoom: int = ZOOM) -> tuple[float, float]:
    """A click at fractions (fx, fy) of our screen, as CSS pixels of the task area: the device pixel our gym presses
    (``local_gym.actions.perform``: ``min(int(f * side), side - 1)``) divided by the zoom."""
    px = min(int(fx * screen[0]), screen[0] - 1)
    py = min(int(fy * screen[1]), screen[1] - 1)
    return px / zoom, py / zoom


_KEY_NAMES = {"enter": "<Enter>", "return": "<Enter>", "tab": "<Tab>", "backspace": "<Backspace>",
              "delete": "<Delete>", "space": "<Space>", "pageup": "<PageUp>", "pagedown": "<PageDown>",
              "up": "<ArrowUp>", "down": "<ArrowDown>", "left": "<ArrowLeft>", "right": "<ArrowRight>",
              "arrowup": "<ArrowUp>", "arrowdown": "<ArrowDown>", "arrowleft": "<ArrowLeft>",
              "arrowright": "<ArrowRight>"}
_MODIFIERS = {"ctrl": "C-", "control": "C-", "shift": "S-", "alt": "A-", "meta": "M-", "cmd": "M-", "super": "M-"}


def package_key(keys: list[str]) -> str:
    """Our key chord (``["ctrl", "a"]``) in the package's PRESS_KEY spelling (``"C-a"``)."""
    *mods, last = keys
    try:
        prefix = "".join(_MODIFIERS[m] for m in mods)
    except KeyError as e:
        raise Unmappable(f"no package modifier for {e.args[0]!r}") from None
    return prefix + _KEY_NAMES.get(last, last)


def package_actions(gym_action: dict, allowed_keys=()) -> list[tuple[str, dict]]:
    """Our wire action (docs/protocols.md 1.6, fractions of the 480x630 screen) as the package's actions:
    ``(action type, fields)`` pairs for ``env.create_action``; ``wait`` is ``[("WAIT", {"ms": ms})]`` (the package
    has no wait: the caller sleeps). Raises ``Unmappable`` for what the package cannot do."""
    kind = gym_action.get("type")
    if kind == "click":
        if gym_action.get("button", "left") != "left" or gym_action.get("count", 1) not in (1, 2):
            raise Unmappable(f"no package action for a {gym_action.get('button')} click x{gym_action.get('count')}")
        name = "CLICK_COORDS" if gym_action.get("count", 1) == 1 else "DBLCLICK_COORDS"
        return [(name, {"coords": css_point(gym_action["x"], gym_action["y"])})]
    if kind == "move":
        return [("MOVE_COORDS", {"coords": css_point(gym_action["x"], gym_action["y"])})]
    if kind == "drag":
        return [("MOUSEDOWN_COORDS", {"coords": css_point(gym_action["x"], gym_action["y"])}),
                ("MOUSEUP_COORDS", {"coords": css_point(gym_action["x2"], gym_action["y2"])})]
    if kind == "scroll":
        dy = gym_action.get("dy", 0)
        if not dy or gym_action.get("dx"):
            raise Unmappable("the package scrolls vertically only")
        name = "SCROLL_DOWN_COORDS" if dy > 0 else "SCROLL_UP_COORDS"
        return [(name, {"coords": css_point(gym_action["x"], gym_action["y"])})] * abs(int(dy))
    if kind == "type":
        return [("TYPE_TEXT", {"text": gym_action["text"]})]
    if kind == "key":
        key = package_key(list(gym_action["keys"]))
        if allowed_keys and key not in allowed_keys:
            raise Unmappable(f"the package's action space has no key {key!r}")
        return [("PRESS_KEY", {"key": list(allowed_keys).index(key) if allowed_keys else key})]
    if kind == "wait":
        return [("WAIT", {"ms": int(gym_action.get("ms", 0))})]
    raise Unmappable(f"no package action for {kind!r}")


def reference_reward(metadata: dict) -> float:
    """The package's step metadata (``raw_reward``, ``done``) scored as our gym scores the page."""
    return score_of(float(metadata.get("raw_reward") or 0.0), bool(metadata.get("done")))


# ---- the reference environment at our scale -----------------------------------------------------------------

# Headless Chromium's screen is 800x600 device pixels: at scale 3 that is 267x200 CSS pixels, and its window shrank
# to a 37 px high viewport. The window is given the size the package's own headless window has at scale 1 (780x580
# CSS, a 780x437 viewport), so the page lays out as in the package and only its pixels are 3x.
CHROME_FLAGS = (f"--force-device-scale-factor={ZOOM}", "--window-size=780,580")


@contextlib.contextmanager
def scaled_chrome(flags: tuple[str, ...] = CHROME_FLAGS):
    """While the package builds its driver, every ChromeOptions it makes carries ``flags`` (its ``create_driver``
    takes no options of its own)."""
    from selenium import webdriver

    base = webdriver.ChromeOptions

    class Options(base):
        def __init__(self) -> None:
            super().__init__()
            for flag in flags:
                self.add_argument(flag)

    webdriver.ChromeOptions = Options
    try:
        yield
    finally:
        webdriver.ChromeOptions = base


def reference_env(task: str):
    """``gymnasium.make("miniwob/<task>-v1")`` as bench/miniwob_reference.py builds it, Chromium at scale 3."""
    from miniwob_reference import _reference_env

    with scaled_chrome():
        return _reference_env(task)


def screen_png(env) -> tuple[bytes, int]:
    """(PNG of the task area at our screen size, the browser's device scale): the package's own screenshot function
    with its crop scaled; at scale 1 its 160x210 observation upscaled 3x (nearest)."""
    from miniwob.screenshot import get_screenshot

    inst = env.instance
    raw = inst.driver.get_screenshot_as_png()
    from PIL import Image

    scale = round(Image.open(io.BytesIO(raw)).size[0] / inst.inner_width)
    if scale == ZOOM:
        img = get_screenshot(inst.driver, inst.inner_width * ZOOM, inst.inner_height * ZOOM, *SCREEN)
    else:
        img = get_screenshot(inst.driver, inst.inner_width, inst.inner_height, *TASK_CSS_SIZE)
        img = img.resize(SCREEN, Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), scale


class ReferenceGym:
    """The three gym calls our agent makes (get_execution, screenshot, act), on the package's environment."""

    def __init__(self, env) -> None:
        self.env = env
        self.done_info: dict | None = None        # the package's step info where it first said done
        self.actions: list[dict] = []
        self.scales: set[int] = set()
        self.unmapped: str | None = None

    async def get_execution(self, execution_id: str) -> dict:
        return {"execution_id": execution_id, "status": "running", "screen": {"width": SCREEN[0], "height": SCREEN[1]}}

    async def screenshot(self, execution_id: str, format: str = "png") -> bytes:
        png, scale = await asyncio.to_thread(screen_png, self.env)
        self.scales.add(scale)
        return png

    async def act(self, execution_id: str, action: dict) -> dict:
        try:
            steps = package_actions(action, self.env.action_space_config.allowed_keys)
        except Unmappable as e:     # the run ends as the gym's failure; the episode is left out of the comparison
            self.unmapped = str(e)
            return {"ok": False, "fault": "gym", "error": str(e)}
        self.actions.append({"ours": action, "package": [[name, _jsonable(fields)] for name, fields in steps]})
        for name, fields in steps:
            if self.done_info is not None:      # the package refuses actions once done (as our DONE cover does)
                break
            if name == "WAIT":
                await asyncio.sleep(fields["ms"] / 1000)
                continue
            act = self.env.create_action(name, **{k: _np(v) for k, v in fields.items()})
            _, _, done, _, info = await asyncio.to_thread(self.env.step, act)
            if done:
                self.done_info = {k: info.get(k) for k in ("raw_reward", "env_reward", "done", "reason")}
        return {"ok": True}

    async def aclose(self) -> None:
        return None


def _np(value):
    import numpy as np

    return np.array(value, dtype=np.float32) if isinstance(value, tuple) else value


def _jsonable(fields: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def lift_page_timer(env, seconds: float) -> None:
    """The page's episode timer (core.EPISODE_MAX_TIME, read when an episode starts) set to ``seconds``."""
    env.instance.driver.execute_script(f"core.EPISODE_MAX_TIME = {int(seconds * 1000)};")


# ---- the policy: our endpoint in front of transformers' greedy generate -----------------------------------------

def mm_token_types(processor, input_ids) -> list[int]:
    """The processor's ``mm_token_type_ids`` for prompt ids (1: an image placeholder, 2: a video one, 0: text).
    Qwen3-VL's ``generate`` places its 3D rotary positions only when it has them: without them every image token
    sat at a text position and the reply was another model's."""
    image, video = getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None)
    return [1 if t == image else 2 if t == video else 0 for t in input_ids]


class HFGreedyEngine:
    """``engine.agenerate`` for ``PolicyEndpoint`` with transformers: greedy ``generate`` on the request's prompt
    ids, the processor run on the request's (already prepared) images as vLLM runs it, stopping at the gconfig's
    stop ids or ``max_new_tokens``."""

    def __init__(self, model, processor) -> None:
        self.model, self.processor = model, processor

    async def agenerate(self, req):
        return await asyncio.to_thread(self._generate, req)

    def _generate(self, req):
        import torch
        from areal.api.io_struct import ModelResponse
        from PIL import Image

        ids = torch.tensor([list(req.input_ids)])
        extra = {}
        if req.image_data:
            images = [Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB") for b in req.image_data]
            out = self.processor.image_processor(images=images, return_tensors="pt")
            extra = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                     "mm_token_type_ids": torch.tensor([mm_token_types(self.processor, req.input_ids)])}
        g = req.gconfig
        stop = list(g.stop_token_ids or [])
        with torch.no_grad():
            gen = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **extra,
                                      max_new_tokens=g.max_new_tokens, do_sample=False, eos_token_id=stop or None,
                                      pad_token_id=stop[0] if stop else None, output_scores=True,
                                      return_dict_in_generate=True)
        tokens = gen.sequences[0, ids.shape[1]:].tolist()
        logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(gen.scores, tokens)]
        reason = "stop" if tokens and tokens[-1] in stop else "length"
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=tokens, output_logprobs=logprobs,
                             output_versions=[0] * len(tokens), stop_reason=reason, tokenizer=req.tokenizer)


def load_config(config_file: str, overrides: list[str]):
    """The config cua-eval loads (its recipe choice: config.yaml with a GPU, config.cpu.yaml without)."""
    from cua_rl.run.launch import RECIPES, has_gpu, load_config as load

    path = config_file or str(RECIPES / ("config.yaml" if has_gpu() else "config.cpu.yaml"))
    return path, load(path, overrides)


def policy_endpoint(checkpoint: str, config):
    """Our policy endpoint for ``checkpoint``, built as the workflow builds it, greedy, on ``HFGreedyEngine``."""
    import torch
    from areal.utils.hf_utils import load_hf_processor_and_tokenizer
    from transformers import AutoModelForImageTextToText

    from cua_rl.policy.endpoint import PolicyEndpoint

    processor, tokenizer = load_hf_processor_and_tokenizer(checkpoint)
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    return PolicyEndpoint(HFGreedyEngine(model, processor), processor, tokenizer,
                          config.gconfig.new(greedy=True), config.policy)


# ---- one episode ------------------------------------------------------------------------------------------------

async def play(env, task: str, seed: int, endpoint, config, http, page_time_limit_s: float) -> dict:
    """One greedy episode of (task, seed) on the package's environment, driven by our agent's loop."""
    from cua_rl.local_agent.record import RunRecord
    from cua_rl.local_agent.runner import AgentRun, AgentSettings
    from cua_rl.local_agent.schema import RunRequest

    if page_time_limit_s > 0:
        await asyncio.to_thread(lift_page_timer, env, page_time_limit_s)
    obs, _ = await asyncio.to_thread(env.reset, seed=seed)
    gym = ReferenceGym(env)
    ep = await endpoint.open_episode()
    started = time.monotonic()
    try:
        request = RunRequest.model_validate({
            "task": obs["utterance"], "agent": config.gbox_mini_agent_agent, "maxSteps": config.max_turns,
            "maxRunTimeSec": config.max_task_time_seconds, "maxStepTimeSec": config.max_turn_time_seconds,
            "standardActionSpace": config.gbox_mini_agent_standard_action_space,
            "model": {"baseUrl": ep.base_url, "apiKey": ep.key},
            "env": {"gymBaseUrl": "http://reference.invalid", "gymId": GYM_ID, "executionId": f"{task}-{seed}"}})
        record = RunRecord(run_id=uuid.uuid4().hex, request=request.redacted(), agent=request.agent)
        await AgentRun(record, request, AgentSettings(), http, gym, {}).run()
    finally:
        endpoint.close_episode(ep)
    info = gym.done_info or {"done": False, "raw_reward": None}
    return {"task": task, "seed": seed, "utterance": obs["utterance"], "reference": reference_reward(info),
            "reference_raw": info.get("raw_reward"), "reference_done": bool(info.get("done")),
            "reference_reason": info.get("reason"), "run_ok": record.ok, "run_reason": record.reason,
            "turns": len(record.steps), "invalid_turns": record.invalid_turns,
            "replies": [s["messages"][-1]["content"] if s.get("messages") else None for s in record.steps],
            "actions": gym.actions, "unmapped": gym.unmapped, "device_scales": sorted(gym.scales),
            "seconds": round(time.monotonic() - started, 1)}


# ---- our side, the plan, the comparison -------------------------------------------------------------------------

def ours_from_eval(path: str) -> tuple[dict[tuple[str, int], float], dict]:
    """Our gym's per-episode rewards from a cua-eval JSON (the greedy result), and that result's header."""
    data = json.loads(Path(path).read_text())
    results = data if isinstance(data, list) else [data]
    greedy = [r for r in results if r.get("greedy")]
    if not greedy:
        raise SystemExit(f"{path}: no greedy result (run cua-eval with --greedy)")
    result = greedy[0]
    if result.get("samples", 1) != 1:
        raise SystemExit(f"{path}: {result['samples']} samples per instance; the cross-check needs one")
    ours = {(row[0], int(row[1])): float(row[2]) for row in result["outcomes"]}
    return ours, {k: result.get(k) for k in ("checkpoint", "success", "episodes", "dropped", "model_errors")}


def yardstick_tasks() -> list[str]:
    from cua_rl.local_gym.miniwob_suites import plan

    p = plan()
    return list(p["train_tasks"]) + list(p["heldout_tasks"])


def instances(tasks: list[str], per_task: int, ours: dict) -> list[tuple[str, int]]:
    """The first ``per_task`` held-out seeds of each task that our side has."""
    missing = [(t, HELDOUT_FIRST + i) for t in tasks for i in range(per_task) if (t, HELDOUT_FIRST + i) not in ours]
    if missing:
        raise SystemExit(f"the eval JSON lacks {len(missing)} instance(s), e.g. {missing[:3]}; lower --per-task")
    return [(t, HELDOUT_FIRST + i) for t in tasks for i in range(per_task)]


def compare(episodes: list[dict]) -> dict:
    """agree / of over the episodes both sides played to a reward, and per task."""
    compared = [e for e in episodes if e["unmapped"] is None]
    per_task: dict[str, dict] = {}
    for e in compared:
        row = per_task.setdefault(e["task"], {"agree": 0, "of": 0, "ours_successes": 0, "reference_successes": 0})
        row["of"] += 1
        row["agree"] += e["ours"] == e["reference"]
        row["ours_successes"] += e["ours"] >= 1.0
        row["reference_successes"] += e["reference"] >= 1.0
    return {"agree": sum(e["ours"] == e["reference"] for e in compared), "of": len(compared),
            "left_out": [{"task": e["task"], "seed": e["seed"], "why": e["unmapped"]}
                         for e in episodes if e["unmapped"] is not None],
            "per_task": per_task,
            "differ": [{k: e[k] for k in ("task", "seed", "ours", "reference", "reference_raw", "reference_reason")}
                       for e in compared if e["ours"] != e["reference"]]}


async def run_all(args, config, plays: list[tuple[str, int]], ours: dict) -> list[dict]:
    from cua_rl.http.client import async_client

    endpoint = policy_endpoint(args.checkpoint, config)
    episodes = []
    async with async_client(timeout=config.max_turn_time_seconds + 60) as http:
        try:
            for task in dict.fromkeys(t for t, _ in plays):
                env = await asyncio.to_thread(reference_env, task)
                try:
                    for t, seed in plays:
                        if t != task:
                            continue
                        row = await play(env, task, seed, endpoint, config, http, args.page_time_limit_s)
                        row["ours"] = ours[(task, seed)]
                        logger.info("%s %d: ours %.0f reference %.2f (raw %s, %s; %d turns, %s)", task, seed,
                                    row["ours"], row["reference"], row["reference_raw"], row["reference_reason"],
                                    row["turns"], row["run_reason"])
                        episodes.append(row)
                finally:
                    await asyncio.to_thread(env.close)
        finally:
            await endpoint.aclose()
    return episodes


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="the model directory the eval JSON scored")
    ap.add_argument("--eval", required=True, help="cua-eval --suite miniwob:yardstick --greedy --out FILE of it")
    ap.add_argument("--per-task", type=int, default=6, help="held-out seeds per task, from 2**40 (default 6: 54)")
    ap.add_argument("--tasks", default="", help="comma-separated subset of the yardstick's tasks")
    ap.add_argument("--config", default="", help="recipe (default: cua-eval's choice, config.cpu.yaml without GPU)")
    ap.add_argument("--page-time-limit-s", type=float, default=3600.0,
                    help="the page's episode timer on the reference (our gym's miniwob_time_limit_s default); "
                         "0 keeps the page's own 10-30 s")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args, overrides = ap.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "cua_rl.local_agent.runner", "cua_rl.policy.endpoint"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ours, header = ours_from_eval(args.eval)
    tasks = [t for t in args.tasks.split(",") if t] or yardstick_tasks()
    plays = instances(tasks, args.per_task, ours)
    config_file, config = load_config(args.config, overrides)
    started = time.monotonic()
    episodes = asyncio.run(run_all(args, config, plays, ours))
    scales = sorted({s for e in episodes for s in e["device_scales"]})
    out = {
        "bench": "miniwob_cross_check", "issue": "85 item 6",
        "checkpoint": args.checkpoint, "eval": args.eval, "eval_result": header,
        "config": config_file, "max_turns": config.max_turns, "agent": config.gbox_mini_agent_agent,
        **compare(episodes),
        "observation": {"device_scales": scales, "size": list(SCREEN),
                        "how": ("the package's get_screenshot, crop scaled by 3, of Chromium started with "
                                f"--force-device-scale-factor={ZOOM}") if scales == [ZOOM] else
                               "UPSCALED: the package's 160x210 observation resized 3x (nearest): the browser "
                               f"did not render at scale {ZOOM}"},
        "model_server": ("transformers greedy generate (HFGreedyEngine) behind our PolicyEndpoint (the prompt ids, "
                         "images and reply building cua-eval uses); cua-eval itself serves the model with vLLM"),
        "reward": "ours: the eval JSON's per-instance successes (greedy: 0 or 1); reference: clip(raw_reward, 0, 1) "
                  "once done (cua_rl.local_gym.miniwob.score_of); agree: equal",
        "page_time_limit_s": args.page_time_limit_s or "the page's own",
        "nondeterministic_tasks": ["click-dialog", "click-dialog-2"],
        "seconds": round(time.monotonic() - started, 1),
        "episodes": episodes,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: out[k] for k in ("agree", "of", "per_task", "left_out", "differ", "observation")}, indent=1))
    return out


if __name__ == "__main__":
    main()
