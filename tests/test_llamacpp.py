"""The llama.cpp backend on smollm2-135m-instruct's own GGUF file, for every drafter and long drafts.

llama.cpp's CPU kernels are not batch-invariant, and how a multi-row forward rounds differs between
processors, so no test here compares two kernel paths bit for bit:
- the default mode (a verification in one call) is checked by re-scoring: every emitted token is the
  target's argmax when the output is fed one token a step, or within GAP of it;
- exact mode (rows computed as one-token steps) must equal evospec's own plain decoding, which runs
  the same one-token kernel on the same context settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evospec import engine as engine_module
from evospec.bench.traces import collect_traces
from evospec.config import GenerationConfig, LoadConfig
from evospec.cost import ForwardCost
from evospec.drafters import NgramDrafter, PredictionDrafter, SmallLMDrafter, SuffixDrafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.generation import TextGenerator, build_engine, encode_prompt
from evospec.models.backend import LoadedModel
from evospec.models.hf import CachedLM
from evospec.models.llamacpp import LlamaCppModel
from evospec.models.loading import load_model
from evospec.models.replay import Recording
from evospec.reasoning import StepConfig, StepSpeculator
from evospec.rescore import greedy_gaps
from evospec.stats import SpecStats
from evospec.types import Verdict
from evospec.verify import verify

from conftest import Never

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of France? Answer in one sentence.",
    "Repeat after me exactly: one two three four five six seven eight nine ten.",
    "List three colours of the rainbow, one per line.",
    "Summarize: The cat sat on the mat. The cat was happy on the mat. The mat was red.",
]
MAX_NEW = 32
DRAFTERS = ["none", "ngram", "suffix", "prediction", "self"]
# How far below the argmax a one-call verification's choice may score under one-token steps. The
# rounding of a multi-row forward moved logits by up to 0.23 here (smollm2 Q4_1, qwen2.5-coder-1.5b
# Q4_K_M, AVX512); a verifier that accepts a token the target did not choose leaves gaps of 5-15.
GAP = 1.0


@pytest.fixture(scope="module")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m-instruct", backend="llamacpp")


@pytest.fixture(scope="module")
def exact_smollm() -> LoadedModel:
    return load_model("smollm2-135m-instruct", "llamacpp", LoadConfig(exact_verify=True))


@pytest.fixture(scope="module")
def plain(smollm) -> dict[str, list[int]]:
    """evospec's plain decoding of each chat prompt: one-token steps, the context settings of every test."""
    generator = TextGenerator(smollm, build_engine(smollm, []))
    return {
        prompt: generator.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW), chat=True).token_ids
        for prompt in PROMPTS
    }


def edited_prediction(model: LoadedModel, output: list[int]) -> str:
    """The output's text with a word replaced and one inserted: a prediction that is mostly right."""
    words = model.tokenizer.decode(output, skip_special_tokens=True).split(" ")
    words[len(words) // 3] = "banana"
    words.insert(2 * len(words) // 3, "indeed")
    return " ".join(words)


def generator_for(model: LoadedModel, kind: str) -> TextGenerator:
    drafter = {
        "none": lambda: None,
        "ngram": NgramDrafter,
        "suffix": SuffixDrafter,
        "prediction": PredictionDrafter,
        "self": lambda: SmallLMDrafter(model.new_lm(), "self"),
    }[kind]()
    return TextGenerator(model, build_engine(model, [drafter] if drafter else []))


def test_loads_the_gguf_file_directly(smollm):
    assert smollm.backend.name == "llamacpp" and smollm.source.suffix == ".gguf"
    assert smollm.model.vocab_size == len(smollm.tokenizer.get_vocab()) == 49152
    assert smollm.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm.eos_token_ids


def test_a_build_with_amx_kernels_is_refused_before_it_can_crash(monkeypatch):
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    assert b"AMX_INT8 = 1" not in info, "the Makefile builds llama.cpp without its AMX kernels"
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info + b" AMX_INT8 = 1 |")
    with pytest.raises(EvospecError, match="AMX kernels"):
        LlamaCppModel(Path("never-opened.gguf"))


@pytest.mark.parametrize("k", [3, 64])
@pytest.mark.parametrize("drafter_kind", DRAFTERS)
def test_exact_mode_equals_plain_decoding(exact_smollm, smollm, plain, drafter_kind, k):
    generator = generator_for(exact_smollm, drafter_kind)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k)
    for prompt in PROMPTS:
        prediction = edited_prediction(smollm, plain[prompt]) if drafter_kind == "prediction" else None
        result = generator.generate(prompt, config, chat=True, prediction=prediction)
        assert result.token_ids == plain[prompt], prompt
        if drafter_kind == "self":  # a model drafting for itself is always right
            assert result.stats.num_accepted_tokens == result.stats.num_draft_tokens > 0


