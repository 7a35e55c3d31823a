"""Online learners: they turn each round's feedback into updates of a drafter while it serves (a
white-box drafter, or the adapters of a small LM).

OnlineSPEC (arXiv 2603.12617) names the three: OGD (its Online-LR), optimistic OGD (Opt-Hydra: the
previous gradient is the hint for the next, w <- w - lr * (2 g_t - g_{t-1}); or its momentum form)
and an online ensemble of learning rates (Ens-Eagle: copies with lr, 2 lr, 4 lr weighted by Hedge,
serving the weighted combination). AdamW steps each weight by its own gradient statistics, as
OnlineSPEC's code trains its chunks and as warm-up trains the drafter. Every learner keeps a bounded
feedback buffer, steps on a schedule, and is guarded: a step with a non-finite loss or gradient is
skipped, and when the drafter's rolling acceptance falls a margin below that of the last good
weights, those weights come back.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from evospec.errors import EvospecError
from evospec.learnable import LearnableDrafter, Trace
from evospec.learning.buffer import FeedbackBuffer, packed, trace_of, window_spans
from evospec.learning.losses import LossConfig, drafter_loss
from evospec.types import RoundFeedback

SCHEDULES = ("rounds", "request", "chunk")
ENSEMBLE_BASES = ("ogd", "adamw")  # how each copy of the ensemble steps


@dataclass(frozen=True)
class LearnerConfig:
    """How a learner learns. Each default is defined here, once."""

    lr: float | None = None  # step size (the ensemble's smallest); None: the learner's default (adamw copies: AdamW's)
    schedule: str = "rounds"  # rounds: every `every` rounds; request: after each request; chunk: after `every` requests
    every: int = 24  # a step costs a few target steps on a CPU: learn from the new rows, not every round
    buffer_rows: int = 4096  # feedback rows kept; the oldest go first
    batch_rows: int = 64  # rows a step learns from; a scheduled update learns every new row, at least a batch
    epochs: int = 1  # passes a scheduled update makes over its rows (a chunk's data, as OnlineSPEC trains it)
    replay_rows: int = 0  # older rows each scheduled update learns again, against forgetting them
    prompt_rows: int = (
        1024  # white-box drafters: learn from the prompt's last rows while answering it, a step a round (0: never)
    )
    optimistic_form: str = "hint"  # hint: 2 g_t - g_{t-1}; momentum: SGD with `momentum`
    momentum: float = 0.9
    ensemble_scales: tuple[float, ...] = (1.0, 2.0, 4.0)  # the copies' learning rates, in units of lr
    ensemble_base: str = "ogd"  # each copy steps by ogd (OnlineSPEC's Ens-Eagle) or by adamw, its own moments
    hedge_temperature: float = 1.0  # weights = softmax(-discounted loss / temperature)
    hedge_discount: float = 0.9  # older losses count less, so the weights can follow a shift
    restart_each_chunk: bool = False  # ensemble: copies restart from the combination after each chunk
    grad_clip: float = 1.0  # gradient norm cap
    # eagle: draft depths each row is trained at; past the first, the head reads its own predicted
    # features, as it drafts (EAGLE-3's training-time test)
    train_depth: int = 1
    rollback_margin: float = 0.15  # roll back when rolling acceptance is this far below the good weights'
    rollback_window: int = 64  # rounds of the drafter in the rolling acceptance
    dpo_beta: float = 0.1  # dpo: how far from the reference the preference may move the drafter (OnlineSPEC's)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        if self.lr is not None and not self.lr > 0:
            raise EvospecError(f"learning rate must be > 0, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise EvospecError(f"unknown learning schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.every < 1:
            raise EvospecError(f"learn-every must be >= 1, got {self.every}")
        if self.buffer_rows < 2 or not 2 <= self.batch_rows <= self.buffer_rows:
            raise EvospecError(f"need 2 <= batch rows ({self.batch_rows}) <= buffer rows ({self.buffer_rows})")
        if self.epochs < 1 or self.replay_rows < 0:
            raise EvospecError(f"need epochs >= 1 and replay rows >= 0, got {self.epochs} and {self.replay_rows}")
        if self.prompt_rows < 0:
            raise EvospecError(f"prompt rows must be >= 0, got {self.prompt_rows}")
        if self.train_depth < 1:
            raise EvospecError(f"train depth must be >= 1, got {self.train_depth}")
        if not self.dpo_beta > 0:
            raise EvospecError(f"the DPO beta must be > 0, got {self.dpo_beta}")
        if self.ensemble_base not in ENSEMBLE_BASES:
            raise EvospecError(f"ensemble base is one of {', '.join(ENSEMBLE_BASES)}, got {self.ensemble_base!r}")
        if self.optimistic_form not in ("hint", "momentum"):
            raise EvospecError(f"optimistic form is 'hint' or 'momentum', got {self.optimistic_form!r}")


@dataclass
class LearnerStats:
    """What a learner did; `losses` is the online loss of each step, measured before it."""

    steps: int = 0
    skipped: int = 0  # steps with a non-finite loss or gradient
    rollbacks: int = 0
    learn_s: float = 0.0
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "skipped": self.skipped,
            "rollbacks": self.rollbacks,
            "learn_s": self.learn_s,
            "last_loss": self.losses[-1] if self.losses else None,
        }


class _Guard:
    """Rolling acceptance of the drafter's rounds, and the last weights that served well."""

    def __init__(self, config: LearnerConfig) -> None:
        self.margin = config.rollback_margin
        self.rounds: deque[tuple[int, int]] = deque(maxlen=config.rollback_window)
        self.good_state: dict[str, torch.Tensor] | None = None
        self.good_rate: float | None = None

    def record(self, accepted: int, drafted: int) -> None:
        self.rounds.append((accepted, drafted))

    @property
    def rate(self) -> float | None:
        """Acceptance over a full window of rounds; None until the window is full."""
        if len(self.rounds) < self.rounds.maxlen:
            return None
        drafted = sum(d for _, d in self.rounds)
        return sum(a for a, _ in self.rounds) / drafted if drafted else None

    def check(self, module: torch.nn.Module) -> bool:
        """Roll module back if it serves clearly worse than the good weights (-> True); else remember
        it if it serves best."""
        rate = self.rate
        if rate is None:
            return False
        if self.good_rate is not None and rate < self.good_rate - self.margin:
            module.load_state_dict(self.good_state)
            self.rounds.clear()  # judge the restored weights on fresh rounds
            self.good_rate = None
            return True
        if self.good_rate is None or rate >= self.good_rate:
            self.good_state = {key: value.detach().clone() for key, value in module.state_dict().items()}
            self.good_rate = rate
        return False

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.good_state.values()) if self.good_state else 0


