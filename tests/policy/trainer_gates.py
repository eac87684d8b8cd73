"""The trainer gates' shared parts (test_gates_trainer.py, test_gates_lora.py: test modules import no other test
module): two-turn episodes through our policy endpoint, the trainer-vs-vLLM logprob gate on their rows, and a turn's
logprobs under plain transformers."""

import json

import httpx
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.trajectory.rows import new_rollout_uuid
from tests.doubles.policy_helpers import png_data_url

# The recipe's actor.kl_ctl (cua_rl/recipes/config.yaml): no KL term. AReaL's default, 0.1, with no reference model
# scores the reference as logp 0, so every generated token's reward gained -0.1 * logp (about +1.2 a token on this
# random model) and every token's advantage held the rest of its row's: both kinds of row gained, rewarded or not,
# by amounts their lengths and draws decided (CI, session 35: the rewarded rows 0.109 nats a token, the others 0.129).
NO_KL = 0.0


async def play_episodes(engine, processor, temperature: float, n_episodes=2, lora_name: str = ""):
    """Two-turn episodes driven through the endpoint over HTTP, like an agent: screenshot, answer,
    next screenshot with the history. Returns the outcomes (turns recorded by the endpoint). ``lora_name``:
    the adapter's name when the engine samples with LoRA (test_gates_lora.py)."""
    sampling = GenerationHyperparameters(max_new_tokens=16, temperature=temperature)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer,
                            sampling.new(lora_name=lora_name) if lora_name else sampling,
                            EndpointSettings(max_screenshots_in_history=2))
    outcomes = []
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            for e in range(n_episodes):
                ep = await policy.open_episode()
                hdr = {"Authorization": f"Bearer {ep.key}"}
                msgs = [{"role": "system", "content": "You operate a computer."},
                        {"role": "user", "content": [{"type": "text", "text": "Save the file."},
                                                     {"type": "image_url", "image_url": {"url": png_data_url((40 * e, 90, 200))}}]}]
                for turn in range(2):
                    r = await http.post(ep.base_url + "/chat/completions", json={"messages": msgs}, headers=hdr)
                    assert r.status_code == 200, r.text
                    msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                    msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {
                        "url": png_data_url((200, 40 * e + 20 * turn, 30))}}]})
                policy.close_episode(ep)
                assert ep.verified_turns == 2 and ep.prompt_mismatches == 0
                outcomes.append(EpisodeOutcome(turns=ep.turns, reward=float(e % 2), monitor_uuid=new_rollout_uuid()))
    finally:
        await close_loop_servers()
    return outcomes


def _token_diffs(batch, logp) -> torch.Tensor:
    """|trainer - inference| per generated token (the trainer's logp[i] scores token i+1)."""
    mask = batch["loss_mask"].bool()
    return (torch.roll(logp, 1, dims=-1)[mask] - batch["logprobs"][mask]).abs()


def gate(actor, outcomes, temperature: float, label: str) -> tuple[dict, torch.Tensor, dict]:
    """Trainer logprobs at ``temperature`` for the outcomes' rows vs the logprobs vLLM returned."""
    batch = group_batch(outcomes, group_weight="tokens")
    actor.config.temperature = temperature
    (logp,) = actor.compute_logp([batch])
    d = _token_diffs(batch, logp)
    stats = {"temperature": temperature, "tokens": int(d.numel()), "median_abs_diff": float(d.median()),
             "max_abs_diff": float(d.max())}
    print(f"GATE trainer-vs-vLLM logprobs ({label}):", json.dumps(stats))
    return stats, logp, batch


def hf_logprobs(model_dir: str, turn, temperature: float) -> torch.Tensor:
    """The turn's output-token logprobs under the checkpoint in ``model_dir`` (plain transformers)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([turn.prompt_ids + turn.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, **turn.multi_modal_input).logits[0].float() / temperature
    logp = logits.log_softmax(-1)
    n = len(turn.prompt_ids)
    return torch.stack([logp[n - 1 + i, t] for i, t in enumerate(turn.output_ids)])