@pytest.mark.parametrize("k", [8, 32, 64])
@pytest.mark.parametrize("drafter_kind", DRAFTERS)
def test_every_token_of_a_one_call_verification_is_the_targets_choice(smollm, plain, drafter_kind, k):
    generator = generator_for(smollm, drafter_kind)
    rescorer = smollm.new_lm()
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k)
    for prompt in PROMPTS:
        prediction = edited_prediction(smollm, plain[prompt]) if drafter_kind == "prediction" else None
        result = generator.generate(prompt, config, chat=True, prediction=prediction)
        assert len(result.token_ids) == len(plain[prompt]) or result.token_ids[-1] in smollm.eos_token_ids
        assert float(greedy_gaps(rescorer, result.prompt_ids, result.token_ids).max()) <= GAP, prompt


def test_rescoring_catches_a_verifier_that_accepts_one_token_too_many(smollm, monkeypatch):
    def accepts_one_more(logits, draft, sampler) -> Verdict:
        verdict = verify(logits, draft, sampler)
        if verdict.num_accepted == draft.size:
            return verdict
        accepted = verdict.num_accepted + 1  # the first rejected draft token slips through
        return Verdict(
            accepted, [*draft.tokens[:accepted].tolist(), int(logits[accepted].argmax())], verdict.target_argmax
        )

    monkeypatch.setattr(engine_module, "verify", accepts_one_more)
    generator = generator_for(smollm, "ngram")
    rescorer = smollm.new_lm()
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=8)
    gaps = [
        float(greedy_gaps(rescorer, result.prompt_ids, result.token_ids).max())
        for result in (generator.generate(prompt, config, chat=True) for prompt in PROMPTS)
    ]
    assert max(gaps) > 4 * GAP, gaps


def test_an_exact_verification_row_equals_a_one_token_step(exact_smollm):
    """Exact mode: rows of one verification (chunked past exact_rows) are bit-identical to one-token
    steps, after a trim."""
    lm = exact_smollm.new_lm()
    ids = encode_prompt(exact_smollm, PROMPTS[0], chat=True)
    lm.forward(ids, num_logits=1)
    tail = ids[:12]
    batched = lm.forward(tail).clone()
    assert batched.shape == (12, exact_smollm.model.vocab_size)
    lm.trim(len(ids))
    assert lm.length == len(ids)
    stepped = torch.cat([lm.forward([token]).clone() for token in tail])
    assert torch.equal(batched, stepped)


def test_a_long_draft_is_verified_in_one_call(smollm, monkeypatch):
    lm = smollm.new_lm()
    calls = []
    decode = smollm.model._lib.llama_decode
    monkeypatch.setattr(smollm.model._lib, "llama_decode", lambda *args: calls.append(1) or decode(*args))
    lm.forward(encode_prompt(smollm, PROMPTS[0], chat=True), num_logits=1)
    calls.clear()
    assert lm.forward(list(range(100, 165))).shape == (65, smollm.model.vocab_size) and calls == [1]


def test_hidden_states_come_with_the_same_logits(smollm):
    ids = encode_prompt(smollm, PROMPTS[1], chat=True)
    plain_lm = smollm.new_lm()
    plain_lm.forward(ids[:-4], num_logits=1)
    logits = plain_lm.forward(ids[-4:]).clone()
    white_box = smollm.new_lm(hidden_states=True)
    white_box.forward(ids[:-4], num_logits=1)
    same_logits, hidden = white_box.forward_with_hidden(ids[-4:])
    assert torch.equal(same_logits, logits)
    assert hidden.shape == (4, smollm.model.hidden_size) and hidden.abs().sum() > 0
    # A prefill that asks for the last row only: a context with hidden states on outputs every row
    # of the call, and the last one must still be the one returned.
    plain_lm.reset()
    white_box.reset()
    last = plain_lm.forward(ids, num_logits=1).clone()
    same_last, last_hidden = white_box.forward_with_hidden(ids, num_logits=1)
    assert torch.allclose(same_last, last, atol=1e-4) and last_hidden.shape == (1, smollm.model.hidden_size)
    every_row, every_hidden = white_box.forward_with_hidden(ids[:3], num_logits=3)
    assert every_row.shape[0] == every_hidden.shape[0] == 3