class OnlineLearner:
    """Buffers feedback, steps when the schedule says, guards the drafter. Subclasses update the weights."""

    name = "base"
    default_lr = 0.5  # SGD's step size: the best of 0.05..8 on a domain shift (benchmarks/)

    def __init__(self, drafter: LearnableDrafter, config: LearnerConfig) -> None:
        if config.train_depth > 1 and not drafter.unrolls:
            raise EvospecError(
                f"train depth {config.train_depth}: {drafter.name} drafts from verified inputs only, "
                "so there is nothing to unroll (eagle drafters unroll)"
            )
        self.drafter = drafter
        self.config = config
        self.lr = self.default_lr if config.lr is None else config.lr
        self.buffer = FeedbackBuffer(config.buffer_rows)
        self.stats = LearnerStats()
        self.guard = _Guard(config)
        self._rounds = 0
        self._requests = 0
        self._learned_rows = 0  # the buffer's rows_added at the last scheduled update
        self._prompt_steps: deque[list[Trace]] = deque()  # batches of the current request's prompt still to learn

    @property
    def needs_hidden_states(self) -> bool:
        """Whether its feedback must carry the target's hidden states: when its drafter reads them."""
        return self.drafter.needs_hidden_states

    @property
    def prompt_rows(self) -> int:
        """Prompt rows it learns from at each prefill. Only white-box drafters do: a prompt's rows come
        from a pass that returns hidden states, and a small LM learned nothing from its answers'
        rows on line (benchmarks/learning-replay-lora-0.5b)."""
        return self.config.prompt_rows if self.drafter.needs_hidden_states else 0

    def begin_request(self) -> None:
        """A request starts (the schedule counts requests)."""

    def observe(self, feedback: RoundFeedback) -> None:
        """Keep a round's feedback and learn when the schedule says so. A prefill's prompt rows are
        learned while its answer is made, one step a round (the first at the prefill), the rows next
        to the answer first: no round waits for more than one step."""
        if feedback.prefill and self.prompt_rows and feedback.top_ids.shape[0] >= 2:
            # The request's domain, learned once: kept in the buffer, the prompt's rows would crowd the
            # answer's out of the next steps (benchmarks/learning-replay-prompt-1.5b).
            trace = trace_of(feedback, min(self.prompt_rows, feedback.top_ids.shape[0]))
            self._prompt_steps = deque(reversed(_batches([trace], self.config.batch_rows)))
            feedback = feedback.last_rows(1)
        self.buffer.add(feedback)
        if feedback.drafter == self.drafter.name and feedback.drafted.numel():
            self.guard.record(feedback.num_accepted, int(feedback.drafted.numel()))
        if feedback.drafter is not None:
            self._rounds += 1
        if self._prompt_steps:  # a scheduled step waits for a round without one
            self._learn_prompt()
        elif self.config.schedule == "rounds" and self._rounds >= self.config.every:
            self.learn()

    def end_request(self) -> None:
        """A request ended: learn if the schedule says so. Prompt steps its answer left no rounds
        for are dropped: a prompt's steps are for its own answer."""
        self._prompt_steps.clear()
        self._requests += 1
        if self.config.schedule == "request" or (
            self.config.schedule == "chunk" and self._requests % self.config.every == 0
        ):
            self.learn()
            self.end_chunk()

    def end_chunk(self) -> None:
        """A chunk of learning ended (the ensemble may restart its copies)."""

    def learn(self) -> None:
        """A scheduled update, unless the guard rolls the drafter back instead: steps over the rows
        added since the last one (at least a batch of the newest) and replay_rows before them, in
        batches of batch_rows, `epochs` times (in a new order after the first)."""
        self._rounds = 0
        start = time.perf_counter()
        new_rows, self._learned_rows = self.buffer.rows_added - self._learned_rows, self.buffer.rows_added
        if self.guard.check(self.drafter.module):
            self.stats.rollbacks += 1
            self.reset_optimizer()
        else:
            batches = self._recent_batches(max(self.config.batch_rows, new_rows) + self.config.replay_rows)
            order = torch.Generator().manual_seed(self.stats.steps)
            for epoch in range(self.config.epochs):
                for index in range(len(batches)) if epoch == 0 else torch.randperm(len(batches), generator=order):
                    self._step(batches[index])
        self.stats.learn_s += time.perf_counter() - start

    def _recent_batches(self, rows: int) -> list[list[Trace]]:
        """The buffer's newest `rows` rows in batches of at most batch_rows rows."""
        return _batches(self.buffer.recent(rows), self.config.batch_rows)

    def _learn_prompt(self) -> None:
        """The next step on the prompt's rows. The guard judges the weights at the next scheduled step."""
        start = time.perf_counter()
        self._step(self._prompt_steps.popleft())
        self.stats.learn_s += time.perf_counter() - start

    @torch.enable_grad()  # whatever mode the caller runs in: transformers' generate() runs under no_grad
    def _step(self, batch: list[Trace]) -> None:
        loss = self.update(lambda module: self.loss(module, batch))
        if loss is None:
            self.stats.skipped += 1
        else:
            self.stats.steps += 1
            self.stats.losses.append(loss)
            self.drafter.version += 1

    def loss(self, module: torch.nn.Module, traces: list[Trace]) -> torch.Tensor:
        """Row-weighted mean loss of module over traces."""
        total = sum(
            drafter_loss(
                self.drafter.training_outputs(module, trace, self.config.train_depth),
                trace,
                self.drafter.row_of,
                self.config.loss,
            )
            * trace.length
            for trace in traces
        )
        return total / sum(trace.length for trace in traces)

    def update(self, loss_of: Callable[[torch.nn.Module], torch.Tensor]) -> float | None:
        """Update the drafter from loss_of(module) -> the loss before the update, None if it was skipped."""
        raise NotImplementedError

    def reset_optimizer(self) -> None:
        """Forget optimizer state (after a rollback)."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The drafter's weights and the optimizer's tensors, to outlive the process."""
        weights = {f"drafter.{key}": value for key, value in self.drafter.module.state_dict().items()}
        return {**weights, **{f"optimizer.{key}": value for key, value in self._optimizer_tensors().items()}}

    def state_meta(self) -> dict:
        return {
            "learner": self.name,
            "drafter": self.drafter.name,
            "drafter_version": self.drafter.version,
            **self.stats.to_dict(),
        }

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Go on from state_tensors() and state_meta() of the same learner and drafter."""
        if (meta.get("learner"), meta.get("drafter")) != (self.name, self.drafter.name):
            raise EvospecError(
                f"saved state is of learner {meta.get('learner')!r} on {meta.get('drafter')!r}, "
                f"not {self.name!r} on {self.drafter.name!r}"
            )
        self.drafter.module.load_state_dict(tensors_under(tensors, "drafter."))
        self._load_optimizer_tensors(tensors_under(tensors, "optimizer."))
        self.drafter.version = int(meta["drafter_version"])
        self.stats.steps = int(meta.get("steps", 0))
        self.stats.skipped = int(meta.get("skipped", 0))
        self.stats.rollbacks = int(meta.get("rollbacks", 0))
        self.stats.learn_s = float(meta.get("learn_s", 0.0))

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def _load_optimizer_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what _optimizer_tensors() returned."""

    def report(self) -> dict:
        """What it did and the memory it holds, for benchmark results."""
        return {
            "learner": self.name,
            "drafter": self.drafter.name,
            "drafter_version": self.drafter.version,
            **self.stats.to_dict(),
            "memory_bytes": self.nbytes(),
        }

    def nbytes(self) -> dict[str, int]:
        """Memory held: feedback buffer, the prompt rows still to learn, optimizer state (and copies),
        the guard's good weights."""
        prompt = sum(trace.nbytes for batch in self._prompt_steps for trace in batch)
        return {
            "buffer": self.buffer.nbytes(),
            "prompt": prompt,
            "optimizer": self._optimizer_nbytes(),
            "guard": self.guard.nbytes(),
        }

    def _optimizer_nbytes(self) -> int:
        return 0


