"""Live load against an OpenAI-compatible server: arrival schedules, a streaming client, latency metrics.

Used by `vspec bench --driver serve`. Why not vLLM's own client (`vllm bench serve`): it ramps the
rate only upward (it refuses a start rate above the end rate), so the rise-then-fall ramp that shows
K following the load both ways cannot be expressed; and each invocation is a new process that
imports vLLM (about 10 s here) while a serve bench runs dozens of short loads. The metrics follow
vLLM's definitions, so the numbers read the same:

- TTFT: request sent -> first streamed content; ITL: gaps between streamed chunks (a chunk may carry
  several tokens under speculation, as in vLLM's client); TPOT: (latency - TTFT) / (tokens - 1) per
  request; output tok/s: output tokens of the load / (last completion - first send).

Arrivals: a gamma process (shape = burstiness, 1 = Poisson) at a constant rate, or a ramp that rises
linearly from a low rate to a peak at half time and falls back (Poisson thinning). Each schedule is
drawn from a seed, so every policy of a bench round gets the same arrival times and prompts.

Closed-loop loads (``clients``, as ``vllm bench serve --max-concurrency``): a fixed number of clients,
each sending its next request as soon as its answer is complete, for ``duration_s`` seconds; answers in
flight then are waited for. The clients start one after another over the first quarter of that time.
The server's batch stays near the number of clients, refilled as requests finish, which is the
steady state of a busy server at that concurrency. Every policy of a round gets the same prompts in
the same order (a faster one gets further down the list). Its output tok/s counts the tokens streamed
while the clients were sending (each chunk carries its running token count:
``continuous_usage_stats``) over those ``duration_s`` seconds, not over the makespan: the answers
still running at the end drain in an emptying batch, and whether a client's last request started just
before the end or just after moved a makespan rate by 10-20% from round to round (40 against 48
answers of 64 tokens at 8 clients in 20 s).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

MIN_REQUESTS = 3
# A closed-loop schedule is written out in advance: at most this many requests per client and second,
# far above what a server answers (a 48-token answer takes about a second on this CPU).
CLOSED_LOOP_MAX_PER_CLIENT_S = 20
# Closed-loop clients start one after another over this share of the load's duration. Started together,
# with answers of one length (chat answers run to max_tokens), target-only's requests finish in the
# same step and the next eight prefill together, one cheap step, while speculation's drift apart and
# each pays a mixed prefill step of its own: a lockstep no server with its own arrivals sees (chat at 8
# clients, started together: admission steps took 10.6% of K=0's time and 15.1% of K=1's).
CLOSED_LOOP_STAGGER_SHARE = 0.25
RAMP_LOW_SHARE = 0.1  # a ramp starts and ends at this share of its peak rate
REQUEST_TIMEOUT_S = 600


@dataclass(frozen=True)
class Arrival:
    at_s: float  # seconds after the load starts
    prompt: str
    index: int  # position in the schedule: pairs requests across policies
    max_tokens: Optional[int] = None  # this request's own limit (the bench's warm-up drain); None: the load's


@dataclass(frozen=True)
class LoadShape:
    kind: str  # "rate" (constant), "ramp" (rise to peak, fall back) or "clients" (closed loop)
    rate: float  # requests per second: the constant rate, or the ramp's peak; 0 for a closed loop
    duration_s: float
    burstiness: float = 1.0
    clients: int = 0  # closed loop: this many clients, each with one request in flight

    @property
    def label(self) -> str:
        if self.kind == "clients":
            return f"{self.clients} clients"
        return f"{self.rate:g} req/s" if self.kind == "rate" else f"ramp to {self.rate:g} req/s"

    @property
    def window_s(self) -> Optional[float]:
        """Seconds over which output tok/s is counted: a closed loop's sending time; None (the makespan)
        for open-loop arrivals, whose rate below capacity is the arrivals' and whose queue must drain."""
        return self.duration_s if self.kind == "clients" else None

    def rate_at(self, t: float) -> float:
        if self.kind == "rate":
            return self.rate
        low = self.rate * RAMP_LOW_SHARE
        half = self.duration_s / 2
        share = t / half if t <= half else max(0.0, (self.duration_s - t) / half)
        return low + (self.rate - low) * share


