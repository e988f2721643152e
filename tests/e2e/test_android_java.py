"""The Android demo's Java core reads what Python writes: n-gram caches (ODNG v1) and bundles.

Runs android_demo/run_java_tests.sh (javac 17 + JUnit4, no Gradle or Android SDK).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from omnidraft_deploy.manifest import (
    MANIFEST_NAME,
    GraphInfo,
    Manifest,
    file_entry,
    write_text_atomic,
)
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.ngram.format import save

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "android_demo" / "run_java_tests.sh"
JUNIT = Path("/usr/share/java/junit4.jar")
V_D, V_T = 32000, 151936  # Llama-2 drafter, Qwen2 target

pytestmark = pytest.mark.skipif(
    shutil.which("javac") is None or shutil.which("java") is None or not JUNIT.is_file(),
    reason="needs javac 17 and JUnit4: apt-get install -y openjdk-17-jdk-headless junit4",
)


@pytest.fixture(scope="module")
def java_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
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
            ("drafter.pte", "drafter"),
            ("target.pte", "target"),
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


def test_junit_suite_passes(java_env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "test"], env=java_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "OK (" in done.stdout, done.stdout + done.stderr