def test_a_prompt_pass_reads_every_chunk_of_a_long_prompt(smollm):
    """A prompt longer than llama.cpp's batch: every token's hidden state and top tokens, in order."""
    ids = (encode_prompt(smollm, PROMPTS[0], chat=True) * 40)[:700]
    assert len(ids) > smollm.model.config.batch_size
    white_box = smollm.new_lm(hidden_states=True)
    passed = white_box.forward_prompt(ids, top_k=8, rows=1024)
    assert passed.hidden.shape == (
        700,
        smollm.model.hidden_size,
    ) and passed.top_ids.shape == passed.top_probs.shape == (700, 8)
    assert white_box.length == 700
    white_box.reset()
    last, last_hidden = white_box.forward_with_hidden(ids, num_logits=1)
    assert torch.equal(passed.logits, last) and torch.equal(passed.hidden[-1:], last_hidden)
    white_box.reset()
    logits, hidden = white_box.forward_with_hidden(ids[:300], num_logits=300)  # one call: the first chunk's rows
    assert torch.equal(passed.hidden[:300], hidden)
    assert torch.equal(passed.top_ids[:300], logits.topk(8).indices)
    white_box.reset()
    last_rows = white_box.forward_prompt(ids, top_k=8, rows=250)  # from inside the first chunk on
    assert torch.equal(last_rows.logits, passed.logits) and torch.equal(last_rows.hidden, passed.hidden[-250:])
    assert torch.equal(last_rows.top_ids, passed.top_ids[-250:]) and white_box.length == 700


def test_a_small_lm_drafter_on_llamacpp_is_lossless_with_early_stop(exact_smollm, plain):
    target = exact_smollm.new_lm()
    engine = Engine(
        target,
        [SmallLMDrafter(exact_smollm.new_lm(), "self")],
        exact_smollm.eos_token_ids,
        exact_smollm.model.context_length,
    )
    prompt_ids = encode_prompt(exact_smollm, PROMPTS[2], chat=True)
    tokens = engine.generate(prompt_ids, GenerationConfig(max_new_tokens=MAX_NEW), SpecStats())
    taken = [next(tokens) for _ in range(6)]
    tokens.close()
    assert taken == plain[PROMPTS[2]][:6]
    assert target.length == len(prompt_ids) + len(taken) - 1


def test_a_collection_keeps_each_positions_own_hidden_state(smollm, tmp_path):
    """Rows written while decoding are each step's own (a backend's buffers are overwritten by the
    next step): every row points where one pass of the target over prompt + answer points, within the
    rounding of one-token steps against a long forward."""
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(PROMPTS[:2]) + "\n")
    traces = collect_traces(smollm, str(data), 2, 16, tmp_path / "traces", progress=False)
    recording = Recording(traces.answers, smollm.vocab_size, ForwardCost((0.01,) * 2), smollm)
    for index, answer in enumerate(traces.answers):
        kept = load_file(traces.rows_path(index))["hidden"]
        made = recording.rows_of(index, hidden=True).hidden
        assert kept.shape == made.shape == (len(answer.tokens), smollm.hidden_size)
        assert torch.nn.functional.cosine_similarity(kept, made).min() > 0.98


def test_exact_forks_decode_side_by_side_as_one_token_steps(exact_smollm):
    """Exact mode: forks fed more tokens together than one-token kernels take at once still compute
    every row as a one-token step on a context of its own computes it, bit for bit."""
    prompt = exact_smollm.tokenizer.encode(PROMPTS[0])
    trunk = exact_smollm.new_lm(branches=2)
    trunk.forward(prompt)
    lengths, fed = [len(prompt), len(prompt) - 3], [[prompt[-1], prompt[-2], prompt[-3]], prompt[-3:]]
    forks = [trunk.fork(length) for length in lengths]
    together = trunk.forward_branches(forks, fed)
    for length, tokens, logits in zip(lengths, fed, together):
        alone = exact_smollm.new_lm()
        alone.forward(prompt[:length])
        assert torch.equal(logits, torch.cat([alone.forward([token]).clone() for token in tokens]))


