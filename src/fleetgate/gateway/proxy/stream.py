"""Streaming relay: commit on the first frame, forward frames, end every stream well.

``open_stream`` reads up to the first data frame before anything reaches the client: an
in-band error there (SGLang reports a full queue as HTTP 200 + an SSE error frame) is a
retryable failure of this attempt, not of the request. After that the stream is committed:
frames go out as they come (the model name rewritten, the usage chunk dropped if the client
did not ask for it). A stream ended well is one whose API end marker (``[DONE]``,
``response.completed``, ``message_stop``) arrived.

**What is not SSE is not relayed** (issue 24): every frame goes through ``sse.checked``;
lines that are not SSE (garbage bytes, an HTML page) and data that is not JSON
(``data: {broken json``) are dropped, with one warning per stream naming the endpoint and
showing the first such bytes. A stream whose only answer is such bytes ends like a stream
that broke: before its first valid data frame, a retryable 502 (another endpoint is tried);
after it, without its end marker, the error event and ``[DONE]`` (or a resume). A frame
over ``sse.MAX_FRAME_BYTES`` is a broken stream the same way.

**Mid-stream resume (migration).** When a chat or completions stream breaks after its first
byte (the engine died, the connection broke, the stream ended without ``[DONE]``) and the
policy allows it (``resume_streams``, on by default), the generation continues on the next
candidate endpoint of the request's decision, stitched into the same SSE stream:

* the continuation request is the original one with the text relayed so far as an assistant
  prefix (chat: a final assistant message with ``continue_final_message: true`` and
  ``add_generation_prompt: false``, which vLLM takes as is and SGLang reads as "continue the
  final assistant message") or appended to the prompt (completions), and ``max_tokens`` /
  ``max_completion_tokens`` / ``min_tokens`` reduced by the tokens already relayed;
* its chunks get the original stream's ``id``, ``created`` and ``model``; its role-only
  first delta is dropped (the client has had one); its usage is rewritten to the true
  totals: prompt = the continuation's prompt minus the tokens of the prefix (the original
  prompt's count when the original stream reported one), completion = the tokens relayed
  before + the continuation's own; exactly one usage chunk (if the client asked for usage),
  then ``[DONE]``; no error event;
* tokens relayed are counted as the chunks that carried output (one token each on both
  engines' streams), or the engine's running count where it sent continuous usage;
* the broken attempt counts as a failure of its endpoint (breaker); the continuation is a
  new attempt, in the decision log with ``"migrated": true`` and ``after_tokens``.

Not resumed (the old behaviour: an error event in the API's shape, then ``[DONE]`` for
chat/completions): Responses and Messages streams, ``n`` > 1, ``echo`` / ``suffix`` /
``best_of``, token-id prompts, structured output (a grammar cannot restart mid-way), a
partial answer holding tool calls or reasoning, and no candidate left (``max_attempts``
tries per migration). When the original ended exactly at its limit or finish (only the
usage or ``[DONE]`` was lost), the gateway ends the stream itself without a continuation.

May touch: backends (SSE, relay response), starlette responses. Must not touch: routing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from fleetgate.backends.relay import UpstreamError, UpstreamResponse
from fleetgate.backends.sse import (
    DONE,
    DONE_FRAME,
    SSEFramer,
    StreamError,
    checked,
    is_usage_only_chunk,
    stream_error,
)
from fleetgate.gateway.errors import envelope, json_error
from fleetgate.gateway.proxy.apis import Api
from fleetgate.gateway.proxy.attempt import Attempt
from fleetgate.gateway.proxy.client import SSEResponse
from fleetgate.gateway.proxy.observer import RequestObserver
from fleetgate.gateway.proxy.outcome import (
    RETRYABLE_STATUS,
    RetryableFailure,
    transport_failure,
    transport_status,
)
from fleetgate.gateway.proxy.resume import (
    Leg,
    NotResumable,
    Opened,
    Resume,
    continuation_body,
    drop_role,
    max_tokens,
    request_refusal,
)

if TYPE_CHECKING:
    from fleetgate.gateway.proxy.service import Exchange

log = logging.getLogger("fleetgate.stream")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
async def read_opening(resp: UpstreamResponse, attempt: Attempt
                       ) -> tuple[SSEFramer, AsyncIterator[bytes], list[bytes],
                                  StreamError | None]:
    """Read up to the first data frame; a retryable in-band error or a stream that broke
    before it is a ``RetryableFailure``; another in-band error is returned (resp closed)."""
    framer = SSEFramer()
    chunks = resp.chunks()
    first: list[bytes] = []
    data: bytes | None = None
    try:
        while data is None:
            frames = framer.feed(await anext(chunks))
            first.extend(frames)
            data = next((got[1] for got in map(checked, frames)
                         if got is not None and got[1] is not None), None)
    except StopAsyncIteration:
        resp.close()
        raise RetryableFailure(502, f"{attempt.ep.id}: the stream ended before its first "
                                    f"frame ({resp.content_type or 'no content-type'}, "
                                    f"{resp.received} bytes, none of them an SSE data frame)"
                               ) from None
    except UpstreamError as exc:
        resp.close()
        raise transport_failure(exc, attempt.ep.id) from None
    err = stream_error(data)
    if err is not None:
        resp.close()
        if err.status in RETRYABLE_STATUS:
            raise RetryableFailure(err.status,
                                   f"{attempt.ep.id}: in-band {err.status}: {err.message}")
    return framer, chunks, first, err


async def open_stream(resp: UpstreamResponse, ex: Exchange, attempt: Attempt,
                      rewrite: Callable[[bytes], bytes], headers: dict[str, str]) -> Response:
    framer, chunks, first, err = await read_opening(resp, attempt)
    if err is not None:
        attempt.failed(err.status, err.message, counts_against_engine=err.status >= 500)
        return json_error(err.status, envelope(err.status, err.message, type_=err.type),
                          headers)
    resume = None
    if ex.resumer is not None:
        tried = {str(a.get("endpoint")) for a in ex.entry.attempts} | {attempt.ep.id}
        resume = Resume(ex.req.body, ex.resumer, ex.entry.attempts,
                        ex.req.routing.prompt_tokens_estimate, tried)
    relay = StreamRelay(ex.req.api, ex.req.client_wants_usage, rewrite, attempt, resume)
    body = relay.run(first, framer, chunks, resp, ex.obs)
    response = SSEResponse(body, headers={**headers, **SSE_HEADERS},
                           media_type="text/event-stream; charset=utf-8")
    response.on_close = relay.abandon_unstarted(resp, ex.obs)
    return response


async def open_continuation(resp: UpstreamResponse, attempt: Attempt) -> Opened:
    """Open a continuation's stream (its HTTP status was 200): up to its first data frame."""
    framer, chunks, first, err = await read_opening(resp, attempt)
    if err is not None:
        attempt.failed(err.status, err.message, counts_against_engine=err.status >= 500)
        raise NotResumable(err.status, f"{attempt.ep.id}: in-band {err.status}: {err.message}")
    return Opened(attempt, resp, framer, chunks, first)