def tensors_under(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named prefix + key, by key: one part of a learner's saved state."""
    return {key.removeprefix(prefix): value for key, value in tensors.items() if key.startswith(prefix)}


def _batches(traces: list[Trace], rows: int) -> list[list[Trace]]:
    """Traces of 2 or more rows cut into windows of at most `rows` rows (window_spans) and packed, in
    order, into batches of at most `rows` rows."""
    windows = [
        trace.window(start, stop)
        for trace in traces
        if trace.length >= 2
        for start, stop in window_spans(0, trace.length, rows)
    ]
    return packed(windows, [window.length for window in windows], rows)


def _gradients(module: torch.nn.Module, loss: torch.Tensor, clip: float) -> list[torch.Tensor] | None:
    """Gradients of loss w.r.t. module's trainable parameters, norm-clipped; None if anything is not finite."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not torch.isfinite(loss):
        return None
    # allow_unused: a Hydra head deeper than every trace gets no gradient this step
    grads = [
        torch.zeros_like(p) if g is None else g
        for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))
    ]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if not torch.isfinite(norm):
        return None
    scale = min(1.0, clip / (float(norm) + 1e-12))
    return [g * scale for g in grads]


def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


class OGDLearner(OnlineLearner):
    """Online gradient descent: w <- w - lr * g_t."""

    name = "ogd"

    def update(self, loss_of):
        loss = loss_of(self.drafter.module)
        grads = _gradients(self.drafter.module, loss, self.config.grad_clip)
        if grads is None:
            return None
        with torch.no_grad():
            for param, step in zip(_trainable(self.drafter.module), self.direction(grads)):
                param.sub_(self.lr * step)
        return loss.item()

    def direction(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the step subtracts, in units of lr: the gradient itself."""
        return grads


class AdamWLearner(OnlineLearner):
    """AdamW (torch.optim.AdamW) on the clipped gradients: each weight's step is scaled by its own
    gradients' running moments, which carry over from step to step and request to request."""

    name = "adamw"
    default_lr = 3e-5  # OnlineSPEC's; the best of 1e-5..3e-3 on the GSM8K stream (benchmarks/)

    def __init__(self, drafter: LearnableDrafter, config: LearnerConfig) -> None:
        super().__init__(drafter, config)
        self.reset_optimizer()

    def update(self, loss_of):
        loss = loss_of(self.drafter.module)
        grads = _gradients(self.drafter.module, loss, self.config.grad_clip)
        if grads is None:
            return None
        _adamw_step(self.optimizer, self.drafter.module, grads)
        return loss.item()

    def reset_optimizer(self) -> None:
        self.optimizer = torch.optim.AdamW(_trainable(self.drafter.module), lr=self.lr)

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        return _adamw_tensors(self.optimizer)

    def _load_optimizer_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        _load_adamw_tensors(self.optimizer, tensors)

    def _optimizer_nbytes(self) -> int:
        return sum(value.nbytes for value in self._optimizer_tensors().values())


def _adamw_step(optimizer: torch.optim.AdamW, module: torch.nn.Module, grads: list[torch.Tensor]) -> None:
    for param, grad in zip(_trainable(module), grads):
        param.grad = grad
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _adamw_tensors(optimizer: torch.optim.AdamW) -> dict[str, torch.Tensor]:
    """An AdamW's moments and step counts, named '<parameter index>.<key>'."""
    return {
        f"{index}.{key}": value
        for index, state in optimizer.state_dict()["state"].items()
        for key, value in state.items()
    }


def _load_adamw_tensors(optimizer: torch.optim.AdamW, tensors: dict[str, torch.Tensor]) -> None:
    """Restore what _adamw_tensors() returned."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value.clone()  # AdamW updates its moments in place
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


class OptimisticLearner(OGDLearner):
    """Optimistic OGD: the previous gradient hints the next, w <- w - lr * (2 g_t - g_{t-1}); or, in its
    momentum form, SGD with momentum kept across steps."""

    name = "optimistic"

    def __init__(self, drafter: LearnableDrafter, config: LearnerConfig) -> None:
        super().__init__(drafter, config)
        self._previous: list[torch.Tensor] | None = None  # g_{t-1}, or the momentum buffer

    def direction(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.config.optimistic_form == "hint":
            steps = grads if self._previous is None else [2 * g - h for g, h in zip(grads, self._previous)]
            self._previous = grads
            return steps
        previous = self._previous or [torch.zeros_like(g) for g in grads]
        self._previous = [self.config.momentum * h + g for g, h in zip(grads, previous)]
        return self._previous

    def reset_optimizer(self) -> None:
        self._previous = None

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        return {str(i): t for i, t in enumerate(self._previous or [])}

    def _load_optimizer_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self._previous = [tensors[str(i)] for i in range(len(tensors))] or None

    def _optimizer_nbytes(self) -> int:
        return sum(t.nbytes for t in self._previous) if self._previous else 0


class EnsembleLearner(OnlineLearner):
    """Copies of the drafter learn with lr * scale each, by OGD or each with its own AdamW
    (ensemble_base); Hedge weights them by their discounted online losses, and the drafter serves the
    weighted average of their weights."""

    name = "ensemble"

    def __init__(self, drafter: LearnableDrafter, config: LearnerConfig) -> None:
        super().__init__(drafter, config)
        if config.lr is None and config.ensemble_base == "adamw":
            self.lr = AdamWLearner.default_lr
        self.copies = [copy.deepcopy(drafter.module) for _ in config.ensemble_scales]
        self.discounted_losses = torch.zeros(len(self.copies))
        self.optimizers = self._new_optimizers()

    @property
    def weights(self) -> torch.Tensor:
        """Hedge weights of the copies [K]."""
        return torch.softmax(-self.discounted_losses / self.config.hedge_temperature, dim=0)

    def _new_optimizers(self) -> list[torch.optim.AdamW]:
        """One AdamW per copy at its own rate (adamw base); none for OGD, which keeps no state."""
        if self.config.ensemble_base != "adamw":
            return []
        scales = self.config.ensemble_scales
        return [torch.optim.AdamW(_trainable(module), lr=self.lr * scale) for module, scale in zip(self.copies, scales)]

    def update(self, loss_of):
        losses = []
        for index, (module, scale) in enumerate(zip(self.copies, self.config.ensemble_scales)):
            loss = loss_of(module)
            grads = _gradients(module, loss, self.config.grad_clip)
            if grads is None:
                return None
            losses.append(loss.item())
            if self.optimizers:
                _adamw_step(self.optimizers[index], module, grads)
                continue
            with torch.no_grad():
                for param, grad in zip(_trainable(module), grads):
                    param.sub_(self.lr * scale * grad)
        served = float((self.weights * torch.tensor(losses)).sum())  # the combination's expected online loss
        self.discounted_losses = self.config.hedge_discount * self.discounted_losses + torch.tensor(losses)
        self._serve_combination()
        return served

    def _serve_combination(self) -> None:
        weights = self.weights.tolist()
        copies = [_trainable(module) for module in self.copies]
        with torch.no_grad():
            for index, param in enumerate(_trainable(self.drafter.module)):
                param.copy_(sum(w * params[index] for w, params in zip(weights, copies)))

    def end_chunk(self) -> None:
        if self.config.restart_each_chunk:
            for module in self.copies:
                module.load_state_dict(self.drafter.module.state_dict())

    def reset_optimizer(self) -> None:
        for module in self.copies:  # every copy restarts from the restored weights
            module.load_state_dict(self.drafter.module.state_dict())
        self.discounted_losses.zero_()
        self.optimizers = self._new_optimizers()

    def state_meta(self) -> dict:
        return {**super().state_meta(), "ensemble_base": self.config.ensemble_base}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        saved = meta.get("ensemble_base", "ogd")  # states saved before adamw copies were ogd's
        if saved != self.config.ensemble_base:
            raise EvospecError(
                f"saved state is of an ensemble of {saved} copies, not {self.config.ensemble_base}: "
                f"run with --ensemble-base {saved}"
            )
        super().load_state(tensors, meta)

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        copies = {
            f"copy{i}.{key}": value
            for i, module in enumerate(self.copies)
            for key, value in module.state_dict().items()
        }
        moments = {
            f"adamw{i}.{key}": value
            for i, optimizer in enumerate(self.optimizers)
            for key, value in _adamw_tensors(optimizer).items()
        }
        return {**copies, **moments, "discounted_losses": self.discounted_losses}

    def _load_optimizer_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for i, module in enumerate(self.copies):
            module.load_state_dict(tensors_under(tensors, f"copy{i}."))
        for i, optimizer in enumerate(self.optimizers):
            _load_adamw_tensors(optimizer, tensors_under(tensors, f"adamw{i}."))
        self.discounted_losses = tensors["discounted_losses"].clone()

    def _optimizer_nbytes(self) -> int:
        moments = sum(value.nbytes for optimizer in self.optimizers for value in _adamw_tensors(optimizer).values())
        return sum(p.nbytes for module in self.copies for p in module.parameters()) + moments
