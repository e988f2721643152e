"""The Android demo's Java core reads what Python writes and decodes as Python decodes.

Runs android_demo/run_java_tests.sh (javac 17 + JUnit4, no Gradle or Android SDK): n-gram caches
(ODNG), vocabulary maps (ODVM, same error messages), bundles, and the JUnit suite with the golden
traces (tests/golden/traces) and tokenizer vectors (tests/golden/tokenizer_vectors), fed with the
tokenizer files a bundle ships and the vocabulary maps the Python builder makes. Regenerate the
golden files with ``python -m omnidraft_deploy.golden``. The multi-target trace (issue 30) is
replayed from the multi-target bundle the tests export (``tests/conftest.py`` ``multi_bundle``).
The traces are also replayed by the Python decoder (``golden.replay``): a trace Python no longer
decodes the same way is stale, and Java would be held to an old Python.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.manifest import MANIFEST_NAME, Manifest
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog import assets
from omnidraft_deploy.golden.write import TRACES, VECTOR_TOKENIZERS, VECTORS
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import save
from omnidraft_deploy.vocab import io as vocab_io

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "android_demo" / "run_java_tests.sh"
JUNIT = Path("/usr/share/java/junit4.jar")
V_D, V_T = 32000, 151936  # Llama-2 drafter, Qwen2 target

HAVE_JAVA = (
    shutil.which("javac") is not None and shutil.which("java") is not None and JUNIT.is_file()
)
REGENERATE = "regenerate with `.venv/bin/python -m omnidraft_deploy.golden --traces`"


@pytest.fixture(scope="module")
def java_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if not HAVE_JAVA:
        pytest.skip("needs javac 17 and JUnit4: apt-get install -y openjdk-17-jdk-headless junit4")
    env = {**os.environ, "OMNIDRAFT_JAVA_BUILD": str(tmp_path_factory.mktemp("java-build"))}
    done = subprocess.run(
        ["bash", str(SCRIPT), "build"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return env


def _cli(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "cli", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _random_cache(policy: str, seed: int) -> NGramCache:
    rng = random.Random(seed)
    cache = NGramCache(max_entries=200, policy=policy)
    vocab = [rng.randrange(V_D) for _ in range(40)] + [0, 127, 128, 16383, 16384, V_D - 1]
    for _ in range(600):
        ids = [rng.choice(vocab) for _ in range(rng.randint(2, 6))]
        if rng.random() < 0.5 or not len(cache):
            cache.update(ids, rng.choice([0, 127, 128, V_T - 1, rng.randrange(V_T)]))
        else:
            cache.match(ids, 0)
    return cache


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_java_reads_and_rewrites_python_caches(
    java_env: dict[str, str], tmp_path: Path, policy: str
) -> None:
    cache = _random_cache(policy, seed=len(policy))
    path = tmp_path / "ngram_cache.bin"
    save(cache, path, draft_vocab_size=V_D, target_vocab_size=V_T)
    dump = _cli(java_env, "dump", path)
    assert dump.returncode == 0, dump.stderr
    lines = dump.stdout.splitlines()
    assert lines[0] == (
        f"version=1 policy={policy} draft_vocab={V_D} target_vocab={V_T} entries={len(cache)}"
    )
    expected = [f"{' '.join(map(str, k))} -> {t} x{u}" for k, t, u in cache.items()]
    assert lines[1:] == expected and len(expected) > 50
    rewritten = tmp_path / "java.bin"
    done = _cli(java_env, "rewrite", path, rewritten)
    assert done.returncode == 0, done.stderr
    assert rewritten.read_bytes() == path.read_bytes()


def test_java_rejects_bad_files_naming_them(java_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "ngram_cache.bin"
    save(_random_cache("lru", seed=1), path, draft_vocab_size=V_D, target_vocab_size=V_T)
    data = bytearray(path.read_bytes())
    cases = {40: "CRC-32 mismatch", 4: "format version 3 is newer", 0: "not an n-gram cache"}
    for pos, message in cases.items():
        bad = bytearray(data)
        bad[pos] ^= 2
        path.write_bytes(bytes(bad))
        done = _cli(java_env, "dump", path)
        assert done.returncode == 1 and f"{path}: {message}" in done.stderr, done.stderr


def _python_bundle(root: Path) -> Path:
    root.mkdir()
    (root / "drafter.pte").write_bytes(b"drafter graph bytes")
    (root / "target.pte").write_bytes(b"target graph bytes" * 100)
    cache = _random_cache("lfu", seed=3)
    save(cache, root / "ngram_cache.bin", draft_vocab_size=V_D, target_vocab_size=V_T)
    graphs = {
        role: GraphInfo(
            file=f"{role}.pte",
            preset=f"tiny-{preset}",
            family=family,
            tokenizer=tok,
            vocab_size=vocab,
            max_seq_len=256,
            seq_len=None,
            n_layers=2,
            n_kv_heads=2,
            head_dim=32,
            quantization="8da4w",
            parity={"max_abs_logit_diff": 1.5e-05, "tolerance": 1e-3},
        )
        for role, preset, family, tok, vocab in [
            ("drafter", "llama-68m", "llama", "llama2", V_D),
            ("target", "qwen2-7b", "qwen2", "qwen2", V_T),
        ]
    }
    files = {
        rel: file_entry(root, rel, role)
        for rel, role in [
            ("drafter.pte", "drafter_graph"),
            ("target.pte", "target_graph"),
            ("ngram_cache.bin", "ngram_cache"),
        ]
    }
    manifest = Manifest(
        backend="xnnpack",
        draft_len=4,
        mapping_hash="0" * 64,
        graphs=graphs,
        files=files,
        extras={"note": 'café "quoted"', "timings_s": [1.5, 2]},
    )
    write_text_atomic(root / MANIFEST_NAME, manifest.to_json())
    return root


def test_java_verifies_a_bundle_written_by_python(java_env: dict[str, str], tmp_path: Path) -> None:
    bundle = _python_bundle(tmp_path / "bundle")
    done = _cli(java_env, "verify", bundle)
    assert done.returncode == 0, done.stderr
    assert "verified (3 files)" in done.stdout and "backend xnnpack, draft_len 4" in done.stdout
    assert f"n-gram cache: {len(_random_cache('lfu', seed=3))} entries, lfu" in done.stdout
    (bundle / "target.pte").write_bytes(b"target graph bytez" * 100)
    done = _cli(java_env, "verify", bundle)
    assert done.returncode == 1
    assert f"{bundle / 'target.pte'}: sha256 mismatch" in done.stderr


def _trace_files() -> list[dict[str, Any]]:
    out = []
    for path in sorted(TRACES.glob("*.json.gz")):
        if ".vocab_map." not in path.name:
            out.append(json.loads(gzip.decompress(path.read_bytes())))
    return out


def _traces() -> list[dict[str, Any]]:
    """Every one-pair trace, a multi-target trace's targets included."""
    return [s for t in _trace_files() for s in t.get("targets", [t])]


