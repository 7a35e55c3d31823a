"""The llama.cpp backend: a GGUF model run by llama.cpp through llama-cpp-python's C bindings.

One `llama_decode` call evaluates the pending token plus the whole draft with logits at every
position; a rejected draft is forgotten by removing its positions from the KV cache. Logits come back
as a torch view of llama.cpp's own output buffer (no copy), valid until the next forward. The weights
are loaded repacked (llama.cpp's default "extra buffer types", what llama-cpp-python's own
completion runs).

A long forward costs far less per token than one-token steps on a CPU, and verifying a draft in one
call is where speculation pays there. llama.cpp's CPU kernels are not batch-invariant: a repacked
matmul computes up to 3 rows with the one-token kernel and 4 or more with a blocked kernel that rounds
differently, and past 256 cached tokens a one-token step sums attention in another order. So a
verification's rows may differ from one-token steps in the last bits, and near-ties can part; the
emitted tokens are still the target's own choice in the pass that verified them, as in llama.cpp's
and vLLM's speculative decoding. `exact_verify` cuts verifications (and forks' side-by-side calls)
into calls of at most `exact_rows` instead, so that each row is computed by the one-token kernel, as
plain decoding computes it. Attention also sums the cache's cells in their order in the cache, so
exact mode never adopts a fork's cells, which lie after cells the cache has freed (`can_adopt`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from evospec.config import LoadConfig
from evospec.errors import EvospecError
from evospec.machine import default_threads
from evospec.models.backend import LoadedModel, MeasuredBackend
from evospec.models.hf import default_device, from_pretrained, gguf_cache_dir
from evospec.models.zoo import ZOO, convert_tokenizer, pull, tokenizer_dir
from evospec.target import PromptPass, top_next_tokens

SEQUENCE = 0  # the cache's own tokens live in sequence 0; its branches in sequences 1, 2, ...


@dataclass(frozen=True)
class LlamaCppConfig:
    """How llama.cpp contexts are made. Each default is defined here, once."""

    max_context: int = 8192  # KV cache size cap; the model's training context if that is smaller
    batch_size: int = 512  # tokens per llama_decode call (a longer prompt is fed in chunks)
    threads: int | None = None  # None: every core this process may run on
    # llama.cpp's repacked weights ("extra buffer types"): faster at every batch size measured (benchmarks/README.md)
    repack: bool = True
    exact_verify: bool = False  # verify in calls of at most exact_rows rows, each computed as a one-token step
    exact_rows: int = 3  # a repacked matmul rounds differently from 4 rows on


def _bindings():
    """The llama_cpp module; a clear error when it is not installed."""
    try:
        import llama_cpp
    except ImportError as error:
        raise EvospecError(
            "the llama.cpp backend needs llama-cpp-python (`pip install llama-cpp-python`), or use --backend hf"
        ) from error
    if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
        # Its first matmul would take the process down (ggml_backend_amx_mul_mat, ggml-org/llama.cpp#20824).
        raise EvospecError(
            "this llama-cpp-python was built with llama.cpp's AMX kernels, which crash on this CPU "
            "(ggml-org/llama.cpp#20824); rebuild it without them: `make install` in a fresh checkout does, "
            "or `pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36` with the CMAKE_ARGS "
            "the Makefile sets for a CPU with AMX"
        )
    return llama_cpp


class LlamaCppModel:
    """The weights of one GGUF file, loaded once (memory-mapped); `new_lm()` makes a context with its own cache."""

    def __init__(self, gguf_file: Path, config: LlamaCppConfig = LlamaCppConfig()) -> None:
        lib = _bindings()
        lib.llama_backend_init()
        lib.llama_log_set(_SILENT_LOG, ctypes.c_void_p())  # llama.cpp logs every load to stderr otherwise
        params = lib.llama_model_default_params()
        params.use_extra_bufts = config.repack
        self._lib = lib
        self.path = gguf_file
        self.config = config
        self.handle = lib.llama_model_load_from_file(str(gguf_file).encode(), params)
        if not self.handle:
            raise EvospecError(f"{gguf_file}: llama.cpp could not load this GGUF file")
        vocab = lib.llama_model_get_vocab(self.handle)
        self.vocab_size = lib.llama_vocab_n_tokens(vocab)
        self.hidden_size = lib.llama_model_n_embd(self.handle)
        self.context_length = min(lib.llama_model_n_ctx_train(self.handle), config.max_context)
        self.eog_token_ids = frozenset(t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(vocab, t))

    @property
    def threads(self) -> int:
        """The CPU threads its contexts compute with."""
        return self.config.threads or default_threads()

    def new_lm(self, hidden_states: bool = False, branches: int = 0) -> LlamaCppLM:
        """A fresh context over these weights; hidden_states turns on llama.cpp's per-token embeddings
        output; branches: how many forks of the cache may live at once (sequences of the context)."""
        return LlamaCppLM(self, hidden_states, branches)

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_model_free(self.handle)
            self.handle = None


@dataclass
class Branch:
    """A fork of a LlamaCppLM's cache: a sequence of its context holding `length` tokens, the first
    ones shared with the cache it forked from (a unified KV cache stores a shared cell once)."""

    sequence: int
    length: int


class LlamaCppLM:
    """A llama.cpp context holding the first `length` tokens of one sequence: the llama.cpp CachedLM.
    With branches, forks of it decode side by side in one llama_decode call (forward_branches)."""

    def __init__(self, model: LlamaCppModel, hidden_states: bool = False, branches: int = 0) -> None:
        lib = model._lib
        params = lib.llama_context_default_params()
        params.n_ctx = model.context_length
        params.n_batch = params.n_ubatch = model.config.batch_size
        params.n_threads = params.n_threads_batch = model.threads
        params.n_seq_max = 1 + branches
        params.kv_unified = branches > 0  # one cache for every sequence: a fork shares its prefix's cells
        params.embeddings = hidden_states
        if hidden_states:
            params.pooling_type = lib.LLAMA_POOLING_TYPE_NONE  # one hidden state per token, not pooled
        self._lib = lib
        self.model = model  # keeps the weights alive as long as the context
        self.handle = lib.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise EvospecError(f"{model.path}: llama.cpp could not create a context of {params.n_ctx} tokens")
        self._memory = lib.llama_get_memory(self.handle)
        self._batch = lib.llama_batch_init(model.config.batch_size, 0, 1)
        self._hidden_states = hidden_states
        self.length = 0
        self._last_call_tokens = 0  # tokens in the last llama_decode call (its outputs are found by batch index)
        self._free_sequences = list(range(branches, SEQUENCE, -1))  # popped lowest first
        # An adopted branch's cells sit after those the cache freed, which its next tokens fill first, and
        # attention sums cells in their order: exact verification reads a branch's tokens again instead.
        self.can_adopt = not model.config.exact_verify

    def reset(self) -> None:
        """Forget every cached token."""
        self._lib.llama_memory_clear(self._memory, True)
        self.length = 0

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        """Append token_ids [n] to the cache -> logits [n, V] float32 (the last num_logits rows only, if > 0).

        With every row asked for (a verification), the tokens go in one call (of at most `exact_rows`
        with exact_verify). The tensor views llama.cpp's output buffer when one call sufficed: use it
        before the next forward.
        """
        return self._forward(token_ids, num_logits, hidden=False)[0]

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Like forward -> (logits [r, V], final hidden states [r, H]) at the last r = num_logits rows (all if 0).

        Needs a context made with hidden_states. The hidden states are what the output layer reads.
        """
        self._require_hidden_states()
        return self._forward(token_ids, num_logits, hidden=True)

    def forward_prompt(self, token_ids: Sequence[int], top_k: int, rows: int) -> PromptPass:
        """Append a prompt -> PromptPass (needs a context made with hidden states).

        With embeddings on, llama.cpp computes every token's outputs whatever the batch asks (see
        _outputs), so reading the last `rows` after each chunk of the prompt costs only their top-k.
        """
        self._require_hidden_states()
        first_row = max(0, len(token_ids) - rows)
        hidden, ids, probs = [], [], []
        for start in range(0, len(token_ids), self.model.config.batch_size):
            chunk = token_ids[start : start + self.model.config.batch_size]
            self._decode(chunk, self.model.config.batch_size, first_output=0)
            wanted = start + len(chunk) - max(start, first_row)
            if wanted <= 0:
                continue
            logits, states = self._outputs(wanted, hidden=True)
            top_ids, top_probs = top_next_tokens(logits, top_k)
            hidden.append(states.clone())  # the next call overwrites the buffers
            ids.append(top_ids)
            probs.append(top_probs)
        return PromptPass(logits[-1:].clone(), torch.cat(hidden), torch.cat(ids), torch.cat(probs))

    def _require_hidden_states(self) -> None:
        if not self._hidden_states:
            raise EvospecError("this llama.cpp context was made without hidden states (new_lm(hidden_states=True))")

    def _forward(
        self, token_ids: Sequence[int], num_logits: int, hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = len(token_ids)
        if num_logits > 0:  # a prefill or catch-up: big chunks, outputs only at the end
            rows = min(num_logits, n)
            self._decode(token_ids, self.model.config.batch_size, first_output=n - rows)
            return self._outputs(rows, hidden)
        config = self.model.config
        chunk = config.exact_rows if config.exact_verify else config.batch_size
        if n <= chunk:
            self._decode(token_ids, chunk, first_output=0)
            return self._outputs(n, hidden)
        parts = []
        for start in range(0, n, chunk):
            self._decode(token_ids[start : start + chunk], chunk, first_output=0)
            # The next call overwrites the buffers.
            parts.append([None if t is None else t.clone() for t in self._outputs(min(chunk, n - start), hidden)])
        logits, states = zip(*parts)
        return torch.cat(logits), torch.cat(states) if hidden else None

    def _outputs(self, rows: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last call's outputs at its last `rows` tokens: logits [rows, V] and, if asked, hidden
        states [rows, H], viewed in place.

        Rows are found by batch index: a context with embeddings on may output every token of a
        call, whatever the batch asked, so "the first output row" need not be the first asked for.
        """
        first = self._last_call_tokens - rows
        if first < 0:
            raise EvospecError(
                f"asked for the outputs of {rows} tokens; one llama_decode call holds {self._last_call_tokens}"
            )
        logits = self._lib.llama_get_logits_ith(self.handle, first)
        logits = torch.from_numpy(np.ctypeslib.as_array(logits, shape=(rows, self.model.vocab_size)))
        if not hidden:
            return logits, None
        states = self._lib.llama_get_embeddings_ith(self.handle, first)
        return logits, torch.from_numpy(np.ctypeslib.as_array(states, shape=(rows, self.model.hidden_size)))

    def trim(self, length: int) -> None:
        """Keep the first `length` cached tokens."""
        if length < self.length:
            self._lib.llama_memory_seq_rm(self._memory, SEQUENCE, length, -1)
            self.length = length

    def fork(self, length: int) -> Branch:
        """A branch holding the first `length` cached tokens (no copy: the cells are shared)."""
        if not self._free_sequences:
            raise EvospecError("every branch of this llama.cpp context is in use (new_lm(branches=...) sets how many)")
        if not 0 < length <= self.length:
            raise EvospecError(f"a branch forks from 1..{self.length} cached tokens, not {length}")
        branch = Branch(self._free_sequences.pop(), length)
        self._lib.llama_memory_seq_cp(self._memory, SEQUENCE, branch.sequence, 0, length)
        return branch

    def forward_branches(self, branches: Sequence[Branch], token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append token_ids[i] to branches[i], all in one call (in calls of at most `exact_rows` with
        exact_verify) -> logits [len(token_ids[i]), V] a branch, views of llama.cpp's output buffer
        when one call sufficed (use them before the next forward)."""
        config = self.model.config
        sizes = [len(tokens) for tokens in token_ids]
        if sum(sizes) > config.batch_size:
            raise EvospecError(f"{sum(sizes)} branch tokens do not fit one call of {config.batch_size}")
        fed = [(branch, token) for branch, tokens in zip(branches, token_ids, strict=True) for token in tokens]
        chunk = config.exact_rows if config.exact_verify else len(fed)
        if len(fed) <= chunk:
            self._decode_branches(fed)
            return list(self._outputs(len(fed), hidden=False)[0].split(sizes))
        parts = []
        for start in range(0, len(fed), chunk):
            self._decode_branches(fed[start : start + chunk])
            parts.append(self._outputs(self._last_call_tokens, hidden=False)[0].clone())  # the next call overwrites it
        return list(torch.cat(parts).split(sizes))

    def _decode_branches(self, fed: Sequence[tuple[Branch, int]]) -> None:
        """One llama_decode call of (branch, token) pairs, each token at its branch's next position."""
        batch = self._batch
        batch.n_tokens = len(fed)
        for i, (branch, token) in enumerate(fed):
            batch.token[i] = token
            batch.pos[i] = branch.length
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = branch.sequence
            batch.logits[i] = True
            branch.length += 1
        status = self._lib.llama_decode(self.handle, batch)
        if status != 0:
            raise EvospecError(f"llama_decode of {len(fed)} branch tokens failed with status {status}")
        self._last_call_tokens = len(fed)

    def trim_branch(self, branch: Branch, length: int) -> None:
        """Keep a branch's first `length` tokens."""
        if length < branch.length:
            self._lib.llama_memory_seq_rm(self._memory, branch.sequence, length, -1)
            branch.length = length

    def drop(self, branch: Branch) -> None:
        """Forget a branch; its sequence serves the next fork."""
        self._lib.llama_memory_seq_rm(self._memory, branch.sequence, -1, -1)
        self._free_sequences.append(branch.sequence)

    def adopt(self, branch: Branch) -> None:
        """Take a branch's cells as the cache's own (shared, not copied); its sequence serves the next fork."""
        self._lib.llama_memory_seq_rm(self._memory, SEQUENCE, -1, -1)
        self._lib.llama_memory_seq_cp(self._memory, branch.sequence, SEQUENCE, -1, -1)
        self.length = branch.length
        self.drop(branch)

    def _decode(self, token_ids: Sequence[int], chunk_size: int, first_output: int) -> None:
        """Feed token_ids in calls of at most chunk_size; positions from first_output on produce outputs."""
        batch = self._batch
        for start in range(0, len(token_ids), chunk_size):
            chunk = token_ids[start : start + chunk_size]
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = self.length + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = SEQUENCE
                batch.logits[i] = start + i >= first_output
            status = self._lib.llama_decode(self.handle, batch)
            if status != 0:
                raise EvospecError(f"llama_decode failed with status {status} at position {self.length}")
            self.length += len(chunk)
            self._last_call_tokens = len(chunk)

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self.handle)
            self.handle = None


class GGUFTokens:
    """The token matrices of a GGUF file, rows dequantized on demand."""

    def __init__(self, model: LlamaCppModel) -> None:
        import gguf

        tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(model.path).tensors}
        self.vocab_size = model.vocab_size
        self._embedding = tensors["token_embd.weight"]
        self._output = tensors.get("output.weight", self._embedding)  # tied embeddings have no output

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return _dequantized_rows(self._embedding, ids)

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return _dequantized_rows(self._output, ids)


