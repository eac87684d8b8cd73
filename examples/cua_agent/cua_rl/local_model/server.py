"""HTTP face of the CPU engine: the subset of AReaL's vLLM server (``areal_vllm_server``) AReaL calls.

Endpoints (response shapes follow vLLM so ``areal.engine.vllm_remote.VLLMBackend`` parses them as is):
  GET  /health, /v1/models, /version
  POST /v1/completions          prompt = token ids (or text); logprobs.tokens = ["token:ID"], token_logprobs
  POST /v1/chat/completions     OpenAI messages with image_url parts; logprobs.content[].token = "token:ID"
  POST /areal_update_weights    {"model_path": dir[, "version": n]} -> loads a HF checkpoint, bumps version
  POST /areal_pause_generation  aborts in-flight requests (finish_reason "abort"), holds new ones
  POST /areal_continue_generation
  POST /areal_set_version       {"version": n} (align with a resumed trainer; AReaL itself never calls it)
Only disk weight updates exist here: the XCCL endpoints answer 400 with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .engine import GenResult, Prompt, TinyEngine
from .messages import chat_to_prompt
from .sampling import BadRequest, SamplingParams

logger = logging.getLogger(__name__)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError" if status == 400 else
                                   "InternalServerError", "code": status}}, status_code=status)


def create_app(engine: TinyEngine, served_model_name: str | None = None) -> FastAPI:
    app = FastAPI(title="cua-model (CPU)")
    name = served_model_name or engine.model_dir
    running = asyncio.Event()
    running.set()
    state: dict[str, Any] = {"running": running}

    async def body_of(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def wait_if_paused() -> None:
        # Like AReaL's vLLM server: requests that arrive while paused wait for continue_generation.
        await state["running"].wait()

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest):
        return _error(400, str(exc))

    @app.get("/health")
    async def health():
        return JSONResponse({})

    @app.get("/version")
    async def version():
        return {"version": engine.version, "weights_path": engine.weights_path, "model_dir": engine.model_dir,
                "paused": not state["running"].is_set(), "running_requests": engine.running,
                "aborted_requests": engine.aborted_total}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "cua-rl",
            "root": engine.model_dir, "parent": None, "max_model_len": engine.max_model_len,
            "version": engine.version}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        params = SamplingParams.from_request(body, chat=False)
        prompt = _completion_prompt(engine, body.get("prompt"))
        await wait_if_paused()
        res = await engine.generate(prompt, params)
        return _completion_response(engine, name, body, params, res)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await body_of(request)
        params = SamplingParams.from_request(body, chat=True)
        prompt = await asyncio.to_thread(
            chat_to_prompt, engine.processor, body.get("messages"), tools=body.get("tools"),
            add_generation_prompt=bool(body.get("add_generation_prompt", True)))
        await wait_if_paused()
        # An aborted chat request returns no tokens: AReaL re-sends the same messages after an abort
        # (it cannot append partial output to a chat request), so partial tokens would be duplicated.
        res = await engine.generate(prompt, params, discard_on_abort=True)
        return _chat_response(engine, name, params, res)

    @app.post("/areal_update_weights")
    async def update_weights(request: Request):
        body = await body_of(request)
        path = body.get("model_path")
        if not path:
            raise BadRequest("'model_path' is required")
        version = await asyncio.to_thread(engine.update_weights, str(path), body.get("version"))
        return {"success": True, "message": f"loaded {path}", "version": version}

    @app.post("/areal_set_version")
    async def set_version(request: Request):
        body = await body_of(request)
        try:
            engine.version = int(body["version"])
        except (KeyError, TypeError, ValueError):
            raise BadRequest("'version' must be an integer") from None
        return {"success": True, "version": engine.version}

    @app.post("/areal_pause_generation")
    async def pause():
        state["running"].clear()
        await asyncio.to_thread(engine.abort_all)
        logger.info("generation paused; in-flight requests aborted")
        return {"success": True, "message": "Generation paused and all requests aborted"}

    @app.post("/areal_continue_generation")
    async def resume():
        state["running"].set()
        logger.info("generation continued")
        return {"success": True, "message": "Generation continued"}

    for path in ("/areal_init_weights_update_group", "/areal_set_update_weight_meta",
                 "/areal_update_weights_xccl", "/v1/load_lora_adapter"):
        app.add_api_route(path, _unsupported, methods=["POST"])
    return app


async def _unsupported(request: Request):
    return _error(400, f"{request.url.path} is not supported by the CPU server: use "
                       "actor.weight_update_mode=disk without LoRA")


def _completion_prompt(engine: TinyEngine, prompt: Any) -> Prompt:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]   # a batch of one
    if isinstance(prompt, str):
        return Prompt(input_ids=engine.tokenizer.encode(prompt, add_special_tokens=False))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return Prompt(input_ids=list(prompt))
    raise BadRequest("'prompt' must be a string or a non-empty list of token ids (one prompt per request)")


def _tok(token_id: int) -> str:
    return f"token:{token_id}"   # vLLM's return_tokens_as_token_ids format; AReaL parses the id back


def _text(engine: TinyEngine, params: SamplingParams, res: GenResult) -> str:
    ids = res.output_ids
    if res.finish_reason == "stop" and isinstance(res.stop_reason, int) and ids and ids[-1] == res.stop_reason:
        ids = ids[:-1]   # vLLM leaves the stop token out of the text (it stays in the ids)
    text = engine.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
    if isinstance(res.stop_reason, str) and res.stop_reason in text:
        text = text[: text.index(res.stop_reason)]
    return text


def _metrics(res: GenResult) -> dict:
    return {"ttft_s": res.first_token_s, "total_s": res.total_s}


def _usage(res: GenResult) -> dict:
    n_in, n_out = len(res.prompt_ids), len(res.output_ids)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def _completion_response(engine, name, body, params: SamplingParams, res: GenResult) -> dict:
    text = _text(engine, params, res)
    logprobs = None
    if params.logprobs is not None:
        pieces = [engine.tokenizer.decode([t]) for t in res.output_ids]
        offsets, pos = [], 0
        for piece in pieces:
            offsets.append(pos)
            pos += len(piece)
        logprobs = {
            "text_offset": offsets,
            "token_logprobs": res.output_logprobs,
            "tokens": [_tok(t) for t in res.output_ids],
            "top_logprobs": [{_tok(k): v for k, v in top.items()} for top in res.top_logprobs],
        }
    prompt_logprobs = None
    if params.prompt_logprobs is not None:
        prompt_logprobs = [None if d is None else {
            str(k): {"logprob": v, "rank": None, "decoded_token": engine.tokenizer.decode([k])}
            for k, v in d.items()} for d in res.prompt_logprobs]
    if body.get("echo"):
        text = engine.tokenizer.decode(res.prompt_ids, skip_special_tokens=False) + text
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": res.finish_reason,
                     "stop_reason": res.stop_reason, "prompt_logprobs": prompt_logprobs,
                     "prompt_token_ids": res.prompt_ids, "token_ids": res.output_ids}],
        "usage": _usage(res), "version": res.version, "metrics": _metrics(res),
    }


def _chat_response(engine, name, params: SamplingParams, res: GenResult) -> dict:
    logprobs = None
    if params.logprobs is not None:
        logprobs = {"content": [
            {"token": _tok(t), "logprob": lp, "bytes": None,
             "top_logprobs": [{"token": _tok(k), "logprob": v, "bytes": None}
                              for k, v in sorted(top.items(), key=lambda kv: -kv[1])[: params.logprobs]]}
            for t, lp, top in zip(res.output_ids, res.output_logprobs, res.top_logprobs)]}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": _text(engine, params, res),
                                             "tool_calls": []},
                     "logprobs": logprobs, "finish_reason": res.finish_reason, "stop_reason": res.stop_reason,
                     "token_ids": res.output_ids}],
        "prompt_token_ids": res.prompt_ids, "usage": _usage(res), "version": res.version,
        "metrics": _metrics(res),
    }
