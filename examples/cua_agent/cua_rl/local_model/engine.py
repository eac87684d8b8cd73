"""The CPU generation engine: one model, one worker thread, requests stepped round-robin.

Why this shape: a single thread owns the model, so requests never touch it concurrently; stepping every
active request by one token per round keeps short requests from waiting behind long ones (a simple,
unbatched form of continuous batching). Pause and weight updates abort in-flight requests between steps,
as AReaL's vLLM server does. Each request keeps its own KV cache and its own 3-D (M-RoPE) positions, so
no per-model state (like HF's cached ``rope_deltas``) leaks between requests.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .sampling import BadRequest, SamplingParams, sample_token, scaled_logprobs

logger = logging.getLogger(__name__)


@dataclass
class Prompt:
    """What the model sees: token ids plus, for image prompts, the processor's pixel tensors."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@dataclass
class GenResult:
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    top_logprobs: list[dict[int, float]]           # per output token; empty dicts when not requested
    prompt_logprobs: list[dict[int, float] | None]  # per prompt token (first is None); [] when not requested
    finish_reason: str                             # stop | length | abort
    stop_reason: int | str | None
    version: int
    first_token_s: float | None = None   # from admission to the first sampled token (queueing + prefill)
    total_s: float = 0.0


@dataclass(eq=False)   # identity semantics: requests are compared with `in` lists; fields hold tensors
class _Request:
    prompt: Prompt
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    discard_on_abort: bool
    epoch: int                       # abort epoch at submission; an abort_all() after it aborts this request
    aborted: bool = False
    started: float = field(default_factory=time.perf_counter)
    # decoding state
    past: Any = None
    next_pos: int = 0                # next text position (after M-RoPE deltas)
    logp: torch.Tensor | None = None  # temperature-scaled logprobs of the next token
    out_ids: list[int] = field(default_factory=list)
    out_lps: list[float] = field(default_factory=list)
    out_top: list[dict[int, float]] = field(default_factory=list)
    prompt_lps: list = field(default_factory=list)
    gen: torch.Generator | None = None
    first_token_s: float | None = None


