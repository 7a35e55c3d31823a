"""The methods a benchmark compares. Each turns prompt ids (and a prediction) into SpecStats for one generation.

Method names follow the project's benchmark convention: hf-plain, hf-assisted:<drafter> (hf backend),
llamacpp-plain, llamacpp-lookup (llama.cpp backend), evospec-plain, evospec:<drafter>,
select:<selector> (either), evospec:<kind> and evospec:<kind>+<learner> for a white-box drafter
(eagle or hydra, from one checkpoint) frozen or learning, select:<selector>+<learner> with that
drafter among the arms, learning, evospec:lora:<model>[+<learner>] for the small LM with adapters
(OSD); a /k=auto suffix marks the adaptive draft length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch

from evospec.bench import SUITES
from evospec.config import DTYPES, GenerationConfig, LoadConfig
from evospec.drafters import Drafter, NgramDrafter, PredictionDrafter, SmallLMDrafter, SuffixDrafter
from evospec.drafters.registry import build_drafter, new_white_box_drafter
from evospec.drafters.whitebox import checkpoint_kind
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.generation import build_engine, timing
from evospec.learning import LEARNERS, LearnerConfig, build_learner
from evospec.models.backend import Backend, LoadedModel
from evospec.models.loading import backend_named
from evospec.selection import SELECTORS, build_selector
from evospec.stats import SpecStats

ADAPTIVE = "/k=auto"  # method-name suffix: the draft length adapts each round (draft_length.py)
LOOKUP_TOKENS = 10  # llama-cpp-python's default draft length for prompt lookup, what its users run
MODEL_FREE = {"ngram": NgramDrafter, "suffix": SuffixDrafter, "prediction": PredictionDrafter}


class BenchMethod(Protocol):
    name: str

    def run(self, prompt_ids: list[int], config: GenerationConfig, prediction_ids: Sequence[int] = ()) -> SpecStats:
        """Generate greedily for prompt_ids and return what it took; prediction_ids: the request's
        predicted output, for the methods that draft from it."""


class EvospecMethod:
    """evospec's engine, with or without a drafter."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine

    def run(self, prompt_ids: list[int], config: GenerationConfig, prediction_ids: Sequence[int] = ()) -> SpecStats:
        stats = SpecStats()
        for _ in self.engine.generate(prompt_ids, config, stats, prediction_ids):
            pass
        return stats


class HFGenerateMethod:
    """Hugging Face `generate`, plain or with `assistant_model=` (its defaults otherwise, as users run it).
    Target forwards are counted with a hook, so that tau can be reported for it too."""

    def __init__(self, name: str, target: LoadedModel, assistant: LoadedModel | None = None) -> None:
        self.name = name
        self.target = target
        self.assistant = assistant
        self.eos = sorted(target.eos_token_ids)
        self.pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else self.eos[0]

    def run(self, prompt_ids: list[int], config: GenerationConfig, prediction_ids: Sequence[int] = ()) -> SpecStats:
        forwards, prefill_s = 0, 0.0

        def count(*_):
            nonlocal forwards, prefill_s
            forwards += 1
            if forwards == 1:  # the prompt's forward (generate's set-up included, as in a time to first token)
                prefill_s = time.perf_counter() - start

        hook = self.target.model.register_forward_hook(count)
        extra = {"assistant_model": self.assistant.model} if self.assistant else {}
        input_ids = torch.tensor([prompt_ids], device=self.target.model.device)
        start = time.perf_counter()
        try:
            output = self.target.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=config.max_new_tokens,
                eos_token_id=self.eos,
                pad_token_id=self.pad,
                **extra,
            )
        finally:
            hook.remove()
        new_tokens = output.shape[1] - len(prompt_ids)
        return SpecStats(
            num_verifications=forwards,  # the prefill gives the first token, as in evospec
            new_tokens=new_tokens,
            prompt_tokens=len(prompt_ids),
            prefill_s=prefill_s,
            wall_s=time.perf_counter() - start,
        )


