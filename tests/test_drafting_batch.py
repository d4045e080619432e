"""The batch K is chosen for: ``vllm_adapter.drafting_batch_size`` replays vLLM's admission on counts.

vLLM reads K inside ``schedule()`` at the number of requests it scheduled; vspec chooses K before
``schedule()``, so it needs that number beforehand, and it is the requests that will sample a token
(and so draft) that K is for. The requests and queues here are vLLM's own; the scheduler around them
is a fake holding only what the function reads (queues, budgets, free KV blocks): the real
scheduler's admission is vLLM's to test, and building one needs a model config and a KV cache.
"""

from __future__ import annotations

from types import SimpleNamespace

from vllm import SamplingParams
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.request import Request

from vspec_runtime.vllm_adapter import drafting_batch_size

BLOCK = 16


def decoding(name: str, drafts: int = 3) -> Request:
    """A request with its whole prompt computed but the last token: it needs 1 token plus its drafts."""
    request = Request(name, list(range(1, 41)), SamplingParams(max_tokens=64), None)
    request.num_computed_tokens = 39
    request.spec_token_ids = [7] * drafts
    return request


def prompt(name: str, tokens: int, computed: int = 0) -> Request:
    request = Request(name, list(range(1, tokens + 1)), SamplingParams(max_tokens=64), None)
    request.num_computed_tokens = computed
    return request


def fake_scheduler(running=(), waiting=(), *, budget=2048, slots=256, free_blocks=10_000):
    queue = create_request_queue(SchedulingPolicy.FCFS)
    for request in waiting:
        queue.add_request(request)
    block_pool = SimpleNamespace(get_num_free_blocks=lambda: free_blocks)
    return SimpleNamespace(running=list(running), waiting=queue, max_num_scheduled_tokens=budget,
                           max_num_active_reqs=slots, kv_cache_manager=SimpleNamespace(block_pool=block_pool),
                           block_size=BLOCK)


def running_plus_waiting(scheduler, max_num_seqs: int) -> int:
    """The estimate this replaces."""
    return min(len(scheduler.running) + len(scheduler.waiting), max_num_seqs)


def test_decoding_requests_all_draft():
    assert drafting_batch_size(fake_scheduler([decoding(f"d{i}") for i in range(8)])) == 8


def test_a_queue_longer_than_the_free_slots_adds_only_what_fits():
    """Under load the queue holds what cannot run: 8 running, 2 free slots, 20 waiting."""
    scheduler = fake_scheduler([decoding(f"d{i}") for i in range(8)],
                               [prompt(f"w{i}", 20) for i in range(20)], slots=10)
    assert drafting_batch_size(scheduler) == 10
    assert running_plus_waiting(scheduler, max_num_seqs=256) == 28


def test_a_prompt_chunk_that_does_not_finish_its_prompt_does_not_draft():
    """Budget 100: four decoders take 16 tokens, two 30-token prompts fit whole, the third gets 24 of
    its 30 tokens (a chunk: admitted, but it samples nothing) and the fourth nothing."""
    scheduler = fake_scheduler([decoding(f"d{i}") for i in range(4)],
                               [prompt(f"w{i}", 30) for i in range(4)], budget=100)
    assert drafting_batch_size(scheduler) == 6


def test_admission_stops_where_kv_blocks_run_out():
    scheduler = fake_scheduler([decoding("d0")], [prompt(f"w{i}", 40) for i in range(4)], free_blocks=5)
    assert drafting_batch_size(scheduler) == 1 + 1  # 3 blocks for the first prompt, 2 left: too few
    assert drafting_batch_size(fake_scheduler([decoding("d0")], [prompt(f"w{i}", 40) for i in range(4)])) == 5


def test_a_long_prefill_in_the_running_queue_takes_the_budget_from_those_behind_it():
    """vLLM schedules the running requests in order until the budget runs out."""
    running = [decoding("d0"), prompt("long", 500), decoding("d1"), decoding("d2")]
    assert drafting_batch_size(fake_scheduler(running, budget=256)) == 1
    assert drafting_batch_size(fake_scheduler(running, budget=1024)) == 4  # the prompt's last chunk: it drafts


def test_a_request_with_nothing_to_run_is_not_counted():
    """Under async scheduling a request whose step is still in flight has nothing new to schedule."""
    busy = decoding("busy", drafts=0)
    busy.num_computed_tokens = busy.num_tokens
    assert drafting_batch_size(fake_scheduler([decoding("d0"), busy])) == 1


def test_idle_is_zero_and_anything_in_flight_is_at_least_one():
    """0 tells the controller the engine went idle (a sticky K=0 cohort ends); a step where nobody
    drafts (one long prompt in chunks) must not."""
    assert drafting_batch_size(fake_scheduler()) == 0
    assert drafting_batch_size(fake_scheduler([prompt("long", 5000)])) == 1
    assert drafting_batch_size(fake_scheduler(waiting=[prompt("w", 40)], free_blocks=0)) == 1
