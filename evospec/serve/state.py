"""Durable server state: what components have learned, saved atomically and restored at start.

Each save is a directory `<state-dir>/<sequence, 8 digits>/`: per component `<stem>.safetensors` (its
tensors) and `<stem>.json` (its metadata), the stem being its name with what a file name cannot hold
replaced by "_", then `manifest.json`, written last, with the SHA-256 of every other file. Every
file goes to a temporary name, is fsynced and renamed into place. A save without a manifest, or
whose files do not match it (a kill mid-save, a bad disk), is skipped with a warning and the newest
complete one is loaded. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import safetensors.torch
import torch
from safetensors import SafetensorError

from evospec.errors import EvospecError
from evospec.files import write_atomically
from evospec.selection import Selector

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
# Tests only: seconds to pause after writing each file, so that a kill can land in the middle of a save.
SAVE_DELAY_ENV = "EVOSPEC_TEST_SAVE_DELAY_S"


class Stateful(Protocol):
    """A component whose learned state outlives the process (a learner's drafter, a selector)."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Its tensors, by name."""

    def state_meta(self) -> dict[str, Any]:
        """Everything else it needs to go on, as JSON-able values."""

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Go on from what state_tensors() and state_meta() returned (raise if it does not fit)."""


class SelectorState:
    """A selector as a Stateful component: all of its state is metadata."""

    def __init__(self, selector: Selector) -> None:
        self.selector = selector

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_meta(self) -> dict[str, Any]:
        return self.selector.state_dict()

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.selector.load_state_dict(meta)


@dataclass(frozen=True)
class Saved:
    """A complete save: its number (increasing with every save) and the drafters' version in it."""

    sequence: int
    drafter_version: int  # learning updates applied to the drafters when it was saved


class StateStore:
    """Saves and restores named components under one directory, keeping the newest `keep` complete saves."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = keep
        self._delay_s = float(os.environ.get(SAVE_DELAY_ENV, "0"))

    def save(self, components: Mapping[str, Stateful], drafter_version: int) -> Saved:
        """Write every component's state as the next save, then drop partial saves and all but the newest
        `keep` complete ones."""
        stems = {name: _file_stem(name) for name in components}
        if len(set(stems.values())) < len(stems):
            raise EvospecError(f"component names {sorted(components)} would share files")
        files: dict[str, bytes] = {}
        for name, component in components.items():
            tensors = {key: value.detach().cpu().contiguous() for key, value in component.state_tensors().items()}
            files[f"{stems[name]}.safetensors"] = safetensors.torch.save(tensors)
            files[f"{stems[name]}.json"] = json.dumps(component.state_meta(), allow_nan=False).encode()
        earlier = self._saves()
        sequence = earlier[-1][0] + 1 if earlier else 1  # never reuse the number of a partial save
        folder = self.directory / f"{sequence:08d}"
        folder.mkdir(parents=True)
        for filename, data in files.items():
            write_atomically(folder / filename, data, durable=True)
            time.sleep(self._delay_s)
        manifest = {
            "format": FORMAT,
            "sequence": sequence,
            "drafter_version": drafter_version,
            "saved_at": time.time(),
            "components": sorted(components),
            "sha256": {name: _sha256(data) for name, data in files.items()},
        }
        write_atomically(folder / MANIFEST, json.dumps(manifest, indent=1), durable=True)
        complete = [path for _, path in earlier if (path / MANIFEST).exists()]
        kept = complete[len(complete) - self.keep + 1 :] if self.keep > 1 else []
        for _, old in earlier:
            if old not in kept:  # partial saves go too
                shutil.rmtree(old, ignore_errors=True)
        return Saved(sequence, drafter_version)

    def load(self, components: Mapping[str, Stateful]) -> Saved | None:
        """Restore the components from the newest complete save; None when there is none.

        A component that the save lacks, or whose saved state does not fit it (other drafters than
        last time), starts fresh, with a warning."""
        for _, folder in reversed(self._saves()):
            try:
                manifest, states = _read_save(folder)
            except (OSError, ValueError, KeyError, TypeError, SafetensorError) as error:
                log.warning("skipping state %s: %s", folder, error)
                continue
            for name, component in components.items():
                if name not in states:
                    log.warning("state %s has nothing for %s; it starts fresh", folder, name)
                    continue
                try:
                    component.load_state(*states[name])
                except (EvospecError, ValueError, KeyError, TypeError) as error:
                    log.warning("state of %s in %s does not fit; it starts fresh: %s", name, folder, error)
            return Saved(manifest["sequence"], manifest["drafter_version"])
        return None

    def _saves(self) -> list[tuple[int, Path]]:
        """(sequence, directory) of every save, complete or not, oldest first."""
        if not self.directory.is_dir():
            return []
        saves = (path for path in self.directory.iterdir() if path.name.isdigit() and path.is_dir())
        return sorted((int(path.name), path) for path in saves)


def _read_save(folder: Path) -> tuple[dict[str, Any], dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]]]:
    """The manifest and each component's (tensors, meta) of one save; raises if anything is missing or altered."""
    path = folder / MANIFEST
    if not path.exists():
        raise ValueError("no manifest: the save did not finish")
    manifest = json.loads(path.read_bytes())
    if manifest["format"] != FORMAT:
        raise ValueError(f"format {manifest['format']}, this version reads {FORMAT}")
    data = {name: (folder / name).read_bytes() for name in manifest["sha256"]}
    altered = sorted(name for name, digest in manifest["sha256"].items() if _sha256(data[name]) != digest)
    if altered:
        raise ValueError(f"checksum mismatch in {', '.join(altered)}")
    stems = {name: _file_stem(name) for name in manifest["components"]}
    states = {
        name: (safetensors.torch.load(data[f"{stem}.safetensors"]), json.loads(data[f"{stem}.json"]))
        for name, stem in stems.items()
    }
    return manifest, states


def _file_stem(name: str) -> str:
    """A component's name as a file name: 'learner:lora:qwen' -> 'learner_lora_qwen'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
