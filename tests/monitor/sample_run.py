"""A small training run sent to a Training Monitor through the real client and reporter: what the server,
Postgres and browser tests look at. Turns are real ``policy.records.Turn`` objects carrying a real PNG
(drawn here), so the reporter's hashing, upload and token decoding run exactly as in a rollout worker.
"""

from __future__ import annotations

import base64
import io
import math

from PIL import Image, ImageDraw

from cua_rl.http.retry import RetryPolicy
from cua_rl.monitor import EpisodeReporter
from cua_rl.policy.records import Turn

FAST = RetryPolicy(attempts=1, backoff_s=0.0, max_backoff_s=0.0, retry_5xx=False)
SCREEN = (320, 200)


class PieceTokenizer:
    """Stands in for a Hugging Face tokenizer's decode/batch_decode (token id -> 'tN ')."""

    def batch_decode(self, seqs, skip_special_tokens=False):
        return [f"t{s[0]} " for s in seqs]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"t{i} " for i in ids)


def screenshot_png(colour: str = "#3070c0", label: str = "") -> bytes:
    img = Image.new("RGB", SCREEN, "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle((60, 80, 140, 120), fill=colour)
    draw.text((10, 10), label, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_turn(png: bytes, n_tokens: int = 6, *, latency: float = 0.25) -> Turn:
    ids = list(range(100, 100 + n_tokens))
    logprobs = [math.log(0.9 - 0.12 * i) for i in range(n_tokens)]
    return Turn(prompt_ids=[1, 2, 3], output_ids=ids, output_logprobs=logprobs, output_versions=[0] * n_tokens,
                n_images=1, latency_s=latency, image_b64=base64.b64encode(png).decode())


def agent_steps() -> list[dict]:
    """Two agent steps as the embedded agent records them: a click, then a drag."""
    return [
        {"step": 1, "thinking": "the button is on the left", "text": "click it",
         "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "click(0.25, 0.5)"}],
         "actions": [{"name": "click", "args": {"x": 250, "y": 500}, "callId": "c1",
                      "gymAction": {"type": "click", "x": 0.25, "y": 0.5, "button": "left", "count": 1}}]},
        {"step": 2, "thinking": None, "text": None,
         "messages": [{"role": "assistant", "content": "drag(0.2,0.5 -> 0.8,0.5)"}],
         "actions": [{"name": "drag", "args": {}, "callId": "c2",
                      "gymAction": {"type": "drag", "x": 0.2, "y": 0.5, "x2": 0.8, "y2": 0.5}}]},
    ]


INSTRUCTION = "Open the editor and type the word shown on the card (instance 3: 'lemon')."


async def send_sample_run(base_url: str, token: str, training_id: int, *, step: int = 0,
                          rewards=(1.0, 0.0), is_eval: bool = False, task_id: str = "task-1",
                          cancelled: int = 0) -> EpisodeReporter:
    """One GRPO group of ``len(rewards)`` rollouts at policy version ``step``, each with two turns; the
    group's advantages follow, as the workflow sends them; then ``cancelled`` rollouts the run's end cancelled
    in flight, as the workflow reports them. Returns the (closed) reporter."""
    from cua_rl.trajectory import normalise_group

    rep = EpisodeReporter(base_url, "p1", training_id, token=token, retry=FAST)
    reports = []
    for i, reward in enumerate(rewards):
        report = rep.rollout(f"{task_id}-{step}-{int(is_eval)}-{i:02d}".ljust(32, "0"), task_id=task_id,
                             task_name="Open the editor", task_description="Open the editor and type the word shown.",
                             step=step, source_type="step", is_eval=is_eval,
                             env_index=i, group_id=f"{task_id}:0:{step}:{int(is_eval)}", max_turns=5,
                             model_path="/m")
        shots = [screenshot_png("#3070c0", f"r{i} t1"), screenshot_png("#c03070", f"r{i} t2")]
        report.finished(reward=reward, task_success=reward > 0.5, num_turns=2, num_validators=1,
                        evaluation={"score": reward, "validators": [{"name": "file_saved", "score": reward}]},
                        summary={"task_id": task_id, "execution_id": f"ex{i}", "instruction": INSTRUCTION},
                        turns=[make_turn(shots[0]), make_turn(shots[1], 4)], steps=agent_steps(),
                        tokenizer=PieceTokenizer())
        reports.append(report)
    for report, adv in zip(reports, normalise_group(list(rewards))):
        report.advantage(adv, 2)
    for i in range(cancelled):
        rep.rollout(f"{task_id}-{step}-{int(is_eval)}-c{i:02d}".ljust(32, "0"), task_id=task_id, task_name="Open the editor",
                    step=step + 1, source_type="step", is_eval=is_eval, env_index=i,
                    group_id=f"{task_id}:0:{step + 1}:{int(is_eval)}", max_turns=5, model_path="/m").cancelled(
            "cancelled: the run stopped while the episode was in flight")
    await rep.aclose()
    return rep