class LlamaCppCompletionMethod:
    """llama-cpp-python's own greedy `Llama.create_completion`, what a Python user of llama.cpp runs
    today; with lookup, its prompt-lookup draft model (LlamaPromptLookupDecoding) drafting k tokens.
    Calls of `Llama.eval` (one per round, the prefill included) are counted for tau."""

    def __init__(self, name: str, target: LoadedModel, lookup_tokens: int | None = None) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        self.name = name
        self.llm = Llama(
            model_path=str(target.source),
            n_ctx=target.context_length,
            n_threads=target.backend.threads(target.model),
            n_threads_batch=target.backend.threads(target.model),
            draft_model=draft,
            verbose=False,
            # With a draft model llama-cpp-python keeps every row's logits but sizes that buffer from
            # this flag (0.3.36), so a prompt longer than a batch overflows it unless it is set.
            logits_all=draft is not None,
        )

    def run(self, prompt_ids: list[int], config: GenerationConfig, prediction_ids: Sequence[int] = ()) -> SpecStats:
        evals, prefill_s = 0, 0.0
        eval_tokens = self.llm.eval

        def counted_eval(tokens):
            nonlocal evals, prefill_s
            evals += 1
            eval_start = time.perf_counter()
            result = eval_tokens(tokens)
            if evals == 1:  # the prompt's
                prefill_s = time.perf_counter() - eval_start
            return result

        self.llm.reset()  # no prompt cache carried over from an earlier run
        self.llm.eval = counted_eval
        start = time.perf_counter()
        try:
            completion = self.llm.create_completion(
                prompt_ids,
                max_tokens=config.max_new_tokens,
                temperature=0.0,
                repeat_penalty=1.0,
            )
        finally:
            del self.llm.eval
        # llama-cpp-python leaves the end-of-generation token out of its count; evospec counts it.
        ended = completion["choices"][0]["finish_reason"] == "stop"
        return SpecStats(
            num_verifications=evals,  # the prefill gives the first token, as in evospec
            new_tokens=completion["usage"]["completion_tokens"] + ended,
            prompt_tokens=len(prompt_ids),
            prefill_s=prefill_s,
            wall_s=time.perf_counter() - start,
        )


def build_methods(
    names: list[str],
    target: LoadedModel,
    draft_model: LoadedModel | None,
    num_speculative_tokens: int,
    white_box: Path | None = None,
    learning: LearnerConfig = LearnerConfig(),
    predictions: bool = False,
) -> list[BenchMethod]:
    """Methods by name: evospec:<drafter> (draft_model, ngram, suffix or prediction), select:<selector>
    over all of them (the small LM only when draft_model is given, the white-box checkpoint's drafter
    when there is one, learning with select:<selector>+<learner>, the prediction drafter only when
    the prompts carry predictions), the white-box checkpoint's drafter frozen and with each learner
    (each method its own copy), the small LM with adapters frozen and with each learner
    (evospec:lora:<model>[+<learner>], when draft_model is given), and the baselines of the target's backend."""

    def engine(
        drafters: list[Drafter], adaptive: bool = False, selector: str | None = None, learner: str | None = None
    ) -> Engine:
        arms = build_selector(selector, [d.name for d in drafters]) if selector else None
        cost, draft_length = timing(target, num_speculative_tokens, adaptive, arms)
        learners = [build_learner(learner, d, learning) for d in drafters if learner and d.learnable]
        return build_engine(target, drafters, draft_length, arms, learners, cost)

    def small_lm() -> list[Drafter]:
        return [SmallLMDrafter(draft_model.new_lm(), draft_model.name)] if draft_model else []

    def model_free_arms() -> list[Drafter]:
        return [make() for name, make in MODEL_FREE.items() if predictions or name != "prediction"]

    def white_box_arm() -> list[Drafter]:
        return [new_white_box_drafter(checkpoint_kind(white_box), target, white_box)] if white_box else []

    builders = {"evospec-plain": lambda: EvospecMethod("evospec-plain", engine([]))}
    for drafter, make in MODEL_FREE.items():
        for suffix in ("", ADAPTIVE):
            name = f"evospec:{drafter}{suffix}"
            builders[name] = lambda name=name, make=make, adaptive=bool(suffix): EvospecMethod(
                name, engine([make()], adaptive)
            )
    for selector in SELECTORS:
        # +<learner>: the white-box arm learns while the selector picks among arms (MetaSD over drafters that evolve)
        for learner in (None, *(LEARNERS if white_box else ())):
            for suffix in ("", ADAPTIVE) if selector != "fixed" else ():
                name = f"select:{selector}{'+' + learner if learner else ''}{suffix}"
                builders[name] = lambda name=name, selector=selector, learner=learner, adaptive=bool(suffix): (
                    EvospecMethod(
                        name,
                        engine(
                            [*white_box_arm(), *small_lm(), *model_free_arms()],
                            adaptive,
                            selector=selector,
                            learner=learner,
                        ),
                    )
                )
    if white_box is not None:
        kind = checkpoint_kind(white_box)
        for learner in (None, *LEARNERS):
            for suffix in ("", ADAPTIVE):
                name = f"evospec:{kind}{'+' + learner if learner else ''}{suffix}"
                builders[name] = lambda name=name, learner=learner, adaptive=bool(suffix): EvospecMethod(
                    name, engine(white_box_arm(), adaptive, learner=learner)
                )
    for name, baseline in baselines(target.backend, draft_model and draft_model.name).items():
        builders[name] = lambda baseline=baseline: BASELINES[baseline](target, draft_model, num_speculative_tokens)
    if draft_model is not None:
        for suffix in ("", ADAPTIVE):
            name = f"evospec:{draft_model.name}{suffix}"
            builders[name] = lambda name=name, adaptive=bool(suffix): EvospecMethod(name, engine(small_lm(), adaptive))
        # OSD: the small LM with adapters, frozen (adapters at zero, on the hf kernels the learners
        # train) and learning; each method loads its own copy, since the adapters go into the model.
        adapted = f"lora:{draft_model.name}"
        dtype = draft_model.weights_format if draft_model.weights_format in DTYPES else None  # as loaded here
        for learner in (None, *LEARNERS):
            for suffix in ("", ADAPTIVE):
                name = f"evospec:{adapted}{'+' + learner if learner else ''}{suffix}"
                builders[name] = lambda name=name, learner=learner, adaptive=bool(suffix): EvospecMethod(
                    name, engine([build_drafter(adapted, target, LoadConfig(dtype))], adaptive, learner=learner)
                )
    check_method_names(names, list(builders))
    return [builders[name]() for name in names]


