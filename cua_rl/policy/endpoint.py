"""``PolicyEndpoint``: an OpenAI-compatible ``/v1/chat/completions`` in front of ``engine.agenerate``.

One delivered answer = one recorded ``Turn`` (an answer the agent never received is not recorded, see
``_delivered``): the processor builds the prompt (expanded image tokens, pixel values),
the engine generates with the *trainer's* ``gconfig`` (the agent's sampling fields are ignored and
logged: on-policy RL needs a known behaviour policy), and the reply carries the text plus vLLM-style
``token_ids``/``prompt_token_ids``/``logprobs`` so agents that log responses keep them.

CPU work (decoding, shrinking and patchifying screenshots, templating) runs in a thread pool as wide as
the machine, never on the event loop and never behind one lock: with 64 episodes in flight the endpoint
must not serialise every turn. Each distinct screenshot is processed once per episode (``Episode.images``).

Exact prompts on vLLM (``vllm_proof``): every HTTP attempt asks vLLM for the prompt ids it used; a turn
whose ids differ from the processor's in any attempt is refused (503), counted in ``prompt_mismatches``
and never recorded. ``tools`` reach vLLM's template the same way they reach ours, and the model's tool calls
come back in ``message.tool_calls`` as from vLLM's own server with its hermes parser (``tool_calls``).

vLLM and weight updates: a pause aborts in-flight requests and AReaL resumes a vision request by
regenerating from the messages and appending, so a vision turn that needed more than one attempt (or whose
tokens carry more than one policy version) is corrupt. Such outputs are regenerated from scratch
(``max_straddle_retries``), then answered with 503. SGLang resumes from token ids correctly, so mixed
versions are kept there (AReaL's partial rollouts). An output holding a vision placeholder token is sampled
again on a budget of its own (``max_vision_token_resamples``): the two causes are unrelated, and a model that
often samples those tokens must not spend the tries a weight update needs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import re
import secrets
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..http.auth import is_loopback  # one rule for "this machine only" (servers and the endpoint)
from .images import NOT_A_DATA_URL, BadImage, DecodedImage, ImageFetchLimits, decode_data_url, fetch_http_image
from .prompt import BadRequest, PreparedImage, build_prompt, parse_messages, prepare_image
from .records import Episode, Turn
from .server import Answer, LoopServer, error_body, get_loop_server
from .tool_calls import ToolRequest, parse_reply
from .vllm_proof import install as install_prompt_proof, proving

logger = logging.getLogger(__name__)

# Fields a client may send that we accept but do not obey (the trainer's gconfig decides).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop",
                   "frequency_penalty", "presence_penalty", "seed", "min_p", "repetition_penalty")
HARMLESS_FIELDS = {"model", "messages", "stream", "n", "tools", "tool_choice", "logprobs", "top_logprobs",
                   "stream_options", "return_token_ids", "user", "metadata", "parallel_tool_calls",
                   "response_format", "extra_body", "chat_template_kwargs", "skip_special_tokens"}
# The ignored fields this process has logged (the agent sends the same ones on every turn of every episode).
_IGNORED_LOGGED: set[str] = set()


@dataclass
class EndpointSettings:
    """The policy endpoint's settings: the ``policy:`` section of the training config (``CUAConfig.policy``
    is this class) and what ``PolicyEndpoint`` takes; the one definition of their defaults."""

    bind_host: str = field(default="auto", metadata={
        "help": "Where the endpoint listens. \"auto\": 127.0.0.1 when the agent service is on this machine's "
                "loopback (the embedded stack), else every interface (0.0.0.0), so an agent on another host can "
                "reach it."})
    port: int = field(default=0, metadata={
        "help": "The endpoint's port; 0 picks a free one at start-up (several rollout workers may share a machine)."})
    advertised_host: str = field(default="", metadata={
        "help": "Host put into the agent's `model.baseUrl`. Empty = the bind host, or, when that is a wildcard, "
                "the address of this machine's interface that routes to the agent service (another host's agent "
                "must be told an address it can reach, not 127.0.0.1)."})
    max_screenshots_in_history: int | None = field(default=3, metadata={
        "help": "Screenshots kept in the prompt; older image parts are dropped before the processor runs. Every "
                "kept image is re-encoded into every later turn's training row, so this bounds memory. null = keep "
                "all."})
    min_pixels: int | None = field(default=None, metadata={
        "help": "Lower pixel bound per image (null = none). The bounds are applied together with the "
                "processor's own: an image outside them is resized once, straight onto the processor's patch grid (images.fit_pixels), so vLLM sees "
                "the same pixels and neither processor resamples them again. Qwen3-VL's visual token is a "
                "32x32-pixel cell: a 1280x800 desktop is 40x25 of them (1000 visual tokens) and is sent as the "
                "agent sent it at 1_024_000."})
    max_pixels: int | None = field(default=1_024_000, metadata={
        "help": "Upper pixel bound per image (null = none); see min_pixels."})
    image_fetch_max_bytes: int = field(default=20 * 1024 * 1024, metadata={
        "help": "Bytes one image may take, data: URLs included (what our agents send); http(s) URLs are fetched "
                "only from allowed_image_hosts (images.py)."})
    image_fetch_timeout_seconds: float = field(default=15.0, metadata={
        "help": "Seconds an http(s) image fetch may take (only from allowed_image_hosts)."})
    allowed_image_hosts: list[str] = field(default_factory=list, metadata={
        "help": "Hosts whose http(s) image URLs in agent messages are fetched (vLLM's --allowed-media-domains); "
                "any other host is refused without a request, naming it; empty: data: URLs only."})
    max_images_per_request: int = field(default=64, metadata={
        "help": "Images one chat request may carry; more is refused (vLLM's --limit-mm-per-prompt counterpart)."})
    model_name: str = field(default="policy", metadata={
        "help": "The model name the endpoint reports (agents' `model` field is accepted and ignored)."})
    backend: str = field(default="auto", metadata={
        "help": "auto (what AReaL's engine carries: its config's backend, engine_kind), vllm or sglang: decides "
                "how version-straddling outputs are treated and whether the prompt proof is needed.",
        "choices": ["auto", "vllm", "sglang"]})
    max_straddle_retries: int = field(default=2, metadata={
        "help": "Regenerations of an output interrupted by a weight update (vLLM), then 503."})
    max_vision_token_resamples: int = field(default=8, metadata={
        "help": "Samples again of an output holding an image/video placeholder or vision start/end token, then "
                "503: a trained model rarely samples them and pays nothing; a random one (the tests' tiny model) "
                "does in about 3 tries of 10, and 8 makes losing a turn to it about one in 50,000 (0.3^9)."})
    require_prompt_proof: bool = field(default=True, metadata={
        "help": "On vLLM, refuse to start when the engine's prompt ids cannot be proved (vllm_proof); false only "
                "trains unproved prompts with a warning."})

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"policy.port must be 0..65535, got {self.port}")
        if self.max_screenshots_in_history is not None and self.max_screenshots_in_history < 1:
            raise ValueError("policy.max_screenshots_in_history must be >= 1 (or null: keep all)")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError("policy.min_pixels must not exceed policy.max_pixels")
        if self.image_fetch_max_bytes <= 0 or self.image_fetch_timeout_seconds <= 0:
            raise ValueError("policy.image_fetch_* caps must be positive")
        if self.max_images_per_request < 1 or self.max_straddle_retries < 0 or self.max_vision_token_resamples < 0:
            raise ValueError("policy.max_images_per_request must be >= 1, and max_straddle_retries and "
                             "max_vision_token_resamples >= 0")
        engine_backend(None, self.backend)  # auto, vllm or sglang
        self.allowed_image_hosts = list(self.allowed_image_hosts or [])
        for host in self.allowed_image_hosts:
            if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9.-]+|\[?[0-9A-Fa-f:.]+\]?", host):
                raise ValueError(f"policy.allowed_image_hosts: {host!r} is not a host name or address (a host, not a "
                                 f"URL: e.g. screenshots.example.com)")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "EndpointSettings":
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown policy endpoint settings: {sorted(unknown)}")
        return cls(**d)

    @property
    def image_limits(self) -> ImageFetchLimits:
        return ImageFetchLimits(max_bytes=self.image_fetch_max_bytes, timeout_s=self.image_fetch_timeout_seconds,
                                allowed_hosts=tuple(h.lower() for h in self.allowed_image_hosts))


def engine_backend(engine: Any, configured: str = "auto") -> str:
    """``policy.backend``: "vllm" or "sglang" as configured, or ("auto") what the engine is (``engine_kind``);
    an engine that does not say is treated as vLLM."""
    if configured in ("vllm", "sglang"):
        return configured
    if configured != "auto":
        raise ValueError(f"policy.backend must be auto, vllm or sglang, got {configured!r}")
    return engine_kind(engine) or "vllm"


ENGINE_KINDS = ("vllm", "sglang")


def engine_kind(engine: Any) -> str | None:
    """"vllm" or "sglang" as AReaL's engine itself carries it, None for an engine that carries neither (a test's
    engine, a user's own). The workflow gets AReaL's ``RemoteInfEngine`` (whose class name names no backend):
    its ``config.backend`` (``rollout.backend``, e.g. "vllm:d4p1t1", read with AReaL's ``ModelAllocation``), else
    the class of its ``backend`` object (``VLLMBackend``, ``SGLangBackend``; inside our ``ProvingBackend`` too).
    ``RemotevLLMEngine`` and ``RemoteSGLangEngine`` carry the same config and hold a ``RemoteInfEngine``."""
    from areal.api.alloc_mode import ModelAllocation

    for obj in (engine, getattr(engine, "_engine", None)):
        if obj is None:
            continue
        spec = getattr(getattr(obj, "config", None), "backend", None)
        if isinstance(spec, str) and spec:
            try:
                kind = ModelAllocation.from_str(spec, name="rollout").backend
            except Exception:  # noqa: BLE001 - not set yet ("???") or not an allocation: ask the backend object
                kind = None
            if kind in ENGINE_KINDS:
                return kind
        backend = getattr(obj, "backend", None)
        if backend is not None:
            name = type(getattr(backend, "_inner", backend)).__name__.lower()
            kind = next((k for k in ENGINE_KINDS if name.startswith(k)), None)
            if kind is not None:
                return kind
    return None


WILDCARDS = ("0.0.0.0", "::", "")


def endpoint_hosts(settings: EndpointSettings, agent_url: str = "") -> tuple[str, str]:
    """(host to bind, host to put into the agent's ``model.baseUrl``) for an agent service at ``agent_url``
    (unknown: treated as this machine's)."""
    agent_host = urlsplit(agent_url).hostname if agent_url else None
    bind = settings.bind_host
    if bind == "auto":
        bind = "127.0.0.1" if agent_host is None or is_loopback(agent_host) else "0.0.0.0"
    if settings.advertised_host:
        return bind, settings.advertised_host
    if bind not in WILDCARDS:
        return bind, bind
    return bind, route_address(agent_host)


def route_address(host: str | None) -> str:
    """This machine's address on the interface that routes to ``host`` (a UDP "connect" sends nothing; it
    only asks the kernel for the route); this machine's main address when ``host`` is unknown or unroutable."""
    if host and not is_loopback(host):
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(addr[:2])
                return probe.getsockname()[0]
        except OSError as exc:
            logger.warning("no route to the agent service's host %s (%s); advertising this machine's main address",
                           host, exc)
    from areal.utils.network import gethostip

    return gethostip()


class PolicyEndpoint:
    """Serve one policy (engine + processor + gconfig) to agents, one bearer key per episode."""

    def __init__(self, engine, processor, tokenizer, gconfig, settings: EndpointSettings | None = None):
        self.engine = engine
        self.processor = processor
        self.tokenizer = tokenizer
        # n_samples=1: the engine generates one sample per request; groups are episodes, not samples.
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer).new(n_samples=1)
        self.settings = settings or EndpointSettings()
        self.backend = engine_backend(engine, self.settings.backend)
        # On vLLM the echoed prompt ids prove nothing (module docstring): ask vLLM itself.
        self.proves_prompts = self.backend == "vllm" and install_prompt_proof(engine)
        if self.backend == "vllm" and not self.proves_prompts:
            # AReaL's vLLM engine whose backend the proof cannot wrap (e.g. another AReaL version): refused.
            # Engines that do not say what they are (a test's engine, a user's own) have no vLLM to ask: warned.
            if self.settings.require_prompt_proof and engine_kind(engine) == "vllm":
                raise RuntimeError(f"engine {type(engine).__name__} has no vLLM backend to ask for its prompt ids: "
                                   f"the prompts trained on could not be proved equal to vLLM's (set "
                                   f"policy.require_prompt_proof=false to train unproved)")
            logger.warning("engine %s has no vLLM backend to ask for its prompt ids: prompts are not proved "
                           "(policy.require_prompt_proof=false)", type(engine).__name__)
        self.vision_ids = vision_token_ids(processor)
        self.totals = {"recorded_turns": 0, "verified_turns": 0, "prompt_mismatches": 0, "straddles": 0,
                       "vision_token_outputs": 0, "failed_turns": 0, "undelivered_turns": 0, "unproved_vllm_turns": 0,
                       "context_overflows": 0}
        self._cpu = _cpu_pool()
        self._http: aiohttp.ClientSession | None = None
        self._servers: dict[str, LoopServer] = {}   # open episode's key -> the server it is registered with

    # ---- episodes -------------------------------------------------------------------------------
    async def open_episode(self, agent_url: str = "") -> Episode:
        """A new episode with its own key, served where the agent service at ``agent_url`` can reach it."""
        bind, host = endpoint_hosts(self.settings, agent_url)
        server = await get_loop_server(bind, self.settings.port)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        ep = Episode(id=uuid.uuid4().hex[:12], key="cua-" + secrets.token_urlsafe(24),
                     base_url=f"http://{host}:{server.port}/v1", model=self.settings.model_name)
        server.register(ep.key, functools.partial(self.complete, ep), ep.model)
        self._servers[ep.key] = server
        return ep

    def close_episode(self, ep: Episode) -> None:
        """Revoke the key: late calls from a run that outlives its episode get 401 and record nothing."""
        server = self._servers.pop(ep.key, None)
        if server is not None:
            server.unregister(ep.key)
        ep.closed = True
        if ep.hold is not None:   # a call still held is let go, and answered as an episode that ended
            ep.hold.release()
        ep.images = {}  # the prepared screenshots; the turns keep their own tensors

    @asynccontextmanager
    async def episode(self):
        ep = await self.open_episode()
        try:
            yield ep
        finally:
            self.close_episode(ep)

    def hold(self, ep: Episode, turn: int, sampled: bool = False) -> "Hold":
        """Hold the episode's model call for turn ``turn`` (1-based: the call made after ``turn - 1`` recorded
        turns) until ``release()``: a tree group forks the desktop while the parent's next call waits, so the
        parent and its continuations sample that turn from the same screen (docs/learning.md, "Tree groups").
        ``sampled``: the call is held after its turn is sampled, before the answer goes out (the agent has not
        acted yet), and ``Hold.sampled`` shows that turn: whoever forks can ask how sure the policy was. The
        held call's time counts against the agent's step limit; closing the episode lets it go."""
        if turn < 1 or turn <= len(ep.turns):
            raise ValueError(f"episode {ep.id} has recorded {len(ep.turns)} turns: turn {turn} cannot be held")
        ep.hold = Hold(turn, sampled)
        return ep.hold

    # ---- one chat completion --------------------------------------------------------------------
    async def complete(self, ep: Episode, body: dict[str, Any]) -> Answer:
        """Answer one request. A successful answer's Turn is recorded once the server has delivered it
        (``_delivered``): a reply the agent never received was never played, so it is never trained."""
        ignored = {k for k in body if k not in HARMLESS_FIELDS}  # sampling fields and anything unknown
        ep.ignored_params |= ignored
        if ignored - _IGNORED_LOGGED:   # once per field and process: every agent sends them on every turn
            logger.info("ignoring client fields %s (sampling comes from the trainer's gconfig; said once per "
                        "process)", sorted(ignored - _IGNORED_LOGGED))
            _IGNORED_LOGGED.update(ignored)
        if body.get("n") not in (None, 1):
            return Answer(400, error_body(400, "n must be 1"))
        if ep.overflow:   # the episode ended at its overflow: nothing after it is the policy's
            return overflow_answer(ep.overflow)
        held = ep.hold if ep.hold is not None and ep.hold.turn == len(ep.turns) + 1 else None
        if held is not None and not held.after_sampling:
            if (closed := await self._held(ep, held, None)) is not None:
                return closed
            held = None
        return await self._answer(ep, body, held)

    async def _held(self, ep: Episode, held: "Hold", sampled: Turn | None) -> Answer | None:
        """Wait for ``held`` to be released (the fork made or given up; a later turn's hold set on release stays);
        the 503 to answer when the episode was closed meanwhile, else None."""
        await held.wait_released(sampled)
        if ep.hold is held:
            ep.hold = None
        return Answer(503, error_body(503, "the episode ended while this call was held", "server_error")) \
            if ep.closed else None

    async def _answer(self, ep: Episode, body: dict[str, Any], held: "Hold | None") -> Answer:
        """``complete``'s answer: the prompt built, the turn sampled (then held, with ``held``, until released),
        recorded once the answer is delivered."""
        started = time.perf_counter()
        try:
            parsed = parse_messages(body.get("messages"), self.settings.max_screenshots_in_history)
            if len(parsed.image_urls) > self.settings.max_images_per_request:
                raise BadRequest(f"{len(parsed.image_urls)} images exceed the limit of "
                                 f"{self.settings.max_images_per_request} per request")
            images = await self._prepare_images(ep, parsed.image_urls)
            tools = body.get("tools")
            if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
                raise BadRequest("'tools' must be a list of tool objects ({\"type\": \"function\", ...})")
            tool_request = ToolRequest.of(body)
            if tools and self.backend == "vllm" and images and not self.proves_prompts:
                # Without the proof wrapper AReaL's vLLM vision path sends only the messages: the server
                # would template without the tools and sample from a prompt we do not train on.
                raise BadRequest("'tools' with images need the vLLM prompt proof, which this engine lacks: "
                                 "put the tool specification in the system prompt")
            prompt = await self._on_cpu(build_prompt, self.processor, self.tokenizer, parsed, images, tools)
        except (BadRequest, BadImage) as exc:
            logger.info("episode %s: rejected request: %s", ep.id, exc)
            return Answer(400, error_body(400, str(exc)))
        if len(prompt.input_ids) >= self.gconfig.max_tokens:
            ep.overflow = (f"the prompt has {len(prompt.input_ids)} tokens; the policy's context holds "
                           f"{self.gconfig.max_tokens} in all (gconfig.max_tokens), its reply included")
            self.totals["context_overflows"] += 1
            logger.info("episode %s: %s: the episode ends here, as the policy's", ep.id, ep.overflow)
            return overflow_answer(ep.overflow)
        ep.in_flight += 1
        try:
            resp = await self._generate(ep, prompt, tools)
        except PromptMismatch as exc:
            self._tally(ep, "failed_turns", "prompt_mismatches")
            logger.error("episode %s: vLLM generated from other prompt ids than the processor's; turn refused "
                         "and not recorded: %s", ep.id, exc)
            return Answer(503, error_body(503, "engine prompt mismatch: vLLM tokenised the request differently",
                                          "server_error"))
        except Exception as exc:  # engine/infra failure: the workflow turns this episode into None
            self._tally(ep, "failed_turns")
            if not getattr(self.engine, "initialized", True):
                # AReaL's destroy() clears `initialized` first, then closes the sessions of episodes still in
                # flight (the next step's rollouts at the end of a run): an orderly stop, not an error.
                logger.info("episode %s: generation stopped: the inference engine is shutting down", ep.id)
                return Answer(503, error_body(503, "the inference engine is shutting down", "server_error"))
            logger.error("episode %s: generation failed: %s: %s", ep.id, type(exc).__name__, exc)
            return Answer(503, error_body(503, f"policy generation failed ({type(exc).__name__})", "server_error"))
        finally:
            ep.in_flight -= 1
        if resp is None:
            self._tally(ep, "failed_turns")
            return Answer(503, error_body(503, "policy output straddled a weight update; retry the request",
                                          "server_error"))
        turn = Turn(prompt_ids=list(resp.input_tokens), output_ids=list(resp.output_tokens),
                    output_logprobs=[float(x) for x in resp.output_logprobs],
                    output_versions=[int(v) for v in resp.output_versions],
                    prompt_mm_token_type_ids=prompt.mm_token_type_ids,
                    multi_modal_input=prompt.multi_modal_input, stop_reason=resp.stop_reason,
                    n_images=len(prompt.images), latency_s=time.perf_counter() - started,
                    image_b64=prompt.images[-1].b64 if prompt.images else None)
        if turn.prompt_ids != prompt.input_ids:  # the engine's own echo (SGLang, other engines)
            self._tally(ep, "failed_turns", "prompt_mismatches")
            logger.error("episode %s: engine echoed different prompt ids; turn not recorded", ep.id)
            return Answer(503, error_body(503, "engine prompt mismatch", "server_error"))
        try:
            answer = self._completion_json(ep, turn, tool_request)
        except Exception as exc:  # noqa: BLE001 - whatever the sampled text holds: a counted 503, never a 500
            self._tally(ep, "failed_turns")
            logger.error("episode %s: the answer could not be built from the sampled turn (%s: %s); not recorded",
                         ep.id, type(exc).__name__, exc)
            return Answer(503, error_body(503, f"the policy's answer could not be built ({type(exc).__name__})",
                                          "server_error"))
        if held is not None and (closed := await self._held(ep, held, turn)) is not None:
            return closed   # not delivered: not recorded
        return Answer(200, answer, functools.partial(self._delivered, ep, turn))

    def _delivered(self, ep: Episode, turn: Turn, delivered: bool) -> None:
        """Record ``turn`` when its answer reached the agent. One that did not (the agent stopped waiting, e.g.
        its step time limit, or its connection broke and it will retry) is counted and dropped: training on
        it would credit the policy with an action that never happened, or with one turn twice."""
        ep.answer_lost = not delivered
        if not delivered:
            self._tally(ep, "undelivered_turns")
            logger.warning("episode %s: the agent did not receive an answer (it stopped waiting or its connection "
                           "broke): that turn is not recorded", ep.id)
            return
        if self.proves_prompts:
            self._tally(ep, "verified_turns")
        elif self.backend == "vllm":   # policy.require_prompt_proof=false: the summary says so
            self.totals["unproved_vllm_turns"] += 1
        self.totals["recorded_turns"] += 1
        ep.turns.append(turn)
        if ep.on_turn is not None:
            try:  # an observer: whatever it does, the agent has its answer
                ep.on_turn(len(ep.turns), turn)
            except Exception as exc:  # noqa: BLE001
                logger.warning("episode %s: turn observer failed: %s: %s", ep.id, type(exc).__name__, exc)

    def _tally(self, ep: Episode, *names: str) -> None:
        """Count one more of each ``names`` on the episode and in the endpoint's totals (same names)."""
        for name in names:
            setattr(ep, name, getattr(ep, name) + 1)
            self.totals[name] += 1

    async def _on_cpu(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    async def _prepare_images(self, ep: Episode, urls: list[str]) -> list[PreparedImage]:
        """The request's images, each prepared once per episode (in parallel); the episode keeps only this
        request's, since an agent never sends back a screenshot it has dropped from its history."""
        keyed = await asyncio.gather(*(self._prepared(ep, url) for url in urls))
        ep.images = dict(keyed)
        return [prepared for _, prepared in keyed]

    async def _prepared(self, ep: Episode, url: str) -> tuple[str, PreparedImage]:
        scheme = url.split(":", 1)[0].lower()
        if scheme == "data":
            return await self._on_cpu(self._prepare_once, ep.images, url, None)
        if scheme in ("http", "https"):
            fetched = await fetch_http_image(url, await self._session(), self.settings.image_limits)
            return await self._on_cpu(self._prepare_once, ep.images, fetched.b64, fetched)
        raise BadImage(NOT_A_DATA_URL)   # a path, file:, ...: never read

    def _prepare_once(self, cache: dict[str, PreparedImage], content: str,
                      fetched: DecodedImage | None) -> tuple[str, PreparedImage]:
        """(content hash, the prepared image): from the episode's cache, else decoded (a data URL's
        ``content`` is the URL itself) and prepared now. Runs on the CPU pool."""
        key = hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()
        if key in cache:
            return key, cache[key]
        s = self.settings
        decoded = fetched or decode_data_url(content, s.image_limits)
        return key, prepare_image(self.processor, decoded, s.min_pixels, s.max_pixels)

    async def _generate(self, ep: Episode, prompt, tools: list | None = None):
        """The engine's response, proved on vLLM; None when its tries ran out: ``max_straddle_retries`` outputs
        more straddled a weight update, or ``max_vision_token_resamples`` more sampled a vision placeholder
        token (each cause counts against its own budget)."""
        from areal.api.io_struct import ModelRequest

        s = self.settings
        straddles = resamples = 0
        while straddles <= s.max_straddle_retries and resamples <= s.max_vision_token_resamples:
            req = ModelRequest(rid=uuid.uuid4().hex, input_ids=list(prompt.input_ids),
                               image_data=[d.b64 for d in prompt.images],
                               vision_msg_vllm=[_fresh(prompt.for_vllm)] if prompt.images else None,
                               gconfig=self.gconfig.new(), tokenizer=self.tokenizer, processor=self.processor)
            with proving(tools if self.proves_prompts else None) as proof:
                resp = await self.engine.agenerate(req)
            resumed_chat = False
            if self.proves_prompts:
                why = proof.mismatch(list(prompt.input_ids), [int(t) for t in resp.output_tokens])
                if why is not None:
                    raise PromptMismatch(why)
                resumed_chat = bool(prompt.images) and proof.attempts > 1
            sampled_vision = self.vision_ids.intersection(int(t) for t in resp.output_tokens)
            if sampled_vision:
                # An image/video placeholder in the output would make the trainer's forward count more image
                # tokens than image features and fail the whole step: never train on it, sample again.
                self._tally(ep, "vision_token_outputs")
                resamples += 1
                logger.info("episode %s: the model sampled vision placeholder token(s) %s; sampling again (%d/%d)",
                            ep.id, sorted(sampled_vision), resamples, s.max_vision_token_resamples)
                continue   # counted for the summary too
            if self.backend != "vllm" or (len(set(resp.output_versions)) <= 1 and not resumed_chat):
                return resp
            ep.dropped_straddles += 1
            self.totals["straddles"] += 1
            straddles += 1
            # normal under async RL (a weight update paused the engine mid-output): counted for the summary
            logger.info("episode %s: output was interrupted (%d attempts, policy versions %s) and vLLM "
                        "resumes a vision request by regenerating from the messages; regenerating (%d/%d)",
                        ep.id, proof.attempts, sorted(set(resp.output_versions)), straddles, s.max_straddle_retries)
        return None

    def _completion_json(self, ep: Episode, turn: Turn, tools: ToolRequest = ToolRequest()) -> dict[str, Any]:
        """The answer to the agent (the turn itself is recorded as sampled): with ``tools`` parsed, tool calls
        come out of the text as vLLM's hermes parser gives them (tool_calls.py)."""
        tok = self.tokenizer
        stop_ids = set(self.gconfig.stop_token_ids)
        body_ids = list(turn.output_ids)
        while body_ids and body_ids[-1] in stop_ids:
            body_ids.pop()
        # as vLLM: special tokens are kept in the text a tool parser reads (some models mark <tool_call> special)
        reply = parse_reply(tok.decode(body_ids, skip_special_tokens=not tools.parse), tools)
        pieces = tok.batch_decode([[t] for t in turn.output_ids], skip_special_tokens=False)
        finish = "tool_calls" if reply.tool_calls else "length" if turn.stop_reason in ("length", "abort") else "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": ep.model,
            "choices": [{
                "index": 0, "finish_reason": finish,
                "message": {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls},
                "logprobs": {"content": [
                    {"token": p, "logprob": lp, "bytes": list(p.encode("utf-8")), "top_logprobs": []}
                    for p, lp in zip(pieces, turn.output_logprobs)]},
                "token_ids": list(turn.output_ids),
            }],
            "prompt_token_ids": list(turn.prompt_ids),
            "usage": {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(turn.output_ids),
                      "total_tokens": len(turn.prompt_ids) + len(turn.output_ids)},
            "policy_versions": sorted(turn.versions),
        }

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = session = aiohttp.ClientSession()
            try:  # close it with AReaL's rollout loop; aclose() does it elsewhere
                from areal.infra.utils.concurrent import register_loop_cleanup

                register_loop_cleanup(session.close)
            except Exception:
                pass
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


# An over-long prompt, on the wire: OpenAI's answer to a request that exceeds the model's context (a 400 whose
# error ``code`` is "context_length_exceeded"). It ends the episode as the policy's (docs/protocols.md §3): the
# agent ends the run there (ours: ``run_end`` with ``failure: "policy"``), the workflow evaluates it and trains
# the turns before it whatever the agent reports, and the overflowing turn is never generated or recorded.
OVERFLOW = "context_length_exceeded"


class Hold:
    """One held model call (``PolicyEndpoint.hold``): ``arrived`` is awaited by whoever forks (the call came
    and waits), ``release`` lets it generate."""

    def __init__(self, turn: int, after_sampling: bool = False) -> None:
        self.turn = turn
        self.after_sampling = after_sampling   # held with its turn sampled, before the answer goes out
        self.sampled: Turn | None = None       # that turn, once the call arrived (after_sampling)
        self._arrived, self._released = asyncio.Event(), asyncio.Event()

    async def arrived(self, timeout_s: float) -> bool:
        """Whether the held call came within ``timeout_s`` (False: the run ended or stalled before it)."""
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_released(self, sampled: Turn | None = None) -> None:
        self.sampled = sampled
        self._arrived.set()
        await self._released.wait()

    def release(self) -> None:
        self._released.set()


def overflow_answer(reason: str) -> Answer:
    return Answer(400, error_body(400, f"this request exceeds the policy's context: {reason}", code=OVERFLOW))


def prompt_inputs(processor, tokenizer, settings: EndpointSettings, parsed, images: list[DecodedImage], tools=None):
    """A request's parsed messages and decoded images -> the prompt the policy sees and trains on, as the
    endpoint builds it (``prepare_image`` per image, then ``build_prompt``) but without a per-episode cache.
    Used by the SFT demonstrations (``cua_rl.sft``), so they train on the same ids as policy turns."""
    prepared = [prepare_image(processor, d, settings.min_pixels, settings.max_pixels) for d in images]
    return build_prompt(processor, tokenizer, parsed, prepared, tools)


def prompt_from_messages(processor, tokenizer, settings: EndpointSettings, messages, tools=None):
    """``prompt_inputs`` for messages whose images are data URLs (what our agents send), without a server:
    the same parsing, history cut (``max_screenshots_in_history``) and decoding as ``complete``."""
    parsed = parse_messages(messages, settings.max_screenshots_in_history)
    images = [decode_data_url(u, settings.image_limits) for u in parsed.image_urls]
    return prompt_inputs(processor, tokenizer, settings, parsed, images, tools)


_POOL: ThreadPoolExecutor | None = None


def _cpu_pool() -> ThreadPoolExecutor:
    """One pool per process for every endpoint's CPU work, one thread per core (PIL and torch release the
    GIL while they work, so the threads do run in parallel)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)), thread_name_prefix="policy-cpu")
    return _POOL


def vision_token_ids(processor) -> frozenset[int]:
    """Ids of the processor's image/video placeholder and vision start/end tokens (empty without one)."""
    ids = {getattr(processor, f"{name}_token_id", None)
           for name in ("image", "video", "vision_start", "vision_end")} if processor is not None else set()
    return frozenset(i for i in ids if isinstance(i, int) and i >= 0)


class PromptMismatch(RuntimeError):
    """vLLM's prompt ids for a turn differ from the processor's; the message says where."""


def _fresh(messages: list[dict]) -> list[dict]:
    # AReaL's vLLM backend writes the data URLs into the message parts in place: give each try its own copy.
    import copy

    return copy.deepcopy(messages)
