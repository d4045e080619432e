"""Soak: a running server under long mixed traffic, and what must hold afterwards.

Traffic (Poisson arrivals, one seed): greedy and sampled requests, streamed and not, a share of
streamed clients that hang up after their first chunk, and a few invalid requests (a prompt longer
than the model's context, bad sampling parameters, an unknown model). Afterwards every valid request
that stayed connected must have completed, the invalid ones must have got a 4xx with an error message,
the server must still answer, and greedy answers are compared with a reference server's (target-only)
by the caller. The server's memory (its whole process tree, resident) is sampled through the run, so
a leak shows as growth in the last part of it.

Used by tests/test_soak.py (short, in CI) and benchmarks/soak.py (long runs, numbers in the docs).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

INVALID_KINDS = ("too-long", "bad-temperature", "bad-max-tokens", "unknown-model")


@dataclass(frozen=True)
class SoakConfig:
    requests: int = 300
    rate: float = 8.0  # requests per second (Poisson)
    max_tokens: int = 16
    sampled_share: float = 0.5
    stream_share: float = 0.5
    disconnect_share: float = 0.1  # of all requests; they are streamed and hang up after the first chunk
    invalid: int = 4
    seed: int = 0
    context_words: int = 4000  # the too-long prompt: far beyond a small max_model_len


@dataclass
class SoakRequest:
    index: int
    at_s: float
    prompt: str
    sampled: bool
    stream: bool
    disconnect: bool = False
    invalid: Optional[str] = None
    status: Optional[int] = None
    text: str = ""
    error: Optional[str] = None
    completed: bool = False

    def body(self, model: str, config: SoakConfig) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": self.prompt}],
                                "max_tokens": config.max_tokens, "stream": self.stream,
                                "temperature": 0.8 if self.sampled else 0.0}
        if self.sampled:
            body["seed"] = self.index
        if self.invalid == "too-long":
            body["messages"][0]["content"] = " ".join(["word"] * config.context_words)
        elif self.invalid == "bad-temperature":
            body["temperature"] = -1.0
        elif self.invalid == "bad-max-tokens":
            body["max_tokens"] = -5
        elif self.invalid == "unknown-model":
            body["model"] = "no-such-model"
        return body


def soak_traffic(config: SoakConfig, prompts: list[str]) -> list[SoakRequest]:
    rng = random.Random(config.seed)
    requests, t = [], 0.0
    for index in range(config.requests):
        stream = rng.random() < config.stream_share
        requests.append(SoakRequest(index, round(t, 4), prompts[rng.randrange(len(prompts))],
                                    sampled=rng.random() < config.sampled_share, stream=stream))
        t += rng.expovariate(config.rate)
    valid = list(range(config.requests))
    rng.shuffle(valid)
    for index in valid[:round(config.disconnect_share * config.requests)]:
        requests[index].stream, requests[index].disconnect = True, True
    for kind, index in zip(INVALID_KINDS * config.invalid, valid[-config.invalid:] if config.invalid else []):
        requests[index].invalid, requests[index].disconnect = kind, False
    return requests


async def _send(session, base_url: str, model: str, request: SoakRequest, config: SoakConfig) -> None:
    import aiohttp

    try:
        async with session.post(f"{base_url}/v1/chat/completions", json=request.body(model, config),
                                timeout=aiohttp.ClientTimeout(total=600)) as response:
            request.status = response.status
            if response.status != 200:
                request.error = (await response.text())[:500]
                return
            if not request.stream:
                payload = await response.json()
                request.text = payload["choices"][0]["message"]["content"] or ""
                request.completed = True
                return
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                if line == "data: [DONE]":
                    request.completed = True
                    break
                for choice in json.loads(line[5:]).get("choices", []):
                    request.text += (choice.get("delta") or {}).get("content") or ""
                if request.disconnect and request.text:
                    return  # hang up mid-stream: leaving the block closes the connection
    except Exception as exc:  # noqa: BLE001 - recorded; the checks decide what it means
        request.error = f"{type(exc).__name__}: {exc}"


async def _soak(base_url: str, model: str, requests: list[SoakRequest], config: SoakConfig, memory) -> list:
    import aiohttp

    samples: list[tuple[float, int, int]] = []  # (seconds, requests sent, resident bytes)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        next_sample = 0.0
        for request in requests:
            delay = start + request.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send(session, base_url, model, request, config)))
            elapsed = time.perf_counter() - start
            if memory is not None and elapsed >= next_sample:
                samples.append((round(elapsed, 2), len(tasks), memory()))
                next_sample = elapsed + 1.0
        await asyncio.gather(*tasks)
        if memory is not None:
            samples.append((round(time.perf_counter() - start, 2), len(tasks), memory()))
    return samples


def run_soak(base_url: str, model: str, prompts: list[str], config: SoakConfig, memory=None) -> dict[str, Any]:
    """Send the traffic and return every request's outcome with the memory samples."""
    requests = soak_traffic(config, prompts)
    samples = asyncio.run(_soak(base_url, model, requests, config, memory))
    return {"requests": requests, "memory": samples}