def _multi_trace() -> dict[str, Any]:
    found = [t for t in _trace_files() if "targets" in t]
    assert len(found) == 1, f"one multi-target trace expected: {REGENERATE}"
    return found[0]


def _tokenizer(name: str) -> Any:
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    try:
        return load_tokenizer(name)
    except assets.AssetError:
        return None  # optional asset (smollm2 needs `omnidraft assets fetch --models`)


@functools.cache
def _built_mapper(drafter_tok: str, target_tok: str) -> Any:
    from omnidraft_deploy.vocab.build import build_mapper

    return build_mapper(_tokenizer(drafter_tok), _tokenizer(target_tok))


def _trace_mapper(t: dict[str, Any]) -> Any:
    """A trace's vocabulary map: its own file (the real pair), else built from the default assets."""
    if t["vocab_map"]:
        return vocab_io.from_bytes(gzip.decompress((TRACES / t["vocab_map"]).read_bytes()))
    return _built_mapper(t["drafter_tokenizer"], t["target_tokenizer"])


@pytest.fixture(scope="module")
def golden_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tokenizer files as a bundle ships them, and the tiny pairs' vocabulary maps, for Java."""
    root = tmp_path_factory.mktemp("golden-inputs")
    names = {*VECTOR_TOKENIZERS, *(t["target_tokenizer"] for t in _traces())}
    for name in sorted(names):
        tok = _tokenizer(name)
        if tok is not None:
            (root / "tokenizers" / name).mkdir(parents=True)
            for fname, data in tok.files().items():
                (root / "tokenizers" / name / fname).write_bytes(data)
    (root / "maps").mkdir()
    for t in _traces():
        mapper = _trace_mapper(t)
        if not t["vocab_map"]:
            vocab_io.save(mapper, root / "maps" / f"{t['drafter']}--{t['target']}.vocab_map.bin")
        assert mapper.content_hash() == t["mapping_hash"], (
            f"trace {t['name']} is stale: {REGENERATE}"
        )
    return {"OMNIDRAFT_TOKENIZERS": str(root / "tokenizers"), "OMNIDRAFT_MAPS": str(root / "maps")}


