"""The llama.cpp backend on smollm2-135m-instruct's own GGUF file: lossless against llama.cpp's own
greedy decoding (llama-cpp-python's `Llama.generate`), for every drafter, and the cache mechanics."""

from __future__ import annotations

import pytest
import torch

from evospec.config import GenerationConfig
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.generation import TextGenerator, build_engine, encode_prompt
from evospec.models.loading import eos_token_ids, load_model
from evospec.stats import SpecStats

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of France? Answer in one sentence.",
    "Repeat after me exactly: one two three four five six seven eight nine ten.",
    "List three colours of the rainbow, one per line.",
    "Summarize: The cat sat on the mat. The cat was happy on the mat. The mat was red.",
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m-instruct", backend="llamacpp")


@pytest.fixture(scope="module")
def expected(smollm) -> dict[str, list[int]]:
    """llama.cpp's own greedy decoding of each chat prompt, through llama-cpp-python's Llama."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(smollm.source), n_ctx=1024, verbose=False)
    eos = eos_token_ids(smollm)
    outputs = {}
    for prompt in PROMPTS:
        tokens = []
        for token in llm.generate(encode_prompt(smollm, prompt, chat=True), temp=0.0, repeat_penalty=1.0):
            tokens.append(token)
            if token in eos or len(tokens) == MAX_NEW:
                break
        outputs[prompt] = tokens
    return outputs


def test_loads_the_gguf_file_directly(smollm):
    assert smollm.backend == "llamacpp" and smollm.source.suffix == ".gguf"
    assert smollm.model.vocab_size == len(smollm.tokenizer.get_vocab()) == 49152
    assert smollm.tokenizer.convert_tokens_to_ids("<|im_end|>") in eos_token_ids(smollm)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("drafter_kind", ["none", "ngram", "self"])
def test_greedy_equals_llamacpp_greedy(smollm, expected, drafter_kind, k):
    drafter = {"none": None, "ngram": NgramDrafter(), "self": SmallLMDrafter(smollm.new_lm(), "self")}[drafter_kind]
    generator = TextGenerator(smollm, build_engine(smollm, [drafter] if drafter else []))
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k)
    for prompt in PROMPTS:
        result = generator.generate(prompt, config, chat=True)
        assert result.token_ids == expected[prompt], prompt
        if drafter_kind == "self":  # a model drafting for itself is always right
            assert result.stats.num_accepted_tokens == result.stats.num_draft_tokens > 0


def test_a_verification_row_equals_a_one_token_step(smollm):
    """Rows of one forward (chunked past exact_rows) are bit-identical to one-token steps, after a trim."""
    lm = smollm.new_lm()
    ids = encode_prompt(smollm, PROMPTS[0], chat=True)
    lm.forward(ids, num_logits=1)
    tail = ids[:12]
    batched = lm.forward(tail).clone()
    assert batched.shape == (12, smollm.model.vocab_size)
    lm.trim(len(ids))
    assert lm.length == len(ids)
    stepped = torch.cat([lm.forward([token]).clone() for token in tail])
    assert torch.equal(batched, stepped)


def test_hidden_states_come_with_the_same_logits(smollm):
    ids = encode_prompt(smollm, PROMPTS[1], chat=True)
    plain = smollm.new_lm()
    plain.forward(ids[:-4], num_logits=1)
    logits = plain.forward(ids[-4:]).clone()
    white_box = smollm.new_lm(hidden_states=True)
    white_box.forward(ids[:-4], num_logits=1)
    same_logits, hidden = white_box.forward_with_hidden(ids[-4:])
    assert torch.equal(same_logits, logits)
    assert hidden.shape == (4, smollm.model.hidden_size) and hidden.abs().sum() > 0
    # A prefill that asks for the last row only: a context with hidden states on outputs every row
    # of the call, and the last one must still be the one returned.
    plain.reset()
    white_box.reset()
    last = plain.forward(ids, num_logits=1).clone()
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
    assert passed.hidden.shape == (700, smollm.model.hidden_size) and passed.top_ids.shape == passed.top_probs.shape == (700, 8)
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


def test_a_small_lm_drafter_on_llamacpp_is_lossless_with_early_stop(smollm, expected):
    target = smollm.new_lm()
    engine = Engine(target, [SmallLMDrafter(smollm.new_lm(), "self")], eos_token_ids(smollm), smollm.model.context_length)
    prompt_ids = encode_prompt(smollm, PROMPTS[2], chat=True)
    tokens = engine.generate(prompt_ids, GenerationConfig(max_new_tokens=MAX_NEW), SpecStats())
    taken = [next(tokens) for _ in range(6)]
    tokens.close()
    assert taken == expected[PROMPTS[2]][:6]
    assert target.length == len(prompt_ids) + len(taken) - 1
