"""The start-run request the mini-agent client tests send (a module of its own: test modules import no other
test module)."""

from cua_rl.mini_agent import GenvEnv, ModelEndpoint, RunRequest, Sampling

SECRET = "sk-test-SECRET-123"


def make_request(**overrides) -> RunRequest:
    """A valid request with an api key and sampling; ``overrides`` replace its fields."""
    fields = dict(task="Open the settings app", agent="qwen3-vl", max_steps=7,
                  model=ModelEndpoint(base_url="http://127.0.0.1:8000/v1", name="policy", api_key=SECRET),
                  env=GenvEnv(gym_base_url="http://127.0.0.1:5010", gym_id="desktop", execution_id="exec-1"),
                  standard_action_space="pc", sampling=Sampling(temperature=1.0, top_p=0.9, max_tokens=256))
    fields.update(overrides)
    return RunRequest(**fields)
