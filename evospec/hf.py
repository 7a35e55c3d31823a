"""model.generate() through evospec's loop, for a transformers model and tokenizer held already:

    import evospec.hf

    output = model.generate(
        **inputs, custom_generate=evospec.hf.generate, drafters=["ngram", "suffix"], target_tokenizer=tokenizer
    )

generate() prepares the generation config, the logits processors and the stopping criteria, then calls a
callable custom_generate in place of its own decoding loop (transformers >= 4.56). That callable is
`generate` here, for one request, or a `Speculator`, whose drafters, selector and learners last across
calls, so that what they learn from one request serves the next. The output is the target's own: greedy
output equals plain generate() exactly (fp32), and sampling is evospec's exact rejection sampling from
the distribution of transformers' temperature, top-k and top-p.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation import GenerateDecoderOnlyOutput, GenerationMode, LogitsProcessorList, StoppingCriteriaList

from evospec.config import GenerationConfig, LoadConfig, SamplingConfig
from evospec.drafters import Drafter, SmallLMDrafter
from evospec.drafters.prediction import PREDICTION
from evospec.drafters.registry import build_drafter, check_shared_vocabulary
from evospec.errors import EvospecError
from evospec.generation import build_engine_from_names
from evospec.learning import NO_LEARNER, LearnerConfig
from evospec.models.hf import TORCH_DTYPES, HFBackend
from evospec.models.loading import BACKENDS
from evospec.stats import SpecStats

HF_BACKEND = BACKENDS[HFBackend.name]
DECODING_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
# The logits processors whose distribution evospec's Sampler computes itself, in the same order.
SAMPLING_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
# What generate() adds to the model's inputs on its own. The loop keeps its own cache and positions;
# the cache is `past_key_values` in the transformers releases before it was renamed `cache`.
PREPARED_INPUTS = frozenset(
    {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache", "past_key_values"}
)
# Per-step outputs that transformers' loops can return and evospec's does not compute.
STEP_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


@dataclass(frozen=True)
class SpeculationConfig:
    """How far to speculate and how learners learn (`evospec generate`'s --k, --adaptive-k and the
    learning options). Each default is defined here or in the config it names, once."""

    num_speculative_tokens: int = GenerationConfig.num_speculative_tokens  # k: tokens drafted per round
    adaptive_k: bool = False  # verify each round as many drafted tokens (at most k) as pay, by measured cost
    learning: LearnerConfig = LearnerConfig()


@dataclass
class EvospecGenerateOutput(GenerateDecoderOnlyOutput):
    """What generate() returns with return_dict_in_generate=True: `sequences` (prompt + new tokens
    [1, n + m]; no per-step scores, logits or attentions) and `evospec_stats`, the generation's SpecStats
    (vLLM's counter names, tau, acceptance rate, per-drafter rounds; to_dict() is `evospec generate
    --json`'s stats)."""

    evospec_stats: SpecStats | None = None


class Speculator:
    """Drafters, a selector and learners that speculate for one transformers model across generate()
    calls. Pass it as custom_generate:

        speculator = evospec.hf.Speculator(model, tokenizer, drafters=["ngram", "eagle"], learner="ogd")
        output = model.generate(**inputs, custom_generate=speculator, max_new_tokens=128)

    tokenizer: the model's; it checks that drafters loaded by name share its vocabulary.
    drafters: `evospec generate --drafter` specs (ngram, suffix, prediction, lm:MODEL or MODEL,
    lora:MODEL, eagle[:CHECKPOINT], hydra[:CHECKPOINT]; models load in the target's dtype), or small LMs
    as transformers models, taken to share the tokenizer (as generate's assistant_model is) and checked
    to have as many logits. A model drafts under its name_or_path (one built in memory: `model<i>`, i
    its place in drafters). None: plain decoding.
    selector, learner: as --selector (default with several drafters: ucb-bd) and --learner take them.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        drafters: Sequence[str | PreTrainedModel] = (),
        selector: str | None = None,
        learner: str = NO_LEARNER,
        config: SpeculationConfig = SpeculationConfig(),
    ) -> None:
        if tokenizer is None:  # generate() hands `tokenizer=` to its own stopping criteria, never to a callable
            raise EvospecError(
                "evospec needs the target's tokenizer: generate(..., target_tokenizer=tokenizer) (generate() "
                "keeps tokenizer= to itself) or Speculator(model, tokenizer, ...)"
            )
        if model.config.is_encoder_decoder:
            raise EvospecError(f"evospec speculates for decoder-only models; {type(model).__name__} is encoder-decoder")
        self.target = HF_BACKEND.wrap(_name(model), model, tokenizer, _source(model))
        # Drafters loaded by name run in the target's dtype, where evospec names it.
        load = LoadConfig(dtype=HF_BACKEND.weights_format(model) if model.dtype in TORCH_DTYPES.values() else None)
        if isinstance(drafters, str):
            raise EvospecError(f"drafters is a list, got the string {drafters!r}: drafters=[{drafters!r}]")
        built = [self._drafter(drafter, place, load) for place, drafter in enumerate(drafters)]
        self.config = config
        # transformers' stopping criteria end each generation, the call's own eos_token_id included, so the
        # loop itself stops only at max_new_tokens or a full context.
        self.engine = build_engine_from_names(
            replace(self.target, eos_token_ids=frozenset()),
            [drafter for drafter in built if drafter],
            selector,
            learner,
            config.learning,
            config.num_speculative_tokens,
            config.adaptive_k,
        )

    def _drafter(self, drafter: str | PreTrainedModel, place: int, load: LoadConfig) -> Drafter | None:
        """The drafter a spec names (None for `none`), or a small LM over a transformers model."""
        if isinstance(drafter, str):
            return build_drafter(drafter, self.target, load)
        if not isinstance(drafter, PreTrainedModel):
            raise EvospecError(f"a drafter is a --drafter spec or a transformers model, got {type(drafter).__name__}")
        drafter_model = HF_BACKEND.wrap(
            drafter.name_or_path or f"model{place}", drafter, self.target.tokenizer, _source(drafter)
        )
        check_shared_vocabulary(drafter_model, self.target)
        return SmallLMDrafter(drafter_model.new_lm(), drafter_model.name)

    def __call__(
        self,
        model: PreTrainedModel,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: transformers.GenerationConfig,
        prediction_ids: Sequence[int] = (),
        seed: int | None = None,
        **model_kwargs,
    ) -> torch.LongTensor | EvospecGenerateOutput:
        """Continue input_ids [1, n] as generate()'s own loops would -> prompt + new tokens [1, n + m]; with
        return_dict_in_generate, an EvospecGenerateOutput that adds the stats.

        generate() passes the model, input_ids, logits_processor, stopping_criteria, generation_config and
        model_kwargs (what it prepared for the model); every criterion is asked after each new token.
        prediction_ids: the output expected (OpenAI Predicted Outputs), for the prediction drafter.
        seed: of evospec's sampling; None draws it from torch's generator, so that torch.manual_seed makes
        sampling repeat, as it does in transformers.
        """
        if model is not self.target.model:
            raise EvospecError(f"this Speculator speculates for '{self.target.name}', not for another model")
        request = self._request(generation_config, logits_processor, input_ids.shape[1], seed)
        if input_ids.shape[0] != 1:
            raise EvospecError(
                f"evospec generates one sequence at a time (batch 1); this input has {input_ids.shape[0]}"
            )
        _check_model_inputs(model_kwargs)
        prediction = [int(token) for token in prediction_ids]
        if prediction and PREDICTION not in self.engine.drafters:
            raise EvospecError(f"prediction_ids are drafted by the '{PREDICTION}' drafter: add it to drafters")
        length = input_ids.shape[1]
        sequences = input_ids.new_empty(1, length + request.max_new_tokens)  # filled as tokens come
        sequences[:, :length] = input_ids
        stats = SpecStats()
        tokens = self.engine.generate(input_ids[0].tolist(), request, stats, prediction)
        try:
            for token in tokens:
                sequences[0, length] = token
                length += 1
                if stopping_criteria(sequences[:, :length], None).any():  # no criterion of generate() reads scores
                    break
        finally:
            tokens.close()
        if generation_config.return_dict_in_generate:
            return EvospecGenerateOutput(sequences=sequences[:, :length], evospec_stats=stats)
        return sequences[:, :length]

    def _request(
        self,
        generation_config: transformers.GenerationConfig,
        logits_processor: LogitsProcessorList,
        prompt_length: int,
        seed: int | None,
    ) -> GenerationConfig:
        """The request as evospec's loop takes it; a clear error for what the loop cannot do losslessly."""
        mode = generation_config.get_generation_mode()
        if mode not in DECODING_MODES:
            raise EvospecError(
                "evospec decodes greedily or samples, with num_beams=1 and no assistant_model or prompt "
                f"lookup (its drafters draft); this call asks for {mode.value}"
            )
        if generation_config.num_return_sequences > 1:
            raise EvospecError(
                f"evospec returns one sequence; this call asks for {generation_config.num_return_sequences}"
            )
        others = [
            type(processor).__name__ for processor in logits_processor if not isinstance(processor, SAMPLING_WARPERS)
        ]
        if others:
            raise EvospecError(
                "evospec verifies drafts against the target's distribution after temperature, top-k and top-p "
                f"alone; this call also applies {', '.join(others)}: turn them off (e.g. repetition_penalty=1.0)"
            )
        asked = [name for name in STEP_OUTPUTS if getattr(generation_config, name)]
        if generation_config.return_dict_in_generate and asked:
            raise EvospecError(f"evospec returns sequences and stats, no per-step outputs; drop {', '.join(asked)}")
        sampling = SamplingConfig()  # greedy
        if generation_config.do_sample:
            sampling = SamplingConfig(
                temperature=generation_config.temperature,
                top_k=generation_config.top_k or 0,
                top_p=generation_config.top_p,
                seed=int(torch.randint(2**62, (1,))) if seed is None else seed,
            )
        return GenerationConfig(
            max_new_tokens=generation_config.max_length - prompt_length,
            num_speculative_tokens=self.config.num_speculative_tokens,
            sampling=sampling,
        )


def generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: transformers.GenerationConfig,
    drafters: Sequence[str | PreTrainedModel] = (),
    selector: str | None = None,
    learner: str = NO_LEARNER,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    speculation: SpeculationConfig = SpeculationConfig(),
    prediction_ids: Sequence[int] = (),
    seed: int | None = None,
    **model_kwargs,
) -> torch.LongTensor | EvospecGenerateOutput:
    """custom_generate for one request: a Speculator over drafters, selector, learner, target_tokenizer
    and speculation (what it learns lasts this call; keep a Speculator to keep it), called as generate()
    calls it. The target's tokenizer is `target_tokenizer`: generate() keeps `tokenizer=` to itself."""
    speculator = Speculator(model, target_tokenizer, drafters, selector, learner, speculation)
    return speculator(
        model, input_ids, logits_processor, stopping_criteria, generation_config, prediction_ids, seed, **model_kwargs
    )


def _check_model_inputs(model_kwargs: dict) -> None:
    """The loop runs the target on input_ids alone, from an empty cache: a clear error for anything else."""
    given = {name for name, value in model_kwargs.items() if value is not None}
    if given - PREPARED_INPUTS:
        raise EvospecError(
            f"evospec runs the target on input_ids alone; it cannot pass {sorted(given - PREPARED_INPUTS)} to it"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise EvospecError("evospec runs one unpadded sequence; this attention_mask masks part of it")
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:
        raise EvospecError("evospec keeps its own cache: start from an empty one (no past_key_values)")


def _name(model: PreTrainedModel) -> str:
    """What evospec calls a model held in memory: where it was loaded from, or its class."""
    return model.name_or_path or type(model).__name__


def _source(model: PreTrainedModel) -> Path | str:
    """Where a model held in memory came from, as LoadedModel records it (its measured forward cost is
    cached under it): its directory, its hub id, or for one built in memory its architecture, which is
    what that cost depends on."""
    if not model.name_or_path:
        return f"{type(model).__name__}:{hashlib.sha256(model.config.to_json_string().encode()).hexdigest()[:16]}"
    path = Path(model.name_or_path)
    return path if path.is_dir() else model.name_or_path
