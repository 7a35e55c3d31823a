"""Where evospec keeps its files, and writing them so that a reader, or a crash mid-write, never sees half of one."""

from __future__ import annotations

import os
from pathlib import Path

import safetensors.torch
import torch


def evospec_home() -> Path:
    """Root of evospec's cache: $EVOSPEC_HOME, else ~/.cache/evospec."""
    return Path(os.environ.get("EVOSPEC_HOME") or Path.home() / ".cache" / "evospec").expanduser()


def write_atomically(path: Path, data: bytes | str, durable: bool = False) -> None:
    """Write data to a temporary file beside path, then rename it over path.

    durable: also fsync the file and its directory, so that the new file survives a power loss,
    not only a killed process. The temporary name carries the process id, so that two processes
    writing the same path never share one.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data.encode() if isinstance(data, str) else data)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def save_tensors_atomically(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """Write tensors as a safetensors file at path, atomically (write_atomically)."""
    contiguous = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    write_atomically(path, safetensors.torch.save(contiguous, metadata=metadata))