class TinyEngine:
    """Owns model + processor; ``submit`` is awaited from the event loop, work happens on one thread."""

    def __init__(self, model_dir: str | Path, *, max_model_len: int = 8192, threads: int | None = None):
        from transformers import AutoProcessor

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = str(model_dir)
        self.processor = AutoProcessor.from_pretrained(self.model_dir)
        self.tokenizer = self.processor.tokenizer
        self.model = self._load(self.model_dir)
        self.max_model_len = max_model_len
        self.version = 0
        self.weights_path = self.model_dir
        cfg = self.model.config
        self.image_token_id = cfg.image_token_id
        self.vocab_size = cfg.text_config.vocab_size
        placeholders = [cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id,
                         cfg.vision_end_token_id, self.tokenizer.convert_tokens_to_ids("<|vision_pad|>")]
        self.never_sample = torch.tensor(sorted({t for t in placeholders if isinstance(t, int) and t >= 0}))
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._active: list[_Request] = []
        self._model_lock = threading.Lock()   # held for every model step and for weight swaps
        self._abort_epoch = 0
        self.aborted_total = 0                 # requests finished with 'abort' since start (observability)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tiny-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ lifecycle
    @staticmethod
    def _load(path: str):
        from transformers import AutoModelForImageTextToText

        model, info = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch.float32, output_loading_info=True)
        missing = [k for k in info.get("missing_keys", []) if k]
        if missing:
            raise BadRequest(f"checkpoint at {path} lacks weights: {missing[:5]}...")
        return model.eval()

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)  # type: ignore[arg-type]  # wake the worker
        self._thread.join(10)

    # ------------------------------------------------------------------ public API (event loop side)
    async def generate(self, prompt: Prompt, params: SamplingParams, *, discard_on_abort: bool = False) -> GenResult:
        if not prompt.input_ids:
            raise BadRequest("the prompt is empty")
        bad = [t for t in prompt.input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        n_img_tokens = sum(1 for t in prompt.input_ids if t == self.image_token_id)
        if n_img_tokens and prompt.pixel_values is None:
            raise BadRequest(
                f"the prompt holds {n_img_tokens} image tokens but no images; send image prompts to "
                "/v1/chat/completions (image_url parts), which runs the model's processor")
        if len(prompt.input_ids) >= self.max_model_len:
            raise BadRequest(f"prompt of {len(prompt.input_ids)} tokens exceeds max_model_len {self.max_model_len}")
        loop = asyncio.get_running_loop()
        req = _Request(prompt=prompt, params=params, future=loop.create_future(), loop=loop,
                       discard_on_abort=discard_on_abort, epoch=self._abort_epoch)
        self._queue.put(req)
        try:
            return await req.future
        except asyncio.CancelledError:
            req.aborted = True   # client went away: stop spending CPU on it
            raise

    @property
    def running(self) -> int:
        """Requests admitted or queued and not finished."""
        return len(self._active) + self._queue.qsize()

    def abort_all(self) -> None:
        """Abort every queued and running request (they finish with finish_reason 'abort')."""
        with self._model_lock:
            self._abort_locked()

    def _abort_locked(self) -> None:
        self._abort_epoch += 1
        pending, stopping = [], False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stopping = True          # close()'s wake-up sentinel: keep it for the worker
            else:
                pending.append(item)
        if stopping:
            self._queue.put(None)  # type: ignore[arg-type]
        for req in self._active + pending:
            req.aborted = True
            self._finish(req, "abort", None)
        self._active.clear()

    def update_weights(self, path: str, version: int | None = None) -> int:
        """Load weights from a HF checkpoint directory; aborts in-flight requests first, like vLLM.

        The new version is ``version`` if given, else the ``_v{N}`` suffix AReaL puts on the directory,
        else the old version + 1.
        """
        if not Path(path).is_dir():
            raise BadRequest(f"model_path {path!r} is not a directory")
        new_model = self._load(path)   # outside the lock: generation keeps going while we read the disk
        with self._model_lock:         # abort and swap atomically: no step runs on a half-updated state
            self._abort_locked()
            self.model = new_model
            self.version = _version_of(path, self.version + 1) if version is None else int(version)
            self.weights_path = str(path)
        logger.info("loaded weights from %s; version %d", path, self.version)
        return self.version

    # ------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            try:
                self._admit(block=not self._active)
                if self._stop.is_set():
                    break
                for req in list(self._active):
                    self._advance(req)
            except Exception:   # never let the worker die silently: fail what is active, keep serving
                logger.exception("engine loop error")
                with self._model_lock:
                    for req in self._active:
                        self._fail(req, RuntimeError("engine loop error"))
                    self._active.clear()

    def _admit(self, block: bool) -> None:
        """Move queued requests into the active set (waiting for one when idle)."""
        try:
            while True:
                item = self._queue.get(block=block)
                block = False
                if item is None:
                    return
                self._active.append(item)
        except queue.Empty:
            return

    def _advance(self, req: _Request) -> None:
        with self._model_lock:
            if req not in self._active:       # aborted while we waited for the lock
                return
            if req.aborted or req.epoch < self._abort_epoch:
                self._active.remove(req)
                self._finish(req, "abort", None)
                return
            try:
                done = self._step(req)
            except Exception as exc:  # a bad request must not take the others down
                logger.exception("generation failed")
                self._active.remove(req)
                self._fail(req, exc)
                return
            if done:
                self._active.remove(req)

    def _positions(self, ids: torch.Tensor, grid: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """3-D M-RoPE positions of the prompt (as HF's get_rope_index) and the next text position."""
        if grid is None:
            pos = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
            return pos, ids.shape[1]
        mm = (ids == self.image_token_id).long()
        pos, delta = self.model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid)
        return pos, int(ids.shape[1] + delta.view(-1)[0])

    def _step(self, req: _Request) -> bool:
        """Advance ``req`` by one token (prefill on the first call). Returns True when finished."""
        p = req.params
        if req.past is None:
            ids = torch.tensor([req.prompt.input_ids], dtype=torch.long)
            pos, req.next_pos = self._positions(ids, req.prompt.image_grid_thw)
            out = self.model(input_ids=ids, position_ids=pos, pixel_values=req.prompt.pixel_values,
                             image_grid_thw=req.prompt.image_grid_thw, use_cache=True)
            req.past = out.past_key_values
            if p.prompt_logprobs is not None:
                lps = scaled_logprobs(out.logits[0, :-1], p.temperature)
                req.prompt_lps = [None] + [self._top(lps[i], ids[0, i + 1].item(), p.prompt_logprobs)
                                           for i in range(ids.shape[1] - 1)]
            req.gen = torch.Generator().manual_seed(
                p.seed if p.seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
            logits = out.logits[0, -1]
        else:
            tok = torch.tensor([[req.out_ids[-1]]], dtype=torch.long)
            pos = torch.full((3, 1, 1), req.next_pos, dtype=torch.long)
            req.next_pos += 1
            out = self.model(input_ids=tok, position_ids=pos, past_key_values=req.past, use_cache=True)
            req.past = out.past_key_values
            logits = out.logits[0, -1]
        budget = p.max_tokens if p.max_tokens >= 0 else self.max_model_len
        budget = min(budget, self.max_model_len - len(req.prompt.input_ids))
        if len(req.out_ids) >= budget:   # max_tokens == 0 (scoring) or context full
            self._finish(req, "length", None)
            return True
        logp = scaled_logprobs(logits, p.temperature)
        token = sample_token(logp, p, req.gen, self.never_sample)
        if req.first_token_s is None:
            req.first_token_s = time.perf_counter() - req.started
        req.out_ids.append(token)
        req.out_lps.append(float(logp[token]))
        req.out_top.append(self._top(logp, token, p.logprobs) if p.logprobs is not None else {})
        if token in p.stop_token_ids:
            self._finish(req, "stop", token)
            return True
        if not p.ignore_eos and token in self.eos_ids:
            self._finish(req, "stop", None)
            return True
        if p.stop:
            text = self.tokenizer.decode(req.out_ids, skip_special_tokens=p.skip_special_tokens)
            hit = next((s for s in p.stop if s and s in text), None)
            if hit is not None:
                self._finish(req, "stop", hit)
                return True
        if len(req.out_ids) >= budget:
            self._finish(req, "length", None)
            return True
        return False

    @staticmethod
    def _top(logp: torch.Tensor, token: int, n: int | None) -> dict[int, float]:
        """The chosen token first (AReaL reads the first entry), then the n most likely ones."""
        top = {int(token): float(logp[token])}
        if n:
            vals, idx = torch.topk(logp, n)
            for v, i in zip(vals.tolist(), idx.tolist()):
                top.setdefault(int(i), float(v))
        return top

    def _finish(self, req: _Request, reason: str, stop_reason) -> None:
        keep = not (reason == "abort" and req.discard_on_abort)
        if reason == "abort":
            self.aborted_total += 1
        result = GenResult(
            prompt_ids=list(req.prompt.input_ids),
            output_ids=list(req.out_ids) if keep else [],
            output_logprobs=list(req.out_lps) if keep else [],
            top_logprobs=list(req.out_top) if keep else [],
            prompt_logprobs=list(req.prompt_lps),
            finish_reason=reason, stop_reason=stop_reason, version=self.version,
            first_token_s=req.first_token_s, total_s=time.perf_counter() - req.started,
        )
        req.past = None
        _deliver(req.loop, _set_result, req.future, result)

    def _fail(self, req: _Request, exc: Exception) -> None:
        req.past = None
        _deliver(req.loop, _set_exception, req.future, exc)


def _version_of(path: str, default: int) -> int:
    """AReaL names disk updates ``.../weight_update_v{version}`` (WeightUpdateMeta.with_version)."""
    m = re.search(r"_v(\d+)/*$", str(path))
    return int(m.group(1)) if m else default


def _deliver(loop: asyncio.AbstractEventLoop, fn, fut: asyncio.Future, value) -> None:
    try:
        loop.call_soon_threadsafe(fn, fut, value)
    except RuntimeError:   # the caller's event loop is gone (server shutting down): nobody to tell
        pass


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)
