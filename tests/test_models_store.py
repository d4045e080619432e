"""`vspec models` and the model store, on real folders: resolution, validation, registry, downloads.

Every test has its own VSPEC_HOME and VSPEC_MODEL_DIR (conftest.isolated_home).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cli_helpers import run_cli
from vspec_cli import model_store
from vspec_runtime import envs, paths

DRAFT = "qwen2.5-0.5b-instruct"
EAGLE = "qwen2.5-14b-instruct-eagle"
REPO = Path(__file__).resolve().parents[1]


def make_model(folder: Path, arch: str = "Qwen2ForCausalLM", weights: bytes = b"\0" * 64,
               tokenizer: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "qwen2"}))
    (folder / "model.safetensors").write_bytes(weights)
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
        (folder / "tokenizer_config.json").write_text("{}")
    return folder


# --- resolution -------------------------------------------------------------------------------


def test_resolution_order_explicit_path_env_registry_model_dir_shared(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    monkeypatch.setenv("VSPEC_SHARED_MODEL_DIRS", str(shared))
    copies = {
        "shared": make_model(shared / DRAFT),
        "model-dir": make_model(paths.model_dir() / DRAFT),
        "registry": make_model(tmp_path / "registered"),
        "env": make_model(tmp_path / "from-env"),
    }
    model_store.register(DRAFT, copies["registry"])
    monkeypatch.setenv(envs.model_override_var(DRAFT), str(copies["env"]))
    explicit = make_model(tmp_path / "explicit")

    assert model_store.resolve(str(explicit)).source == "path"
    for expected in ("env", "registry", "model-dir", "shared"):
        resolved = model_store.resolve(DRAFT)
        assert (resolved.source, resolved.path) == (expected, copies[expected])
        listing = json.loads(run_cli(capsys, "models", "list", "--json").stdout)
        entry = next(m for m in listing["models"] if m["name"] == DRAFT)
        assert (entry["status"], entry["source"], entry["path"]) == ("ok", expected, str(copies[expected]))
        # take away the winner; the next source in the order must win
        if expected == "env":
            monkeypatch.delenv(envs.model_override_var(DRAFT))
        elif expected == "registry":
            assert run_cli(capsys, "models", "remove", DRAFT).exit_code == 0
            assert copies["registry"].is_dir(), "removing a registration must not delete the user's folder"
        elif expected == "model-dir":
            for item in copies["model-dir"].iterdir():
                item.unlink()
            copies["model-dir"].rmdir()
    assert model_store.resolve(DRAFT).source == "shared"


def test_first_valid_candidate_wins_and_the_rejected_one_says_why(tmp_path, monkeypatch, capsys):
    wrong = make_model(tmp_path / "wrong", arch="LlamaForCausalLM")
    good = make_model(paths.model_dir() / DRAFT)
    monkeypatch.setenv(envs.model_override_var(DRAFT), str(wrong))

    resolved = model_store.resolve(DRAFT)
    assert (resolved.source, resolved.path) == ("model-dir", good)
    entry = next(m for m in json.loads(run_cli(capsys, "models", "list", "--json").stdout)["models"]
                 if m["name"] == DRAFT)
    rejected = next(c for c in entry["candidates"] if c["source"] == "env")
    assert "LlamaForCausalLM" in rejected["problem"] and "Qwen2ForCausalLM" in rejected["problem"]


def test_registry_entry_pointing_nowhere_is_reported(tmp_path, capsys):
    folder = make_model(tmp_path / "gone")
    model_store.register("my-draft", folder, role="draft")
    for item in folder.iterdir():
        item.unlink()
    folder.rmdir()
    result = run_cli(capsys, "models", "verify")
    assert result.exit_code == 1
    assert "my-draft" in result.stdout and "does not exist" in result.stdout


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "build", "reason"),
    [
        (DRAFT, lambda p: make_model(p, arch="LlamaForCausalLM"), "do not include Qwen2ForCausalLM"),
        (DRAFT, lambda p: make_model(p, weights=b""), "every weights file is empty"),
        (DRAFT, lambda p: make_model(p, tokenizer=False), "has no tokenizer"),
        (EAGLE, lambda p: make_model(p, arch="Qwen2ForCausalLMEagle", weights=b""), "every weights file is empty"),
    ],
    ids=["wrong-architecture", "empty-weights", "missing-tokenizer", "eagle-empty-weights"],
)
def test_a_bad_model_gets_a_one_line_reason(tmp_path, capsys, name, build, reason):
    folder = build(paths.model_dir() / name)
    result = run_cli(capsys, "models", "verify", name)
    assert result.exit_code == 1
    line = next(line for line in result.stdout.splitlines() if name in line)
    assert reason in line and str(folder) in line

    refused = run_cli(capsys, "models", "register", name, str(folder))
    assert refused.exit_code == 2
    assert reason in refused.stderr
    assert not paths.registry_file().exists(), "a refused registration must not write the registry"


def test_eagle_head_needs_no_tokenizer_and_config_problems_are_named(tmp_path, capsys):
    make_model(paths.model_dir() / EAGLE, arch="Qwen2ForCausalLMEagle", tokenizer=False)
    assert run_cli(capsys, "models", "verify", EAGLE).exit_code == 0

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert "not valid JSON" in model_store.check_model_dir(broken)
    (broken / "config.json").unlink()
    assert "has no config.json" in model_store.check_model_dir(broken)


# --- registry ---------------------------------------------------------------------------------


def test_corrupt_registry_is_a_clear_error_and_the_file_is_kept(tmp_path, capsys):
    registry = paths.registry_file()
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_text('{"schema": "vspec-models/1", "models": {"x": ')
    before = registry.read_bytes()

    listing = run_cli(capsys, "models", "list")
    assert listing.exit_code == 1
    assert "corrupt" in listing.stderr and str(registry) in listing.stderr
    registering = run_cli(capsys, "models", "register", "my-draft", str(make_model(tmp_path / "m")))
    assert registering.exit_code == 1
    assert registry.read_bytes() == before


def test_registry_flag_and_env_var_choose_the_file(tmp_path, monkeypatch, capsys):
    folder = make_model(tmp_path / "m")
    flag_file = tmp_path / "team.json"
    assert run_cli(capsys, "models", "--registry", str(flag_file), "register", "team-draft", str(folder),
                   "--role", "draft").exit_code == 0
    document = json.loads(flag_file.read_text())
    assert document["schema"] == "vspec-models/1"
    assert document["models"]["team-draft"]["path"] == str(folder.resolve())
    assert not paths.registry_file().exists()
    listing = json.loads(run_cli(capsys, "models", "--registry", str(flag_file), "list", "--json").stdout)
    assert listing["registry"] == str(flag_file)
    assert next(m for m in listing["models"] if m["name"] == "team-draft")["source"] == "registry"

    monkeypatch.setenv("VSPEC_REGISTRY", str(flag_file))
    assert model_store.resolve("team-draft").source == "registry"


def test_concurrent_writers_never_tear_or_lose_the_registry(tmp_path):
    """Four processes register 15 names each while this process keeps reading the file."""
    folder = make_model(tmp_path / "m")
    registry = tmp_path / "models.json"
    writer = (
        "import sys; from pathlib import Path; from vspec_cli import model_store\n"
        "for i in range(15):\n"
        "    model_store.register(f'w{sys.argv[1]}-{i}', Path(sys.argv[2]), registry=Path(sys.argv[3]))\n"
    )
    torn: list[str] = []
    stop = threading.Event()

    def read_continuously() -> None:
        while not stop.is_set():
            try:
                text = registry.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)

    reader = threading.Thread(target=read_continuously)
    reader.start()
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(n), str(folder), str(registry)], cwd=REPO)
             for n in range(4)]
    codes = [p.wait(timeout=120) for p in procs]
    stop.set()
    reader.join()
    assert codes == [0, 0, 0, 0]
    assert torn == []
    names = set(json.loads(registry.read_text())["models"])
    assert names == {f"w{n}-{i}" for n in range(4) for i in range(15)}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no stray temp files"


# --- --json schema ----------------------------------------------------------------------------


def test_json_output_schema(tmp_path, capsys):
    make_model(paths.model_dir() / DRAFT)
    listing = json.loads(run_cli(capsys, "models", "list", "--json").stdout)
    assert listing["schema"] == "vspec/models/1"
    assert set(listing) == {"schema", "registry", "model_dir", "models"}
    names = [m["name"] for m in listing["models"]]
    assert {"demo", DRAFT, EAGLE} <= set(names)
    for entry in listing["models"]:
        assert set(entry) == {"name", "role", "builtin", "hub_repo", "revision", "status", "source", "path",
                              "problem", "candidates"}
        assert entry["status"] in ("ok", "missing", "invalid")
    by_name = {m["name"]: m for m in listing["models"]}
    assert by_name[DRAFT]["revision"] == model_store.BUILTIN_MODELS[DRAFT].revision
    assert by_name[EAGLE]["revision"] == "unpinned"
    assert by_name["demo"]["status"] == "missing"

    verify = json.loads(run_cli(capsys, "models", "verify", DRAFT, "--json").stdout)
    assert verify["schema"] == "vspec/models-verify/1"
    assert verify["ok"] is True and verify["models"][0]["path"] == str(paths.model_dir() / DRAFT)


# --- prepare ----------------------------------------------------------------------------------


def _hub_cache(root: Path, repo: str, commit: str, files: dict[str, bytes], main: bool = False) -> Path:
    """A huggingface_hub cache entry laid out as the library writes it (blobs + snapshot links)."""
    import hashlib

    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if main:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def _prepare(env_home: Path, hub_cache: Path, *args: str, offline: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-c", "from vspec_cli.app import main; main()", "models", "prepare", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_prepare_downloads_from_a_prefilled_hub_cache_offline(tmp_path, isolated_home):
    """The model hub cannot be reached from this machine, so the download path is exercised against a
    pre-populated huggingface_hub cache with HF_HUB_OFFLINE=1 (and with --no-download): the same
    snapshot_download call, at the pinned revision, served from the cache."""
    cache = tmp_path / "hub"
    config = json.dumps({"architectures": ["Qwen2ForCausalLM"]}).encode()
    snapshot = _hub_cache(cache, "Qwen/Qwen2.5-0.5B-Instruct", model_store.BUILTIN_MODELS[DRAFT].revision,
                          {"config.json": config, "model.safetensors": b"\1" * 128, "tokenizer.json": b"{}"})
    eagle_commit = "0123456789abcdef0123456789abcdef01234567"
    eagle_snapshot = _hub_cache(cache, "Zjcxy-SmartAI/Eagle-Qwen2.5-14B-Instruct", eagle_commit,
                                {"config.json": json.dumps({"architectures": ["Qwen2ForCausalLMEagle"]}).encode(),
                                 "pytorch_model.bin": b"\2" * 64}, main=True)

    first = _prepare(isolated_home, cache, DRAFT)
    assert first.returncode == 0, first.stderr
    link = paths.model_dir() / DRAFT
    assert link.is_symlink() and link.resolve() == snapshot.resolve()
    assert model_store.resolve(DRAFT).source == "model-dir"

    again = _prepare(isolated_home, cache, DRAFT)
    assert again.returncode == 0 and "already available" in again.stdout

    unpinned = _prepare(isolated_home, cache, EAGLE, "--no-download", offline=False)
    assert unpinned.returncode == 0, unpinned.stderr
    assert "no pinned revision" in unpinned.stderr
    assert (paths.model_dir() / EAGLE).resolve() == eagle_snapshot.resolve()


def test_prepare_offline_without_the_model_says_what_to_do(tmp_path, isolated_home):
    """No hub here: a model absent from the (empty) cache must fail with the way out, not a traceback."""
    result = _prepare(isolated_home, tmp_path / "empty-hub", "qwen2.5-14b-instruct")
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "HF_HUB_OFFLINE is set" in message
    assert "vspec models register qwen2.5-14b-instruct PATH" in message
    assert "Traceback" not in result.stderr
    assert not (paths.model_dir() / "qwen2.5-14b-instruct").exists()


def test_prepare_demo_builds_once_into_the_model_dir(monkeypatch, capsys):
    import vspec_cli.demo_model as demo_model

    calls = []

    def fake_build(target: Path, progress=None):  # the real conversion takes ~30 s and is tested elsewhere
        calls.append(target)
        progress("de-quantising")
        make_model(target, arch="LlamaForCausalLM")
        return target

    monkeypatch.setattr(demo_model, "build_demo_model", fake_build)
    first = run_cli(capsys, "models", "prepare", "demo")
    assert first.exit_code == 0, first.stderr
    assert calls == [paths.model_dir() / "demo"]
    assert "de-quantising" in first.stderr
    second = run_cli(capsys, "models", "prepare", "demo")
    assert second.exit_code == 0 and "already available" in second.stdout
    assert len(calls) == 1


def test_prepare_unknown_name_and_remove_delete_files(tmp_path, capsys):
    unknown = run_cli(capsys, "models", "prepare", "no-such-model")
    assert unknown.exit_code == 2 and "vspec models register no-such-model PATH" in " ".join(unknown.stderr.split())

    snapshot = make_model(tmp_path / "hub-snapshot")
    link = paths.model_dir() / DRAFT
    link.parent.mkdir(parents=True)
    link.symlink_to(snapshot)
    dry = run_cli(capsys, "models", "remove", DRAFT, "--delete-files", "--dry-run")
    assert dry.exit_code == 0 and "would delete" in dry.stdout and link.is_symlink()
    done = run_cli(capsys, "models", "remove", DRAFT, "--delete-files", "--yes")
    assert done.exit_code == 0
    assert not link.exists() and not link.is_symlink()
    assert (snapshot / "model.safetensors").is_file(), "only the link goes, never the hub cache"