def test_exact_lookahead_rounds_following_the_target_are_plain_decoding(exact_smollm):
    """Exact mode with Lookahead Reasoning's rounds: the trunk's pass over the drafted steps, the forks'
    side-by-side calls and the kept steps read again are each computed as one-token steps, so following
    the target gives plain decoding token for token. The drafter, the real model with its weights
    perturbed, parts from the target within most steps, so that forks write them. (Adopting a fork's
    cells instead of reading its step again parts from plain decoding within 64 tokens here.)"""
    drafter = load_model("smollm2-135m-instruct", "hf", LoadConfig(dtype="fp32")).model
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in drafter.parameters():
            weight.add_(0.05 * weight.std() * torch.randn(weight.shape, generator=generator))
    steps = StepConfig(follow_target=True, lookahead=3, max_step_tokens=8)
    speculator = StepSpeculator(exact_smollm, SmallLMDrafter(CachedLM(drafter), "perturbed"), Never(), steps)
    fork_calls = []
    forward_branches = speculator.trunk.forward_branches

    def counted(branches, token_ids):
        fork_calls.append(len(branches))
        return forward_branches(branches, token_ids)

    speculator.trunk.forward_branches = counted
    plain = build_engine(exact_smollm, [])
    config = GenerationConfig(max_new_tokens=2 * MAX_NEW)
    for prompt in [*PROMPTS, "Explain why the sky is blue in three sentences."]:
        prompt_ids = encode_prompt(exact_smollm, prompt, chat=True)
        expected = list(plain.generate(prompt_ids, config, SpecStats()))
        assert list(speculator.generate(prompt_ids, config, SpecStats())) == expected, prompt
    assert len(fork_calls) >= len(PROMPTS) and max(fork_calls) > 1  # forks, several side by side


def test_forks_of_a_llamacpp_cache_decode_side_by_side_as_each_would_alone(smollm):
    """Sequences of one context: a fork shares its prefix's cells, and forks decode several tokens
    each in one call as each would on a context of its own (llama.cpp rounds a batch differently:
    close, same argmax); a trimmed fork goes on from what it kept."""
    prompt = smollm.tokenizer.encode(PROMPTS[0])
    trunk = smollm.new_lm(branches=2)
    trunk.forward(prompt)
    lengths, fed = [len(prompt), len(prompt) - 3], [[prompt[-1], prompt[-2], prompt[-3]], [prompt[-4]]]
    forks = [trunk.fork(length) for length in lengths]
    together = [logits.clone() for logits in trunk.forward_branches(forks, fed)]
    for length, tokens, logits in zip(lengths, fed, together):
        alone = smollm.new_lm()
        alone.forward(prompt[:length])
        expected = alone.forward(tokens)
        assert logits.shape == expected.shape
        assert torch.equal(logits.argmax(-1), expected.argmax(-1)) and torch.allclose(logits, expected, atol=0.5)
    trunk.trim_branch(forks[0], len(prompt) + 1)  # keep the first token fed
    (again,) = trunk.forward_branches(forks[:1], [[prompt[-5]]])
    alone = smollm.new_lm()
    alone.forward(prompt + [prompt[-1]])
    expected = alone.forward([prompt[-5]])[0]
    assert again[0].argmax() == expected.argmax() and torch.allclose(again[0], expected, atol=0.5)
    trunk.drop(forks[1])
    trunk.adopt(forks[0])  # the trunk goes on from the fork's cells; its sequence is free again
    assert trunk.length == len(prompt) + 2
    (after,) = trunk.forward([prompt[-6]])
    expected = alone.forward([prompt[-6]])[0]
    assert after.argmax() == expected.argmax() and torch.allclose(after, expected, atol=0.5)
    with pytest.raises(EvospecError, match="every branch"):
        [trunk.fork(1) for _ in range(3)]