# Each backend's baselines (Backend.baselines): its own generation loop, as its users run it.
BASELINES: dict[str, Callable[[LoadedModel, LoadedModel | None, int], BenchMethod]] = {
    "hf-plain": lambda target, draft_model, k: HFGenerateMethod("hf-plain", target),
    "hf-assisted": lambda target, draft_model, k: HFGenerateMethod(
        f"hf-assisted:{draft_model.name}", target, draft_model
    ),
    "llamacpp-plain": lambda target, draft_model, k: LlamaCppCompletionMethod("llamacpp-plain", target),
    "llamacpp-lookup": lambda target, draft_model, k: LlamaCppCompletionMethod(
        "llamacpp-lookup", target, lookup_tokens=min(k, LOOKUP_TOKENS)
    ),
}
ASSISTED = {"hf-assisted"}  # baselines that draft with the small LM: named <baseline>:<draft model>


def baselines(backend: Backend, draft_model_name: str | None) -> dict[str, str]:
    """Method name -> its BASELINES entry, for a backend's baselines in order; those that draft with
    a small LM only when there is one."""
    return {
        f"{name}:{draft_model_name}" if name in ASSISTED else name: name
        for name in backend.baselines
        if name not in ASSISTED or draft_model_name
    }


def check_method_names(names: list[str], known: list[str]) -> None:
    """Raise a clear error for any name not among the known methods."""
    unknown = [name for name in names if name not in known]
    if unknown:
        raise EvospecError(f"unknown bench method(s) {unknown}; known: {sorted(known)}")


def all_method_names(draft_model_name: str, backend: str, white_box: Path | None = None) -> list[str]:
    """Every method build_methods can make for these models: the suites' methods, the small LM with
    adapters frozen and with each learner, and each selector's and drafter's variant with the adaptive
    draft length."""
    suites = ["engine", "selection", "edit", *(["learning"] if white_box is not None else [])]
    names = [name for suite in suites for name in method_names(draft_model_name, backend, suite, white_box)]
    names += [f"evospec:lora:{draft_model_name}{'+' + learner if learner else ''}" for learner in (None, *LEARNERS)]
    adaptive = [
        f"{name}{ADAPTIVE}" for name in names if name.startswith(("evospec:", "select:")) and ADAPTIVE not in name
    ]
    return list(dict.fromkeys([*names, *adaptive]))


def method_names(
    draft_model_name: str, backend: str, suite: str = "engine", white_box: Path | None = None
) -> list[str]:
    """The methods of a benchmark suite on a backend, baselines first.

    engine: baselines, plain decoding and each drafter with fixed and adaptive k; selection: each
    single drafter and every selector over all of them (MetaSD; the report adds the oracle);
    edit: baselines, plain decoding, each model-free drafter and a selector over them, all with the
    adaptive k (no small LM: the suite runs without one); learning: plain decoding, the white-box
    checkpoint's drafter frozen, and with each learner.
    """
    singles = [f"evospec:{draft_model_name}", "evospec:ngram", "evospec:suffix"]
    if suite == "edit":  # without a small LM
        return [
            *baselines(backend_named(backend), None),
            "evospec-plain",
            *(f"evospec:{drafter}{ADAPTIVE}" for drafter in MODEL_FREE),
            f"select:ucb-bd{ADAPTIVE}",
        ]
    if suite == "learning":
        if white_box is None:
            raise EvospecError("the learning suite needs a white-box drafter checkpoint (--white-box DIR)")
        kind = checkpoint_kind(white_box)
        return ["evospec-plain", f"evospec:{kind}", *(f"evospec:{kind}+{learner}" for learner in LEARNERS)]
    if suite == "selection":
        return ["evospec-plain", *singles, *(f"select:{name}" for name in SELECTORS if name != "fixed")]
    if suite != "engine":
        raise EvospecError(f"unknown bench suite {suite!r}; choose {', '.join(SUITES)}")
    return [
        *baselines(backend_named(backend), draft_model_name),
        "evospec-plain",
        *singles,
        *(f"{name}{ADAPTIVE}" for name in singles),
    ]