@dataclass
class SoakVerdict:
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def judge(requests: list[SoakRequest], reference: dict[int, str]) -> SoakVerdict:
    """What must hold after a soak; ``reference`` maps greedy request index -> target-only text."""
    verdict = SoakVerdict()
    valid = [r for r in requests if r.invalid is None and not r.disconnect]
    incomplete = [r for r in valid if not r.completed]
    if incomplete:
        verdict.problems.append(f"{len(incomplete)} valid requests did not complete: "
                                + "; ".join(f"#{r.index} {r.status} {r.error}" for r in incomplete[:5]))
    for request in (r for r in requests if r.invalid):
        if request.status is None or not 400 <= request.status < 500 or "error" not in (request.error or "").lower():
            verdict.problems.append(f"invalid request #{request.index} ({request.invalid}) got "
                                    f"{request.status}: {request.error}")
    greedy = [r for r in valid if not r.sampled and r.completed and r.index in reference]
    differing = [r.index for r in greedy if r.text != reference[r.index]]
    if differing:
        verdict.problems.append(f"{len(differing)} of {len(greedy)} greedy answers differ from target-only: "
                                f"{differing[:10]}")
    verdict.counts = {"requests": len(requests), "valid_completed": len(valid) - len(incomplete),
                      "disconnected": sum(r.disconnect for r in requests), "invalid": sum(bool(r.invalid) for r in requests),
                      "greedy_compared": len(greedy), "greedy_equal": len(greedy) - len(differing),
                      "sampled": sum(r.sampled for r in valid), "streamed": sum(r.stream for r in valid)}
    return verdict


def greedy_reference(base_url: str, model: str, requests: list[SoakRequest], config: SoakConfig) -> dict[int, str]:
    """The reference server's greedy answers to the soak's greedy, valid, connected requests."""
    wanted = [SoakRequest(r.index, 0.0, r.prompt, sampled=False, stream=False) for r in requests
              if r.invalid is None and not r.disconnect and not r.sampled]

    async def all_of_them() -> None:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
            await asyncio.gather(*(_send(session, base_url, model, r, config) for r in wanted))

    asyncio.run(all_of_them())
    return {r.index: r.text for r in wanted if r.completed}


def memory_growth(samples: list[tuple[float, int, int]]) -> Optional[dict[str, float]]:
    """Resident memory at one third of the requests and at the end (MiB), and the growth between."""
    if len(samples) < 3:
        return None
    total = samples[-1][1]
    third = next((s for s in samples if s[1] >= total / 3), samples[0])
    return {"mib_at_one_third": third[2] / 2**20, "mib_at_end": samples[-1][2] / 2**20,
            "growth_mib": (samples[-1][2] - third[2]) / 2**20}


def tree_memory(pid: int):
    """A sampler of the resident memory of ``pid`` and all its descendants (bytes)."""
    import psutil

    def sample() -> int:
        try:
            root = psutil.Process(pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    return sample
