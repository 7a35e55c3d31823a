"""The hf backend: any Hugging Face causal LM through PyTorch (transformers), on the GPU when there is one.

A zoo alias or a GGUF file is converted once into dense weights (models/zoo.py); a hub id is read
from the local cache before the network.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from evospec.config import DEFAULT_DTYPE, DTYPES, LoadConfig
from evospec.errors import EvospecError
from evospec.files import evospec_home
from evospec.machine import default_threads
from evospec.models.backend import LoadedModel, MeasuredBackend
from evospec.models.quantize import Int8WeightLinear, quantize_int8_weights
from evospec.models.zoo import ZOO, convert_gguf, converted
from evospec.target import PromptPass, top_next_tokens

HEAD_ROWS_PER_CALL = 256  # prompt rows per output-layer call when a prefill scores every prompt token
# The dtype the weights load in; int8 then quantizes the linear layers' weights.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.bfloat16}
assert set(TORCH_DTYPES) == set(DTYPES)


class CachedLM:
    """The hf backend's LanguageModel. Wraps any Hugging Face causal LM; the cache holds the first
    `length` tokens of one sequence.

    forward() appends tokens to the cache and returns their logits; trim() drops tokens from the end,
    which is how a rejected draft is forgotten.
    """

    can_adopt = True  # a cache's tensors hold its tokens in order, whoever wrote them (BranchingLM)

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.length = 0

    def reset(self) -> None:
        """Forget every cached token."""
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        """Append token_ids [n] to the cache -> logits [n, V] on the CPU (the last num_logits rows only, if > 0)."""
        return self._forward(token_ids, num_logits, hidden_states=False).logits[0].cpu()

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Like forward, for drafters that read the model's features -> (logits [r, V], final hidden states [r, H])."""
        out = self._forward(token_ids, num_logits, hidden_states=True)
        rows = out.logits.shape[1]
        return out.logits[0].cpu(), out.hidden_states[-1][0, -rows:].cpu()

    def forward_prompt(self, token_ids: Sequence[int], top_k: int, rows: int) -> PromptPass:
        """Append a prompt -> PromptPass. The last token's logits are computed as forward(num_logits=1)
        computes them; the other rows' come from the output layer applied to the hidden states, a
        few hundred rows at a time (a prompt's full [n, V] logits would take gigabytes)."""
        out = self._forward(token_ids, 1, hidden_states=True)
        hidden = out.hidden_states[-1][0, -rows:]  # [r, H] on the model's device
        head = self.model.get_output_embeddings()
        with torch.inference_mode():
            tops = [
                top_next_tokens(head(hidden[start : start + HEAD_ROWS_PER_CALL]), top_k)
                for start in range(0, hidden.shape[0], HEAD_ROWS_PER_CALL)
            ]
        ids, probs = zip(*tops)
        return PromptPass(out.logits[0].cpu(), hidden.float().cpu(), torch.cat(ids).cpu(), torch.cat(probs).cpu())

    @torch.inference_mode()
    def _forward(self, token_ids: Sequence[int], num_logits: int, hidden_states: bool):
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(
            input_ids=input_ids,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=num_logits,
            output_hidden_states=hidden_states,
        )
        self.length += input_ids.shape[1]
        return out

    def trim(self, length: int) -> None:
        """Keep the first `length` cached tokens."""
        if length < self.length:
            self.cache.crop(length - self.length)  # crop takes the (negative) number of tokens to drop
            self.length = length

    def fork(self, length: int) -> CachedLM:
        """A copy of this cache holding its first `length` tokens."""
        if not 0 < length <= self.length:
            raise EvospecError(f"a branch forks from 1..{self.length} cached tokens, not {length}")
        branch = CachedLM(self.model)
        branch.cache = copy.deepcopy(self.cache)
        branch.length = self.length
        branch.trim(length)
        return branch

    def forward_branches(self, branches: Sequence[CachedLM], token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append token_ids[i] to branches[i] -> logits [len(token_ids[i]), V] a branch, one forward a
        branch (the branches' lengths differ, which one padded batch would have to mask)."""
        return [branch.forward(list(tokens)) for branch, tokens in zip(branches, token_ids, strict=True)]

    def trim_branch(self, branch: CachedLM, length: int) -> None:
        """Keep a branch's first `length` tokens."""
        branch.trim(length)

    def drop(self, branch: CachedLM) -> None:
        """Forget a branch (its cache is freed with it)."""
        branch.reset()

    def adopt(self, branch: CachedLM) -> None:
        """Take a branch's cache as this one's; the branch starts empty."""
        self.cache, self.length = branch.cache, branch.length
        branch.reset()


class DenseTokens:
    """The token matrices of a model in memory, indexed in place."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._embedding = model.get_input_embeddings().weight
        self._output = model.get_output_embeddings().weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._embedding[ids.to(self._embedding.device)].float().cpu()

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._output[ids.to(self._output.device)].float().cpu()  # indexing copies


def default_device() -> torch.device:
    """Where hf models run: the GPU when there is one, as in vLLM, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class HFBackend(MeasuredBackend):
    """PyTorch through transformers: any causal LM, dense weights in a torch dtype."""

    name = "hf"
    dtypes = DTYPES
    baselines = ("hf-plain", "hf-assisted")

    def default_for(self, spec: str) -> bool:
        return True  # whatever no other backend claims

    def can_run(self, spec: str) -> bool:
        return True

    def load(self, spec: str, config: LoadConfig) -> LoadedModel:
        if config.exact_verify:
            raise EvospecError(
                "--exact-verify applies to the llama.cpp backend; hf in fp32 verifies bit-exactly already"
            )
        dtype = config.dtype or DEFAULT_DTYPE
        device = default_device()
        if dtype == "int8" and device.type != "cpu":
            raise EvospecError("--dtype int8 is for CPUs without AVX512-BF16; on a GPU use bf16")
        source = resolve(spec)
        model = from_pretrained(AutoModelForCausalLM, spec, source, dtype=TORCH_DTYPES[dtype])
        if dtype == "int8":
            quantize_int8_weights(model)
        model.to(device)
        model.eval()
        model.requires_grad_(False)
        return self.wrap(spec, model, from_pretrained(AutoTokenizer, spec, source), source)

    def wrap(
        self, spec: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: Path | str
    ) -> LoadedModel:
        """A model in memory (in eval mode, without gradients) as a LoadedModel of this backend."""
        text = model.config.get_text_config()
        configured = model.generation_config.eos_token_id  # int or list
        configured = [] if configured is None else [configured] if isinstance(configured, int) else configured
        eos = frozenset({tokenizer.eos_token_id, *configured} - {None})  # the tokenizer's and the generation config's
        return LoadedModel(
            spec, model, tokenizer, source, self, text.vocab_size, text.hidden_size, text.max_position_embeddings, eos
        )

    def new_lm(self, model: PreTrainedModel, hidden_states: bool, branches: int) -> CachedLM:
        return CachedLM(model)  # its forks are copies, as many as asked

    def token_matrices(self, model: PreTrainedModel) -> DenseTokens:
        return DenseTokens(model)

    def weights_format(self, model: PreTrainedModel) -> str:
        if any(isinstance(module, Int8WeightLinear) for module in model.modules()):
            return "int8"
        return next(name for name, dtype in TORCH_DTYPES.items() if dtype == model.dtype)

    def cost_key(self, loaded: LoadedModel) -> str:
        source = loaded.source.resolve() if isinstance(loaded.source, Path) else loaded.source
        return f"{self.name}|{source}|{loaded.model.dtype}"

    def threads(self, model: PreTrainedModel) -> int:
        return torch.get_num_threads() if model.device.type == "cpu" else default_threads()


def resolve(spec: str) -> Path | str:
    """The Hugging Face directory (or hub id) that `spec` loads from, pulling or converting first if needed."""
    if spec in ZOO:
        return converted(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted(path)
    if path.exists():
        raise EvospecError(f"{spec}: not a model directory or a .gguf file")
    if looks_like_hub_id(spec):
        return spec
    raise EvospecError(f"{spec!r}: no such file or directory, and not a zoo alias ({', '.join(ZOO)})")


def looks_like_hub_id(spec: str) -> bool:
    """Hub ids are "org/name"; anything else that does not exist is a mistyped path or alias."""
    org, _, name = spec.partition("/")
    return bool(org and name) and "/" not in name and not spec.startswith((".", "~")) and not spec.endswith(".gguf")


def gguf_cache_dir(gguf_file: Path) -> Path:
    """Where what is derived from a GGUF file outside the zoo is cached."""
    # Keyed by path, size and mtime: hashing gigabytes on every load would cost more than it guards.
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return evospec_home() / "converted" / key


def _converted(gguf_file: Path) -> Path:
    """The Hugging Face directory converted from `gguf_file`, converting on first use."""
    dest = gguf_cache_dir(gguf_file) / "hf"
    return dest if dest.is_dir() else convert_gguf(gguf_file, dest)


def from_pretrained(auto_class, spec: str, source: Path | str, **kwargs):
    """`auto_class.from_pretrained(source)`, with the cache tried before the network for hub ids."""
    if isinstance(source, Path):
        try:
            return auto_class.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as error:
            raise EvospecError(f"{spec}: could not load from {source} ({error})") from error
    try:
        return auto_class.from_pretrained(source, local_files_only=True, **kwargs)
    except OSError:
        pass
    try:
        return auto_class.from_pretrained(source, **kwargs)
    except OSError as error:
        raise EvospecError(
            f"could not find {spec!r} locally, as a zoo alias ({', '.join(ZOO)}) or on the Hugging Face hub"
        ) from error