@pytest.mark.parametrize("name", sorted(t["name"] for t in _traces()))
def test_the_python_decoder_still_makes_each_traces_choices(name: str) -> None:
    """Fed a trace's recorded logits and draws, the Python decoder of its settings makes the same
    calls and records the same trace (steps and estimates of the cost traces included)."""
    from omnidraft_deploy.golden.replay import StaleTrace, rerecord

    trace = next(t for t in _traces() if t["name"] == name)
    try:
        again = rerecord(trace, _trace_mapper(trace), _tokenizer(trace["target_tokenizer"]))
    except StaleTrace as e:
        raise AssertionError(f"trace {name} is stale ({e}): {REGENERATE}") from None
    assert again.keys() == trace.keys(), f"trace {name} is stale: {REGENERATE}"
    for key in trace:
        if key != "runs":
            assert again[key] == trace[key], f"trace {name}: {key} differs: {REGENERATE}"
    for r, (run, old) in enumerate(zip(again["runs"], trace["runs"], strict=True)):
        for key in old:
            if key == "steps":
                _assert_same_steps(run[key], old[key], f"trace {name} run {r}")
            else:
                assert run[key] == old[key], f"trace {name} run {r}: {key} differs: {REGENERATE}"


ESTIMATES = ("rate", "value", "lookup_rate")


def _assert_same_steps(new: list[dict[str, Any]], old: list[dict[str, Any]], where: str) -> None:
    """Each step's choice exactly, its estimates to 1e-6 relative: the contract Java is held to
    (``StepCheck``), so a float32 softmax summed in another order is not a stale trace."""
    assert len(new) == len(old), f"{where}: {len(new)} steps, recorded {len(old)}: {REGENERATE}"
    for i, (a, b) in enumerate(zip(new, old, strict=True)):
        exact = {k: v for k, v in b.items() if k not in (*ESTIMATES, "weights")}
        assert {k: a[k] for k in exact} == exact, f"{where} step {i}: {REGENERATE}"
        for k in (*ESTIMATES, "weights"):
            if k in b:
                assert np.allclose(a[k], b[k], rtol=1e-6, atol=1e-6), f"{where} step {i}: {k}"


def test_the_python_replay_reports_a_perturbed_trace() -> None:
    """The stale check can fail: a trace whose costs changed makes Python call otherwise, and a
    recorded estimate moved by 1e-4 no longer matches."""
    from omnidraft_deploy.golden.replay import StaleTrace, rerecord

    trace = next(t for t in _traces() if t["name"] == "tiny-llama3-greedy-cost")
    mapper, tok = _trace_mapper(trace), _tokenizer(trace["target_tokenizer"])
    dear = json.loads(json.dumps(trace))
    dear["cost_profile"]["drafter_ms"] = [3 * ms for ms in dear["cost_profile"]["drafter_ms"]]
    with pytest.raises(StaleTrace, match="call #"):
        rerecord(dear, mapper, tok)
    again = rerecord(trace, mapper, tok)["runs"][0]["steps"]
    moved = json.loads(json.dumps(trace["runs"][0]["steps"]))
    moved[3]["rate"] *= 1.0001
    _assert_same_steps(again, trace["runs"][0]["steps"], "unperturbed")
    with pytest.raises(AssertionError, match="step 3: rate"):
        _assert_same_steps(again, moved, "perturbed")