def arrivals(shape: LoadShape, prompts: list[str], seed: int) -> list[Arrival]:
    """The load's requests: arrival times within ``duration_s`` (at least MIN_REQUESTS) and prompts."""
    rng = random.Random(seed)
    if shape.kind == "clients":  # sent as answers come back: no times, only the order
        count = shape.clients * math.ceil(shape.duration_s * CLOSED_LOOP_MAX_PER_CLIENT_S)
        return [Arrival(0.0, prompts[rng.randrange(len(prompts))], i) for i in range(count)]
    times = _ramp_times(shape, rng) if shape.kind == "ramp" else _gamma_times(shape, rng)
    return [Arrival(round(t, 4), prompts[rng.randrange(len(prompts))], i) for i, t in enumerate(times)]


def _gamma_times(shape: LoadShape, rng: random.Random) -> list[float]:
    times, t = [], 0.0
    while t < shape.duration_s or len(times) < MIN_REQUESTS:
        times.append(t)
        t += rng.gammavariate(shape.burstiness, 1.0 / (shape.rate * shape.burstiness))
    return times


def _ramp_times(shape: LoadShape, rng: random.Random) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning a Poisson process at the peak rate."""
    times, t = [], 0.0
    while t < shape.duration_s:
        t += rng.expovariate(shape.rate)
        if t < shape.duration_s and rng.random() < shape.rate_at(t) / shape.rate:
            times.append(t)
    return times or [0.0]


@dataclass
class RequestRecord:
    index: int
    sent_at: float  # perf_counter, comparable with the engine's trace times on this machine
    ok: bool = False
    first_at: Optional[float] = None
    done_at: Optional[float] = None
    output_tokens: int = 0
    chunk_gaps: list[float] = field(default_factory=list)
    text: str = ""
    error: Optional[str] = None
    # (perf_counter, tokens so far) at each chunk that added tokens: a closed loop's window count.
    progress: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_at is None else self.first_at - self.sent_at

    @property
    def tpot(self) -> Optional[float]:
        if self.first_at is None or self.done_at is None or self.output_tokens < 2:
            return None
        return (self.done_at - self.first_at) / (self.output_tokens - 1)

    def tokens_by(self, moment: float) -> int:
        """Output tokens this request had streamed by ``moment``."""
        return max((tokens for at, tokens in self.progress if at <= moment), default=0)

    def record(self) -> dict[str, Any]:
        kept = {k: v for k, v in asdict(self).items() if k != "progress"}  # a line per chunk: not kept
        return {**kept, "ttft": self.ttft, "tpot": self.tpot}


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: Optional[float] = None
    ignore_eos: bool = False
    seed: Optional[int] = None


def request_body(model: str, prompt: str, sampling: Sampling, seed: Optional[int],
                 max_tokens: Optional[int] = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": sampling.max_tokens if max_tokens is None else max_tokens, "temperature": sampling.temperature,
    }
    if sampling.top_p is not None:
        body["top_p"] = sampling.top_p
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if seed is not None and sampling.temperature > 0:
        body["seed"] = seed
    return body


async def _one_request(session, url: str, body: dict[str, Any], record: RequestRecord) -> None:
    import aiohttp

    last = None
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    tokens = chunk["usage"].get("completion_tokens", 0)
                    if tokens > record.output_tokens:
                        record.progress.append((now, tokens))
                    record.output_tokens = tokens
                for choice in chunk.get("choices", []):
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        record.text += content
                        if record.first_at is None:
                            record.first_at = now
                        elif last is not None:
                            record.chunk_gaps.append(now - last)
                        last = now
            record.done_at = time.perf_counter()
            record.ok = True
    except Exception as exc:  # noqa: BLE001 - a failed request is a measured outcome, not a crash
        record.error = f"{type(exc).__name__}: {exc}"


async def _run(base_url: str, model: str, schedule: list[Arrival], sampling: Sampling) -> list[RequestRecord]:
    import aiohttp

    url = f"{base_url}/v1/chat/completions"
    records: list[RequestRecord] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        tasks = []
        for arrival in schedule:
            delay = start + arrival.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            record = RequestRecord(arrival.index, sent_at=time.perf_counter())
            records.append(record)
            body = _body_of(model, arrival, sampling)
            tasks.append(asyncio.create_task(_one_request(session, url, body, record)))
        await asyncio.gather(*tasks)
    return records


async def _run_closed_loop(base_url: str, model: str, schedule: list[Arrival], sampling: Sampling,
                           clients: int, duration_s: float) -> list[RequestRecord]:
    import aiohttp

    url = f"{base_url}/v1/chat/completions"
    records: list[RequestRecord] = []
    pending = iter(schedule)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        deadline = time.perf_counter() + duration_s

        async def client(start_after_s: float) -> None:
            await asyncio.sleep(start_after_s)
            # One event loop: taking the next arrival and recording it happen without a switch between
            # them, so records stay in schedule order.
            while time.perf_counter() < deadline and (arrival := next(pending, None)) is not None:
                record = RequestRecord(arrival.index, sent_at=time.perf_counter())
                records.append(record)
                await _one_request(session, url, _body_of(model, arrival, sampling), record)

        spacing = duration_s * CLOSED_LOOP_STAGGER_SHARE / clients
        await asyncio.gather(*(client(i * spacing) for i in range(clients)))
    return records


def _body_of(model: str, arrival: Arrival, sampling: Sampling) -> dict[str, Any]:
    seed = None if sampling.seed is None else sampling.seed + arrival.index
    return request_body(model, arrival.prompt, sampling, seed, arrival.max_tokens)


def run_load(base_url: str, model: str, schedule: list[Arrival], sampling: Sampling,
             shape: Optional[LoadShape] = None) -> list[RequestRecord]:
    """Send ``schedule`` and wait for every answer: open-loop at the arrival times (arrivals do not wait
    for earlier answers), or, for a closed-loop ``shape``, by its clients for its duration."""
    if shape is not None and shape.kind == "clients":
        return asyncio.run(_run_closed_loop(base_url, model, schedule, sampling, shape.clients, shape.duration_s))
    return asyncio.run(_run(base_url, model, schedule, sampling))


def percentile(values: list[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load_metrics(records: list[RequestRecord], window_s: Optional[float] = None) -> dict[str, Any]:
    """vLLM bench serve's headline metrics for one load (seconds; tok/s and req/s over the makespan).

    With ``window_s`` (a closed loop's sending time), output tok/s counts the tokens streamed within
    that many seconds of the first send, over ``window_s``; the makespan rate is kept beside it."""
    done = [r for r in records if r.ok]
    metrics: dict[str, Any] = {"requests": len(records), "completed": len(done), "failed": len(records) - len(done)}
    if not done:
        return metrics
    makespan = max(r.done_at for r in done) - min(r.sent_at for r in records)
    tokens = sum(r.output_tokens for r in done)
    ttfts = [r.ttft for r in done if r.ttft is not None]
    tpots = [r.tpot for r in done if r.tpot is not None]
    gaps = [gap for r in done for gap in r.chunk_gaps]
    metrics.update(
        output_tokens=tokens, makespan_s=makespan, output_tok_s=tokens / makespan if makespan > 0 else None,
        request_s=len(done) / makespan if makespan > 0 else None,
        mean_tpot=statistics.fmean(tpots) if tpots else None,
    )
    if window_s is not None:
        window_end = min(r.sent_at for r in records) + window_s
        metrics.update(makespan_tok_s=metrics["output_tok_s"], window_s=window_s,
                       output_tok_s=sum(r.tokens_by(window_end) for r in records) / window_s)
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", gaps)):
        for q in (50, 99):
            metrics[f"{name}_p{q}"] = percentile(values, q)
    return metrics