def _dequantized_rows(tensor, ids: torch.Tensor) -> torch.Tensor:
    import gguf

    rows = np.asarray(tensor.data)[ids.numpy()]
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(rows, tensor.tensor_type), dtype=np.float32))


def _is_gguf(spec: str) -> bool:
    return spec in ZOO or (spec.endswith(".gguf") and Path(spec).expanduser().is_file())


class LlamaCppBackend(MeasuredBackend):
    """llama.cpp: a GGUF file run as it is, on the CPU. The default for GGUF files and zoo aliases on a
    machine without a GPU."""

    name = "llamacpp"
    dtypes = ()
    baselines = ("llamacpp-plain", "llamacpp-lookup")

    def default_for(self, spec: str) -> bool:
        return _is_gguf(spec) and default_device().type == "cpu"

    def can_run(self, spec: str) -> bool:
        return _is_gguf(spec)

    def load(self, spec: str, config: LoadConfig) -> LoadedModel:
        """A GGUF file (a zoo alias pulled first), with its extracted tokenizer."""
        if config.dtype is not None:
            raise EvospecError("--dtype applies to the hf backend; llama.cpp runs the GGUF file's own quantization")
        if spec in ZOO:
            gguf_file, tokenizer_source = pull(spec), tokenizer_dir(spec)
        else:
            gguf_file = Path(spec).expanduser()
            if not (gguf_file.is_file() and gguf_file.suffix == ".gguf"):
                raise EvospecError(
                    f"{spec!r}: the llama.cpp backend needs a .gguf file or a zoo alias ({', '.join(ZOO)})"
                )
            tokenizer_source = gguf_cache_dir(gguf_file) / "tokenizer"
            if not tokenizer_source.is_dir():
                convert_tokenizer(gguf_file, tokenizer_source)
        tokenizer = from_pretrained(AutoTokenizer, spec, tokenizer_source)
        model = LlamaCppModel(gguf_file, LlamaCppConfig(exact_verify=config.exact_verify))
        return LoadedModel(
            spec,
            model,
            tokenizer,
            gguf_file,
            self,
            model.vocab_size,
            model.hidden_size,
            model.context_length,
            model.eog_token_ids,
        )

    def new_lm(self, model: LlamaCppModel, hidden_states: bool, branches: int) -> LlamaCppLM:
        return model.new_lm(hidden_states, branches)

    def token_matrices(self, model: LlamaCppModel) -> GGUFTokens:
        return GGUFTokens(model)

    def weights_format(self, model: LlamaCppModel) -> str:
        return "gguf"

    def cost_key(self, loaded: LoadedModel) -> str:
        return f"{self.name}|{loaded.model.path.resolve()}|{loaded.model.config}"  # its settings shape each call

    def threads(self, model: LlamaCppModel) -> int:
        return model.threads


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _SILENT_LOG(level, text, user_data):  # noqa: N802 (a C callback object)
    """Drops llama.cpp's log lines; errors surface as return codes instead."""