def test_golden_vectors_match_the_python_tokenizers() -> None:
    """The vectors Java is held to are still what the Python tokenizers produce."""
    for path in sorted(VECTORS.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        tok = _tokenizer(doc["tokenizer"])
        if tok is None:
            continue
        stale = [
            s for s, ids in zip(doc["strings"], doc["ids"], strict=True) if tok.encode(s) != ids
        ]
        assert not stale, f"{path.name}: {len(stale)} strings encode differently: {REGENERATE}"


def test_java_refuses_broken_vocab_maps_as_python_does(
    java_env: dict[str, str], tmp_path: Path
) -> None:
    mapper = vocab_io.load(ROOT / "tests" / "golden" / "mapper_v1.bin")
    good = vocab_io.to_bytes(mapper)  # version 2
    path = tmp_path / "vocab_map.bin"
    path.write_bytes(good)
    done = _cli(java_env, "vocabmap", path)
    assert done.returncode == 0 and "drafter_vocab=6 target_vocab=10" in done.stdout, done.stderr
    cases = {
        "magic": (0, 1),
        "version": (4, 5),
        "flags": (6, 1),
        "vocab": (8, 0xFF),
        "crc": (40, 1),
    }
    for what, (pos, flip) in cases.items():
        bad = bytearray(good)
        bad[pos] ^= flip
        path.write_bytes(bytes(bad))
        with pytest.raises(vocab_io.VocabMapFormatError) as err:
            vocab_io.load(path)
        done = _cli(java_env, "vocabmap", path)
        assert done.returncode == 1, what
        assert done.stderr.strip() == f"error: {err.value}", (what, done.stderr)
    for size in (10, len(good) - 1):
        path.write_bytes(good[:size])
        with pytest.raises(vocab_io.VocabMapFormatError) as err:
            vocab_io.load(path)
        assert _cli(java_env, "vocabmap", path).stderr.strip() == f"error: {err.value}"


def test_java_opens_each_target_of_a_multi_target_bundle(
    java_env: dict[str, str], multi_bundle: Path
) -> None:
    """The Android core reads the bundle the Python export writes: every file verified, a target
    chosen by name, and without one the targets listed."""
    names = sorted(json.loads((multi_bundle / MANIFEST_NAME).read_text())["targets"])
    done = _cli(java_env, "verify", multi_bundle)
    assert done.returncode == 1
    assert f"a bundle of 3 targets ({', '.join(names)}): choose one by name" in done.stderr
    for name in names:
        done = _cli(java_env, "verify", multi_bundle, name)
        assert done.returncode == 0, done.stderr
        assert f"target {name} (targets/{name}/target.onnx" in done.stdout
        assert f"target {name} of 3: {', '.join(names)}" in done.stdout
        assert "drafter tiny-llama-68m (drafter.onnx" in done.stdout


def test_the_multi_target_trace_was_recorded_from_the_bundles_models(multi_bundle: Path) -> None:
    """The trace is recorded from eager models at the bundle's presets, seeds and settings; the
    bundle's ONNX graphs give the same top-k at the first recorded call of each model."""
    import base64

    import numpy as np
    import torch
    from omnidraft_deploy.runtime.bundle import open_bundle

    trace = _multi_trace()
    for sub in trace["targets"]:
        bundle = open_bundle(multi_bundle, target=sub["target"])
        assert bundle.mapper.content_hash() == sub["mapping_hash"]
        for role, lm in (("target", bundle.target), ("drafter", bundle.drafter)):
            call = next(c for c in sub["runs"][0]["calls"] if c["role"] == role)
            logits = lm.forward(torch.tensor(call["ids"]), call["start"])[-1].float()
            row = call["rows"][-1]
            idx = np.frombuffer(base64.b64decode(row["idx"]), "<i4")
            val = np.frombuffer(base64.b64decode(row["val"]), "<f4")
            top = logits.topk(len(idx))
            assert top.indices[:8].tolist() == idx[:8].tolist(), (sub["name"], role)
            np.testing.assert_allclose(top.values.numpy(), val, atol=1e-3)


def test_junit_suite_passes(
    java_env: dict[str, str], golden_inputs: dict[str, str], multi_bundle: Path
) -> None:
    """JUnit: golden traces replayed exactly (the multi-target one from one bundle), tokenizer
    vectors matched, broken files refused."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "test"],
        env={**java_env, **golden_inputs, "OMNIDRAFT_MULTI_BUNDLE": str(multi_bundle)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "OK (" in done.stdout, done.stdout + done.stderr
    for t in _traces():  # every trace ran: none was skipped for a missing map or tokenizer
        assert f"trace {t['name']}: {len(t['runs'])} runs replayed exactly" in done.stdout
    assert done.stdout.count("perturbed trace (") == 4  # and perturbed ones were refused
    assert "session: drafting: +2/-1" in done.stdout  # the app's Session ran with and without
    assert "with the profile, drafting: cost-aware" in done.stdout  # a cost profile
    multi = _multi_trace()
    assert (f"multi-target trace {multi['name']}: targets "
            f"{', '.join(s['target'] for s in multi['targets'])} replayed from one bundle "
            f"(drafter {multi['drafter']})") in done.stdout  # fmt: skip
    for name in VECTOR_TOKENIZERS:
        if _tokenizer(name) is not None:
            assert f"tokenizer vectors {name}: " in done.stdout and "strings OK" in done.stdout