class StreamRelay:
    """Forwards frames, rewrites the model, drops unrequested usage, ends every stream well,
    and continues a broken chat/completions stream elsewhere when ``resume`` is given."""

    def __init__(self, api: Api, client_wants_usage: bool, rewrite: Callable[[bytes], bytes],
                 attempt: Attempt, resume: Resume | None = None) -> None:
        self.api = api
        self.wants_usage = client_wants_usage
        self.rewrite = rewrite
        self.attempt = attempt
        self.usage: dict[str, int] | None = None
        self.done = False
        self.started = False
        self.first_token_seen = False
        # end events other than ``data: [DONE]`` (Responses, Messages), looked for in the data
        self.end_events = tuple(m for m in api.end_markers if not m.startswith(b"data: "))
        self.resume = resume if api.resumes else None
        self.cur = Leg()  # what the current leg relayed (noted only when resuming)
        # what the legs before this one relayed (a continuation leg is rewritten with it)
        self.continuing = False
        self.text: list[str] = []
        self.prefix_tokens = 0
        self.prompt_tokens: int | None = None  # the original prompt's count, when reported
        self.ident: dict[str, Any] = {}
        self.usage_relayed = False
        self.billed: dict[str, int] | None = None  # the stitched usage, for the observers
        self.dropped = 0  # bytes of the engine's stream that were not SSE (module doc)

    def abandon_unstarted(self, resp: UpstreamResponse,
                          obs: RequestObserver) -> Callable[[], None]:
        """Cleanup for a client that left before the body began (``run`` never ran)."""

        def close() -> None:
            if not self.started:
                resp.close()
                self.attempt.cancelled()
                obs.end(499, "client disconnected")

        return close

    def transform(self, frames: list[bytes]) -> bytes:
        if self.continuing:
            return self._transform_continued(frames)
        out = []
        for frame in frames:
            if frame.startswith(b"data: {") and frame.endswith(b"}\n\n") and \
                    frame.count(b"\n") == 2:  # the common frame, checked inline
                data: bytes | None = frame[6:-2]
            else:
                got = checked(frame)
                if got is None or got[0] is not frame:
                    self._drop(frame)
                    if got is None:
                        continue
                    frame = got[0]
                data = got[1]
            if data is None:
                out.append(frame)  # comment / keep-alive
                continue
            if self.resume is not None:
                self._note(data)
            if not self.first_token_seen:
                self._maybe_first_token(data)
            if data == DONE:
                self.done = True
                out.append(frame)
                continue
            if self.end_events and not self.done:
                self.done = any(marker in data for marker in self.end_events)
            if b'"usage"' in data and b'"usage":null' not in data:
                self.usage = self.api.stream_usage(data, self.usage)
                if self.wants_usage or not self.api.asks_usage or not is_usage_only_chunk(data):
                    out.append(self.rewrite(frame))
                    if self.resume is not None and self.wants_usage:
                        self.usage_relayed = self.usage_relayed or is_usage_only_chunk(data)
            else:
                out.append(self.rewrite(frame))
        return b"".join(out)

    def _drop(self, frame: bytes) -> None:
        """A frame (or lines of one) that is not SSE: dropped, one warning per stream."""
        if not self.dropped:
            log.warning("stream from %s: dropped bytes that are not SSE: %r",
                        self.attempt.ep.id, frame[:120])
        self.dropped += len(frame)

    def _maybe_first_token(self, data: bytes) -> None:
        if self.api.output_marker is None or self.api.output_marker in data:
            self.first_token_seen = True
            self.attempt.first_token()

    async def run(self, first: list[bytes], framer: SSEFramer, chunks: AsyncIterator[bytes],
                  resp: UpstreamResponse, obs: RequestObserver) -> AsyncIterator[bytes]:
        status, error = 499, "client disconnected"
        self.started = True
        pending = first
        try:
            while True:
                try:
                    out = self.transform(pending)
                    if out:
                        yield out
                    async for chunk in chunks:
                        out = self.transform(framer.feed(chunk))
                        if out:
                            yield out
                    if self.done:
                        status, error = 200, ""
                        self.attempt.finished(
                            self.usage, billed=self.billed,
                            migrated_after=self.prefix_tokens if self.continuing else None)
                        break
                    status, error = 502, "upstream stream ended without its end marker"
                except UpstreamError as exc:
                    log.warning("stream from %s broke mid-way: %s", self.attempt.ep.id, exc)
                    status, error = transport_status(exc), f"upstream failed: {exc}"
                if self.resume is None:
                    self.attempt.failed(status, error)
                    yield self.api.error_frame(status, error)
                    break
                failure = status, error
                status, error = 499, "client disconnected"  # until the migration settles
                outcome = await self._migrate(*failure)
                if isinstance(outcome, Opened):
                    resp.close()
                    resp, framer, chunks = outcome.resp, outcome.framer, outcome.chunks
                    pending = outcome.first
                    continue
                if outcome is not None:  # the answer was complete: end it here
                    yield outcome
                    status, error = 200, ""
                    break
                status, error = failure
                yield self.api.error_frame(status, error)
                break
        finally:
            resp.close()
            self.attempt.cancelled()  # no-op unless the client went away mid-stream
            obs.end(status, error or None)

    # --- migration -------------------------------------------------------------------------

    async def _migrate(self, status: int, error: str) -> Opened | bytes | None:
        """The current leg broke: continue elsewhere (an open stream), end the answer here
        (its last bytes), or give up (None: the caller writes the error event)."""
        resume = self.resume
        assert resume is not None
        leg = self.cur
        self._read_back(leg)
        leg.tokens = max(leg.tokens, leg.counted)
        self.attempt.failed(status, error)
        record = next((a for a in reversed(resume.attempts)
                       if a.get("endpoint") == self.attempt.ep.id), None)
        if record is not None:
            record.update(status=status, error=error)
        refusal = leg.refusal or request_refusal(self.api.name, resume.body)
        if refusal is not None:
            log.warning("stream from %s broke after %d tokens; not resumed: %s",
                        self.attempt.ep.id, self.prefix_tokens + leg.tokens, refusal)
            return None
        if not self.ident and leg.ident is not None:
            self.ident = leg.ident
        if self.prefix_tokens == 0 and not self.continuing and leg.usage is not None:
            prompt = leg.usage.get("prompt_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) and prompt > 0 else None
        self.text.extend(leg.text)
        self.prefix_tokens += leg.tokens
        limit = max_tokens(self.api.name, resume.body)
        if leg.finish is not None or (limit is not None and self.prefix_tokens >= limit):
            return self._end_here(leg.finish, resume)
        body = continuation_body(self.api.name, resume.body, "".join(self.text),
                                 self.prefix_tokens)
        log.warning("stream from %s broke after %d tokens (%s); resuming elsewhere",
                    self.attempt.ep.id, self.prefix_tokens, error)
        opened = await resume.resumer(body, resume.tried, self.prefix_tokens)
        if opened is None:
            return None
        if record is not None:
            record["migrated"] = True
        self.attempt = opened.attempt
        self.continuing = True
        self.first_token_seen = False
        self.usage = None
        self.done = False
        self.cur = Leg()
        return opened

    def _note(self, data: bytes) -> None:
        """Keep one data payload of the first leg; it is read (``_read_back``) only if the
        leg breaks, so a stream that ends well never pays for parsing its chunks."""
        self.cur.raw.append(data)

    def _read_back(self, leg: Leg) -> None:
        """Read the first leg's kept payloads into what a migration needs."""
        raw, leg.raw = leg.raw, []
        for data in raw:
            if leg.refusal is not None:
                return
            if data == DONE:
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                self._note_obj(obj, data)

    def _note_obj(self, obj: dict[str, Any], data: bytes) -> None:
        leg = self.cur
        if leg.refusal is not None or "error" in obj:
            return
        if leg.ident is None and "id" in obj:
            if not self.continuing:  # the ids the client saw: after the model rewrite
                seen = orjson.loads(self.rewrite(data))
                obj = seen if isinstance(seen, dict) else obj
            leg.ident = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if isinstance(usage, dict):
            leg.usage = usage
            counted = usage.get("completion_tokens")
            if isinstance(counted, int):
                leg.counted = counted  # continuous usage: the engine's own count
        chat = self.api.name == "chat"
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                leg.refusal = "several choices"
                return
            if chat:
                delta = choice.get("delta") or {}
                if delta.get("tool_calls") or delta.get("function_call") or \
                        delta.get("reasoning_content") or delta.get("reasoning"):
                    leg.refusal = "the answer holds tool calls or reasoning"
                    return
                piece = delta.get("content")
            else:
                piece = choice.get("text")
            if isinstance(piece, str) and piece:
                leg.text.append(piece)
                leg.tokens += 1
            if choice.get("finish_reason"):
                leg.finish = str(choice["finish_reason"])

    def _end_here(self, finish: str | None, resume: Resume) -> bytes:
        """The answer was complete but for its finish chunk, usage or ``[DONE]``."""
        out = []
        ident = {"id": "", "created": 0, "model": "", **self.ident}
        if finish is None:
            if self.api.name == "chat":
                choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None,
                                          "finish_reason": "length"}
                obj = {**ident, "object": "chat.completion.chunk", "choices": [choice]}
            else:
                choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
                obj = {**ident, "object": "text_completion", "choices": [choice]}
            out.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        if self.wants_usage and not self.usage_relayed:
            prompt = self.prompt_tokens if self.prompt_tokens is not None \
                else resume.prompt_estimate
            usage = {"prompt_tokens": prompt, "completion_tokens": self.prefix_tokens,
                     "total_tokens": prompt + self.prefix_tokens}
            kind = "chat.completion.chunk" if self.api.name == "chat" else "text_completion"
            out.append(b"data: " + orjson.dumps({**ident, "object": kind, "choices": [],
                                                 "usage": usage}) + b"\n\n")
        out.append(DONE_FRAME)
        return b"".join(out)

    def _transform_continued(self, frames: list[bytes]) -> bytes:
        """A continuation's frames: the original ids, no second role, the true usage."""
        out = []
        chat = self.api.name == "chat"
        for frame in frames:
            got = checked(frame)
            if got is None:
                self._drop(frame)
                continue
            frame, data = got
            if data is None:
                out.append(frame)
                continue
            if not self.first_token_seen:
                self._maybe_first_token(data)
            if data == DONE:
                self.done = True
                out.append(frame)
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                self._drop(frame)
                continue
            if not isinstance(obj, dict) or "error" in obj:
                out.append(self.rewrite(frame))
                continue
            self._note_obj(obj, data)
            choices = obj.get("choices")
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.usage = self.api.usage(usage)
                obj["usage"] = self._stitched(usage)
                self.billed = self.api.usage(obj["usage"])
                if not choices:
                    if not self.wants_usage or self.usage_relayed:
                        continue  # a usage-only chunk the client did not ask for
                    self.usage_relayed = True
            obj.update(self.ident)
            if chat and isinstance(choices, list) and drop_role(choices) and usage is None:
                continue  # the continuation's role-only opening
            out.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        return b"".join(out)

    def _stitched(self, usage: dict[str, Any]) -> dict[str, Any]:
        """A continuation's usage as the whole answer's: the original prompt, all tokens."""
        own_prompt = usage.get("prompt_tokens")
        own_completion = usage.get("completion_tokens")
        completion = self.prefix_tokens + (own_completion if isinstance(own_completion, int)
                                           else 0)
        if self.prompt_tokens is not None:
            prompt = self.prompt_tokens
        else:  # the continuation's prompt is the original's plus the prefix's tokens
            prompt = max(0, (own_prompt if isinstance(own_prompt, int) else 0)
                         - self.prefix_tokens)
        return {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}
