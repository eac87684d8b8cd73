"""The agent service's model client (cua_rl/local_agent/model_client.py) against a hostile model server: the
scripted model double (tests/doubles/model_double.py, on real loopback HTTP) answers compression bombs
(tests/doubles/bombs.py), as a third-party model server may.

Why at the client: the bound on a model answer (``AgentSettings.max_answer_bytes``, 8 MiB) is the client's;
a ``ModelError`` is what ends the agent's run as the model server's (``failure: model``; the whole run is shown
by tests/local_agent/test_agent_desktop.py::test_a_model_answer_past_the_cap_is_not_read_and_fails_as_the_model_servers).
Issue 80: the bound was counted after decompression, so 589 bytes of ``gzip, gzip`` raised the agent service to
596 MB and 8 kB of zstd to 607 MB before the bound was checked.
"""

from __future__ import annotations

import pytest

from cua_rl.http.client import async_client
from cua_rl.http.retry import RetryPolicy
from cua_rl.local_agent.model_client import ModelClient, ModelError
from tests.doubles.bombs import CODINGS, MAX_GROWTH, MiB, compression_bomb, peak_rss_growth
from tests.doubles.model_double import MODEL_ID


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_compressed_bomb_from_the_model_server_is_never_decoded(model, coding):
    scripted, base = model
    bomb = compression_bomb(coding)
    key = scripted.script("bomb", [{"encoded": (bomb, coding)}])
    async with async_client() as http:
        client = ModelClient(http, base, key, retry=RetryPolicy(attempts=1), timeout_s=30, hints_supported={})
        with peak_rss_growth() as grown, pytest.raises(ModelError) as failed:
            await client.complete({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
                                  lambda _body: None)
    print(f"{coding}: {len(bomb)} bytes on the wire; peak RSS +{grown['bytes'] / MiB:.1f} MiB; {failed.value}")
    assert grown["bytes"] < MAX_GROWTH, f"peak RSS rose {grown['bytes'] / MiB:.0f} MiB: the bomb was decoded"
    assert f"Content-Encoding: {coding}" in str(failed.value), failed.value
