"""The /metrics collector turns the engine's published snapshot into vspec_* series."""

from prometheus_client import CollectorRegistry, generate_latest

from vspec_runtime import metrics


def scrape(monkeypatch, tmp_path, snapshot):
    monkeypatch.setenv("VSPEC_RUN_DIR", str(tmp_path))
    if snapshot is not None:
        metrics.publish(snapshot)
    registry = CollectorRegistry()
    registry.register(metrics.VspecCollector())
    return generate_latest(registry).decode()


def test_snapshot_becomes_vspec_series(monkeypatch, tmp_path):
    text = scrape(monkeypatch, tmp_path, {
        "method": "ngram", "policy": "online", "gamma": 4, "max_gamma": 6, "steps": 10, "switches": 2,
        "selections": {"2": 3, "4": 7}, "rewards": {"2": 0.4, "4": 0.6}, "faulted": False, "relaxed": False,
    })
    assert "vspec_current_gamma 4.0" in text
    assert 'vspec_gamma_selections_total{gamma="4"} 7.0' in text
    assert "vspec_gamma_switches_total 2.0" in text
    assert 'vspec_reward_tokens_per_ms{gamma="2"} 0.4' in text
    assert 'vspec_info{method="ngram",policy="online",relaxed_acceptance="off"} 1.0' in text
    assert "vspec_controller_faulted 0.0" in text


def test_a_faulted_controller_is_visible(monkeypatch, tmp_path):
    text = scrape(monkeypatch, tmp_path, {"gamma": 3, "faulted": True, "relaxed": True})
    assert "vspec_controller_faulted 1.0" in text and "vspec_relaxed_acceptance_enabled 1.0" in text


def test_no_snapshot_no_series(monkeypatch, tmp_path):
    assert "vspec_" not in scrape(monkeypatch, tmp_path, None)


def test_per_request_lengths_are_on_metrics(monkeypatch, tmp_path):
    from vspec_runtime.control.per_request import DraftAllocator

    allocator = DraftAllocator(max_positions=6)
    for tokens in range(8, 40, 2):
        allocator.observe_step(("copy", "chat"), (6, 6), (6, 0), tokens, 20.0 + 2.0 * tokens, pure_decode=True)
    allocator.lengths({"copy": 6, "chat": 6}, caps={})
    text = scrape(monkeypatch, tmp_path, {"gamma": 6, "per_request": allocator.summary()})
    assert "vspec_per_request_offered_drafts_total 12.0" in text
    assert "vspec_per_request_kept_drafts_total 6.0" in text
    assert 'vspec_per_request_lengths_total{length="0"} 1.0' in text
    assert 'vspec_per_request_lengths_total{length="6"} 1.0' in text
    assert 'vspec_per_request_slots_by_band_total{band="high"} 6.0' in text
    assert 'vspec_per_request_step_cost_ms{term="per_token"}' in text
