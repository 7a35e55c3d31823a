"""The command line: the only place that parses arguments."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from evospec.bench import SUITES
from evospec.config import (
    BACKENDS,
    DEFAULT_DTYPE,
    DTYPES,
    JUDGE_KINDS,
    GenerationConfig,
    LoadConfig,
    SamplingConfig,
    StepConfig,
)
from evospec.errors import EvospecError
from evospec.learning.learners import ENSEMBLE_BASES, SCHEDULES, AdamWLearner, LearnerConfig, OnlineLearner
from evospec.learning.preference import StepPreferenceLearner
from evospec.learning.registry import LEARNERS, NO_LEARNER, STEP_LEARNERS
from evospec.serve.config import ClusterConfig, ServerConfig

if TYPE_CHECKING:
    from evospec.generation import Share, TextGenerator

DEFAULTS = GenerationConfig()
LEARNING = LearnerConfig()
TRAIN_DEPTH_HELP = "eagle: draft depths each row is trained at, the later ones on the head's own features (EAGLE-3)"
DEFAULT_SAMPLING = SamplingConfig()
SERVER = ServerConfig()
CLUSTER = ClusterConfig()
STEPS = StepConfig()
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"
DEMO_K = 64  # long drafts: where a CPU gains from speculation


def _add_generation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=DEFAULTS.num_speculative_tokens, help="draft length per round")
    parser.add_argument(
        "--adaptive-k",
        action="store_true",
        help="choose the draft length each round (at most --k) from the target's measured "
        "forward cost and the drafter's acceptance",
    )
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    _add_backend_options(parser)


def _add_backend_options(parser: argparse.ArgumentParser, verifies: bool = True) -> None:
    """--backend and --dtype, and --exact-verify for the commands that verify drafts."""
    parser.add_argument(
        "--backend", choices=BACKENDS, help="default: llamacpp for GGUF files and zoo aliases on a CPU, hf otherwise"
    )
    parser.add_argument("--dtype", choices=DTYPES, help=f"hf backend only (default {DEFAULT_DTYPE})")
    if not verifies:
        parser.set_defaults(exact_verify=LoadConfig.exact_verify)
        return
    parser.add_argument(
        "--exact-verify",
        action="store_true",
        help="llama.cpp: verify in calls of at most 3 rows, each computed as a one-token step, so "
        "the output is plain decoding's bit for bit where the kernels allow (slower)",
    )


def _load_config(args: argparse.Namespace) -> LoadConfig:
    """How the options say models load and run."""
    return LoadConfig(dtype=args.dtype, exact_verify=args.exact_verify)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="zoo alias, local directory, .gguf file or HF id")
    parser.add_argument(
        "--drafter",
        action="append",
        help="none | ngram | suffix | prediction | eagle[:CHECKPOINT] | hydra[:CHECKPOINT] | "
        "lm:MODEL (or just MODEL) | "
        "lora:MODEL (a small LM whose adapters --learner trains); "
        "repeat for a selector to pick among",
    )
    parser.add_argument(
        "--selector",
        help="ucb-bd (default with several drafters) | ucb-be | ucb-bd-contextual | ucb-be-contextual | "
        "ucb-speed | exp3 | hedge | contextual | "
        "contextual-speed | thompson | thompson-speed | egreedy | round-robin | fixed:NAME",
    )
    learning = parser.add_argument_group("online learning (eagle, hydra and lora:MODEL drafters)")
    learning.add_argument(
        "--learner",
        choices=[NO_LEARNER, *LEARNERS, *STEP_LEARNERS],
        default=NO_LEARNER,
        help="train every learnable drafter while it serves (default: none, frozen); "
        f"{' and '.join(STEP_LEARNERS)} learn from judged reasoning steps (--reasoning-speculation)",
    )
    _add_learning_options(learning)
    _add_step_options(parser)
    _add_generation_options(parser)


def _add_step_options(parser: argparse.ArgumentParser) -> None:
    steps = parser.add_argument_group("step-level speculation for reasoning (lossy, opt-in)")
    steps.add_argument(
        "--reasoning-speculation",
        action="store_true",
        help="the small-LM drafter writes each reasoning step, the target writes its own, and a judge "
        "decides whether the drafter's may stand; kept drafter steps change the output. A server "
        "takes it per request too (reasoning_speculation)",
    )
    steps.add_argument(
        "--judge",
        choices=JUDGE_KINDS,
        default=STEPS.judge,
        help="target: the target answers a judge prompt; embedding: all-MiniLM-L6-v2 cosine similarity",
    )
    steps.add_argument(
        "--similarity", type=float, default=STEPS.similarity, help="the embedding judge's cosine threshold"
    )
    steps.add_argument(
        "--step-delimiter",
        default=STEPS.delimiter,
        help="text that ends a step (default: a paragraph break; escapes such as \\n are read)",
    )
    steps.add_argument("--max-step-tokens", type=int, default=STEPS.max_step_tokens, help="longest step")
    steps.add_argument(
        "--same-numbers",
        action="store_true",
        help="keep a drafted step only if it states the numbers the target's step states (arithmetic)",
    )
    steps.add_argument(
        "--lookahead",
        type=int,
        default=STEPS.lookahead,
        help="steps drafted a round; above 1 the target writes its versions of them side by side (greedy)",
    )
    steps.add_argument(
        "--follow-target",
        action="store_true",
        help="emit the target's every step (lossless): the drafter's steps are only judged and learned from",
    )


def _step_config(args: argparse.Namespace) -> StepConfig:
    delimiter = args.step_delimiter
    if "\\" in delimiter:  # typed on a command line: \n is a newline
        delimiter = delimiter.encode().decode("unicode_escape")
    return StepConfig(
        delimiter=delimiter,
        max_step_tokens=args.max_step_tokens,
        judge=args.judge,
        similarity=args.similarity,
        same_numbers=args.same_numbers,
        follow_target=args.follow_target,
        lookahead=args.lookahead,
    )


def _add_learning_options(group) -> None:
    """How learners learn (generate and serve with --learner; bench for its learning methods)."""
    group.add_argument(
        "--lr",
        type=float,
        default=LEARNING.lr,
        help=f"learning rate (the ensemble's smallest; default: {OnlineLearner.default_lr}, "
        f"adamw and an ensemble of adamw copies {AdamWLearner.default_lr}, "
        f"{' and '.join(STEP_LEARNERS)} {StepPreferenceLearner.default_lr})",
    )
    group.add_argument(
        "--ensemble-base",
        choices=ENSEMBLE_BASES,
        default=LEARNING.ensemble_base,
        help="how each copy of the ensemble learner steps: ogd (OnlineSPEC's Ens-Eagle), or adamw with its own moments",
    )
    group.add_argument(
        "--learn-schedule",
        choices=SCHEDULES,
        default=LEARNING.schedule,
        help="step every --learn-every rounds, after each request, or after every --learn-every requests",
    )
    _add_int_options(
        group,
        ("--learn-every", LEARNING.every, "rounds (or requests, by the schedule) between learning steps"),
        ("--buffer-rows", LEARNING.buffer_rows, "feedback rows kept for learning"),
        ("--learn-epochs", LEARNING.epochs, "passes a scheduled update makes over the rows new since the last"),
        ("--replay-rows", LEARNING.replay_rows, "older rows each scheduled update learns again"),
        (
            "--learn-prompt-rows",
            LEARNING.prompt_rows,
            "eagle, hydra: learn from this many of a prompt's last rows while answering it, a step a round (0: never)",
        ),
        ("--train-depth", LEARNING.train_depth, TRAIN_DEPTH_HELP),
    )


def _add_int_options(parser, *options: tuple[str, int | None, str]) -> None:
    """Integer options, each (flag, default, help)."""
    for flag, default, description in options:
        parser.add_argument(flag, type=int, default=default, help=description)


def _learner_config(args: argparse.Namespace) -> LearnerConfig:
    batch_rows = min(LEARNING.batch_rows, args.buffer_rows)
    return LearnerConfig(
        lr=args.lr,
        schedule=args.learn_schedule,
        every=args.learn_every,
        buffer_rows=args.buffer_rows,
        batch_rows=max(2, batch_rows),
        epochs=args.learn_epochs,
        replay_rows=args.replay_rows,
        prompt_rows=args.learn_prompt_rows,
        train_depth=args.train_depth,
        ensemble_base=args.ensemble_base,
    )


def _generation_config(args: argparse.Namespace, **overrides) -> GenerationConfig:
    sampling = SamplingConfig(
        temperature=getattr(args, "temperature", DEFAULT_SAMPLING.temperature),
        top_k=getattr(args, "top_k", DEFAULT_SAMPLING.top_k),
        top_p=getattr(args, "top_p", DEFAULT_SAMPLING.top_p),
        seed=getattr(args, "seed", DEFAULT_SAMPLING.seed),
    )
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        num_speculative_tokens=args.k,
        stop=tuple(getattr(args, "stop", None) or ()),
        sampling=sampling,
        reasoning_speculation=getattr(args, "reasoning_speculation", False),
        **overrides,
    )


def _generator_loader(args: argparse.Namespace, config: GenerationConfig) -> Callable[..., TextGenerator]:
    """Check the model options now; the function returned loads the target, drafters and selector they
    name (seconds to minutes) and puts them behind a TextGenerator (its selector and learners what
    share makes of them, where it is given: build_engine_from_names)."""
    specs = args.drafter or ["none"]
    if args.selector and len(specs) < 2:
        raise EvospecError("--selector picks among several drafters: give --drafter more than once")
    learner_config = _learner_config(args)
    step_config = _step_config(args) if args.reasoning_speculation else None
    step_flags = [
        flag
        for flag, on in (
            ("--same-numbers", args.same_numbers),
            ("--follow-target", args.follow_target),
            ("--lookahead", args.lookahead != STEPS.lookahead),
        )
        if on
    ]
    if step_flags and step_config is None:
        raise EvospecError(f"{' and '.join(step_flags)} judge reasoning steps: add --reasoning-speculation")
    if args.learner in STEP_LEARNERS and step_config is None:
        raise EvospecError(f"learner {args.learner!r} learns from judged reasoning steps: add --reasoning-speculation")

    def load(share: Share | None = None) -> TextGenerator:
        from evospec.drafters.registry import build_drafter
        from evospec.generation import TextGenerator, build_engine_from_names
        from evospec.models.loading import load_model

        load = _load_config(args)
        target = load_model(args.target, args.backend, load)
        drafters = [drafter for spec in specs if (drafter := build_drafter(spec, target, load))]
        engine = build_engine_from_names(
            target,
            drafters,
            args.selector,
            args.learner,
            learner_config,
            config.num_speculative_tokens,
            args.adaptive_k,
            share,
        )
        if step_config is None:
            return TextGenerator(target, engine)
        from evospec.reasoning import build_step_speculator

        return TextGenerator(target, engine, build_step_speculator(target, engine, step_config))

    return load


def _read_prediction(source: str | None) -> str | None:
    """The text of --prediction FILE ('-': standard input)."""
    if source is None:
        return None
    try:
        text = sys.stdin.read() if source == "-" else Path(source).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise EvospecError(f"--prediction {source}: cannot read it ({error})") from error
    if not text.strip():
        raise EvospecError(f"--prediction {source}: the prediction is empty")
    return text


def cmd_generate(args: argparse.Namespace) -> None:
    config = _generation_config(args)  # validate settings before loading GBs of weights
    from evospec.drafters.prediction import PREDICTION

    if (
        args.prediction is not None
        and args.drafter
        and PREDICTION not in (spec.partition(":")[0] for spec in args.drafter)
    ):
        raise EvospecError(f"--prediction is drafted by the {PREDICTION} drafter: add --drafter {PREDICTION}")
    prediction = _read_prediction(args.prediction)
    if prediction is not None and not args.drafter:
        args.drafter = [PREDICTION]  # what drafts a prediction
    generator = _generator_loader(args, config)()
    stream = generator.stream(args.prompt, config, chat=args.chat, prediction=prediction)
    if args.json:
        for _ in stream:
            pass
        print(
            json.dumps(
                {
                    "text": stream.text,
                    "token_ids": stream.token_ids,
                    "finish_reason": stream.finish_reason,
                    "stats": stream.stats.to_dict(),
                }
            )
        )
        return
    for piece in stream:
        print(piece, end="", flush=True)
    print()
    stats = stream.stats
    rate = f", acceptance {stats.acceptance_rate:.2f}" if stats.acceptance_rate is not None else ""
    print(f"[{stats.new_tokens} tokens, {stats.tokens_per_s:.2f} tokens/s, tau {stats.tau:.2f}{rate}]", file=sys.stderr)


def _cluster_config(args: argparse.Namespace) -> ClusterConfig | None:
    """How --replicas, --ray-address and --threads-per-replica say the server runs; None: in this process."""
    if args.replicas is None:
        given = [
            flag
            for flag, value in (
                ("--ray-address", args.ray_address),
                ("--threads-per-replica", args.threads_per_replica),
            )
            if value is not None
        ]
        if given:
            raise EvospecError(f"{' and '.join(given)}: only with --replicas N (a server of replicas)")
        return None
    threads = CLUSTER.threads_per_replica if args.threads_per_replica is None else args.threads_per_replica
    return ClusterConfig(replicas=args.replicas, ray_address=args.ray_address, threads_per_replica=threads)


def cmd_serve(args: argparse.Namespace) -> None:
    from evospec.serve.worker import Served

    cluster = _cluster_config(args)
    if cluster is not None and args.reasoning_speculation:
        raise EvospecError("--reasoning-speculation serves in one process; it does not run with --replicas")
    defaults = _generation_config(args)  # check everything before the server starts loading the model
    load_generator = _generator_loader(args, defaults)
    # The options are named as ServerConfig's fields.
    named = {
        field.name: getattr(args, field.name) for field in dataclasses.fields(ServerConfig) if field.name != "state_dir"
    }
    config = ServerConfig(**named, state_dir=Path(args.state_dir) if args.state_dir else None)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")

    def load(share: Share | None = None) -> Served:
        return Served.with_learners(load_generator(share))

    if cluster is None:
        from evospec.serve.app import serve

        serve(config, args.served_model_name or args.target, load, defaults)
        return
    try:
        from evospec.serve.cluster import serve_replicas
    except ImportError as error:
        raise EvospecError(
            f"--replicas runs on Ray Serve, which is not installed ({error}): pip install 'evospec[serve-ray]'"
        ) from error
    serve_replicas(config, cluster, args.served_model_name or args.target, load, defaults)


def cmd_pull(args: argparse.Namespace) -> None:
    from evospec.models.zoo import pull

    for alias in args.alias:
        print(pull(alias))


def cmd_models(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Column, Table

    from evospec.models.zoo import list_zoo

    # The alias is what users type: it stays whole, the long upstream name folds instead.
    table = Table(Column("alias", no_wrap=True), "GGUF size", "pulled", "licence", Column("upstream", overflow="fold"))
    for status in list_zoo():
        entry = status.entry
        table.add_row(
            entry.alias,
            f"{entry.size / 2**20:.0f} MiB",
            "yes" if status.pulled else "no",
            entry.licence,
            entry.upstream,
        )
    Console().print(table)


def cmd_demo(args: argparse.Namespace) -> None:
    from evospec.bench.demo import run_demo

    config = GenerationConfig(num_speculative_tokens=args.k)  # each task sets its own number of new tokens
    run_demo(args.target, config, args.backend, _load_config(args))


def cmd_bench(args: argparse.Namespace) -> None:
    from evospec.bench.runner import BenchSettings, run_bench

    settings = BenchSettings(
        target=args.target,
        draft_model=args.draft_model,
        methods=tuple(args.method) if args.method else None,
        suite=args.suite,
        stream=args.stream,
        per_category=args.per_category,
        backend=args.backend,
        generation=_generation_config(args),
        out_dir=Path(args.out),
        command="evospec " + shlex.join(sys.argv[1:]),
        white_box=Path(args.white_box).expanduser() if args.white_box else None,
        learning=_learner_config(args),
        load=_load_config(args),
    )
    run_bench(settings)


def cmd_train_drafter(args: argparse.Namespace) -> None:
    from evospec.config import DistillConfig
    from evospec.distill import check_run, distill
    from evospec.models.loading import load_model

    options = (
        "data",
        "samples",
        "max_new_tokens",
        "epochs",
        "lr",
        "batch_rows",
        "head_vocab",
        "save_every",
        "max_steps",
        "resume",
        "start_from",
        "seed",
        "train_depth",
    )  # named as DistillConfig's fields
    config = DistillConfig(**{name: getattr(args, name) for name in options})
    out = Path(args.out).expanduser()
    traces = None
    if (Path(args.data).expanduser() / "meta.json").is_file():  # a trace set: the target's answers are given
        from evospec.bench.traces import load_traces

        traces = load_traces(Path(args.data))
        if traces.meta["target"] != args.target:
            raise EvospecError(f"{args.data} holds answers of {traces.meta['target']}, not of {args.target}")
    recorded = [(list(a.prompt_ids), list(a.answer_ids)) for a in traces.answers] if traces else []
    check_run(args.kind, out, config, bool(recorded))  # the corpus and the output directory, before loading
    target = load_model(args.target, args.backend, _load_config(args))
    # The trace set's rows are the passes this run would make, when recorded on the same backend and weights.
    recorded_on = (traces.meta["backend"], traces.meta["weights"]) if traces else None
    same_passes = recorded_on == (target.backend.name, target.weights_format)
    rows = [traces.rows_path(index) for index in range(len(recorded))] if same_passes else []
    print(distill(target, args.kind, out, config, recorded=recorded, recorded_rows=rows).describe())


def cmd_traces_collect(args: argparse.Namespace) -> None:
    from evospec.bench.traces import collect_traces, dataset_prompts, export_answers
    from evospec.models.loading import load_model

    dataset_prompts(args.data)  # a bad --data fails before the target loads
    target = load_model(args.target, args.backend, _load_config(args))
    out = Path(args.out).expanduser() if args.out else None
    traces = collect_traces(target, args.data, args.n, args.max_new_tokens, out)
    print(f"{len(traces.answers)} answers of {target.name} to {args.data} in {traces.directory}")
    if args.export:
        export_answers(traces, Path(args.export))
        print(f"token ids written to {args.export} (answers.jsonl.gz, meta.json)")


def named_traces(values: list[str]) -> tuple[tuple[str, Path], ...]:
    """--traces NAME=DIR (or DIR, named by its folder) -> ((name, directory), ...)."""
    named = []
    for value in values:
        name, _, directory = value.rpartition("=")
        path = Path(directory).expanduser()
        named.append((name or path.name, path))
    if len({name for name, _ in named}) != len(named):
        raise EvospecError(f"--traces names must differ, got {[name for name, _ in named]}")
    return tuple(named)


def cmd_replay(args: argparse.Namespace) -> None:
    from evospec.bench.replay import ReplaySettings, run_replay

    settings = ReplaySettings(
        traces=named_traces(args.traces),
        stream=args.stream,
        interleave=args.interleave,
        methods=tuple(args.method),
        profile=args.profile,
        block_size=args.block_size,
        num_speculative_tokens=args.k,
        out_dir=Path(args.out),
        command="evospec " + shlex.join(sys.argv[1:]),
        draft_model=args.draft_model,
        white_box=Path(args.white_box).expanduser() if args.white_box else None,
        learning=_learner_config(args),
        live=args.live,
    )
    run_replay(settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evospec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text from a prompt")
    generate.add_argument("prompt")
    _add_model_options(generate)
    generate.add_argument("--temperature", type=float, default=DEFAULT_SAMPLING.temperature)
    generate.add_argument("--top-k", type=int, default=DEFAULT_SAMPLING.top_k)
    generate.add_argument("--top-p", type=float, default=DEFAULT_SAMPLING.top_p)
    generate.add_argument("--seed", type=int, default=DEFAULT_SAMPLING.seed)
    generate.add_argument("--stop", action="append", help="stop before this string (repeatable)")
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    generate.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    generate.add_argument(
        "--prediction",
        metavar="FILE",
        help="text the output will repeat much of, e.g. the code being edited ('-': stdin); "
        "drafted by the prediction drafter (the default drafter with this option)",
    )
    generate.set_defaults(handler=cmd_generate)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, metrics)")
    _add_model_options(serve)
    serve.add_argument("--served-model-name", help="the model name clients send (default: --target)")
    serve.add_argument("--host", default=SERVER.host, help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=SERVER.port)
    serve.add_argument(
        "--api-key",
        default=os.environ.get("EVOSPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on all routes but /health (default: $EVOSPEC_API_KEY)",
    )
    serve.add_argument("--state-dir", help="save learned state here and restore it at start (default: keep nothing)")
    serve.add_argument("--save-every", type=int, default=SERVER.save_every, help="requests between saves of the state")
    _add_int_options(  # what a request may ask for
        serve,
        ("--max-prompt-tokens", SERVER.max_prompt_tokens, "the longest prompt"),
        ("--max-prediction-tokens", SERVER.max_prediction_tokens, "the longest prediction (OpenAI Predicted Outputs)"),
        ("--max-tokens-limit", SERVER.max_tokens_limit, "the most max_tokens (none asked: --max-new-tokens)"),
        ("--max-body-bytes", SERVER.max_body_bytes, "the largest request body"),
    )
    replicas = serve.add_argument_group("replicas on Ray Serve (pip install 'evospec[serve-ray]')")
    replicas.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="serve with N engine replicas behind one ingress, and one learner for all of them "
        "(default: one engine in this process, without Ray)",
    )
    replicas.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="the Ray cluster to run on (auto, HOST:PORT or ray://HOST:PORT; default: start Ray in this process)",
    )
    replicas.add_argument(
        "--threads-per-replica",
        type=int,
        metavar="T",
        help=f"CPU threads of each replica's engine and of the learner (default {CLUSTER.threads_per_replica})",
    )
    serve.set_defaults(handler=cmd_serve)

    pull = commands.add_parser("pull", help="download, verify and convert zoo models")
    pull.add_argument("alias", nargs="+")
    pull.set_defaults(handler=cmd_pull)

    models = commands.add_parser("models", help="list the model zoo")
    models.set_defaults(handler=cmd_models)

    demo = commands.add_parser(
        "demo",
        help="where speculation pays and where it does not: an edit, a summary, a chat, each against plain decoding",
    )
    demo.add_argument("--target", default=DEFAULT_TARGET)
    demo.add_argument("--k", type=int, default=DEMO_K, help="the longest draft the adaptive length may verify")
    _add_backend_options(demo)
    demo.set_defaults(handler=cmd_demo)

    bench = commands.add_parser("bench", help="interleaved benchmark on Spec-Bench (greedy, batch 1)")
    bench.add_argument("--target", default=DEFAULT_TARGET)
    bench.add_argument("--draft-model", default=DEFAULT_DRAFT_MODEL)
    bench.add_argument("--method", action="append", help="a method to run (repeatable); default: the suite's")
    bench.add_argument(
        "--suite",
        choices=SUITES,
        default="engine",
        help="engine: baselines and each drafter; selection: each drafter, every selector, the oracle; "
        "edit: baselines and the model-free drafters (ngram, suffix, prediction) with adaptive k; "
        "learning: the --white-box drafter frozen and with each learner",
    )
    bench.add_argument(
        "--stream",
        default="mixed",
        help="mixed or domain-shift (Spec-Bench, category after category), category:NAME, edit "
        "(code edits with the original as the prediction), or several joined by '+' "
        "(e.g. edit+summarization+rag); streams of several categories plot tau per block",
    )
    bench.add_argument("--white-box", metavar="CHECKPOINT", help="an eagle or hydra checkpoint (evospec train-drafter)")
    _add_learning_options(bench.add_argument_group("how the learning methods learn"))
    bench.add_argument("--per-category", type=int, default=5)
    bench.add_argument("--out", default="benchmarks/latest", help="directory for results.json, results.md, plot")
    _add_generation_options(bench)
    bench.set_defaults(handler=cmd_bench)

    traces = commands.add_parser("traces", help="record a target's answers for evospec replay")
    traces_commands = traces.add_subparsers(dest="traces_command", required=True)
    collect = traces_commands.add_parser(
        "collect", help="the target's greedy answers to a dataset, resumable, cached under $EVOSPEC_HOME/traces"
    )
    collect.add_argument("--target", required=True, help="zoo alias, local directory, .gguf file or HF id")
    collect.add_argument(
        "--data",
        required=True,
        help="gsm8k-train | gsm8k-test | humaneval | spec-bench | spec-bench:CATEGORY | a .jsonl or .txt file",
    )
    collect.add_argument("--n", type=int, required=True, help="the first N prompts of the dataset")
    collect.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens, help="longest answer")
    collect.add_argument("--out", help="the trace set's directory (default: under $EVOSPEC_HOME/traces)")
    collect.add_argument("--export", metavar="DIR", help="also write the token ids here, small enough to commit")
    _add_backend_options(collect, verifies=False)
    collect.set_defaults(handler=cmd_traces_collect)

    replay = commands.add_parser(
        "replay", help="bench methods over recorded answers: exact greedy tau and rounds, projected tokens/s"
    )
    replay.add_argument(
        "--traces", action="append", required=True, metavar="[NAME=]DIR", help="a trace set (repeatable)"
    )
    replay.add_argument(
        "--stream",
        help="parts joined by '+', each NAME or NAME[START:END] of the trace sets, one after another "
        "(default: every trace set whole)",
    )
    replay.add_argument("--interleave", action="store_true", help="the parts request by request (a mixed stream)")
    replay.add_argument("--method", action="append", required=True, help="a bench method (repeatable)")
    replay.add_argument(
        "--profile",
        default="measured",
        help="what a target pass costs: measured (this machine's T(n)) or a named profile "
        "(evospec/data/cost_profiles.toml, e.g. h100-bf16-roofline)",
    )
    replay.add_argument("--block-size", type=int, default=100, help="requests per block of per_block and the plot")
    replay.add_argument("--k", type=int, default=DEFAULTS.num_speculative_tokens, help="draft length per round")
    replay.add_argument(
        "--draft-model",
        help="a small LM for evospec:MODEL, the selectors' small-LM arm and evospec:lora:MODEL[+LEARNER]",
    )
    replay.add_argument(
        "--white-box", metavar="CHECKPOINT", help="an eagle or hydra checkpoint (evospec train-drafter)"
    )
    _add_learning_options(replay.add_argument_group("how the learning methods learn"))
    replay.add_argument(
        "--live",
        action="store_true",
        help="run the methods on the real target instead, timed for real (to check a replay against)",
    )
    replay.add_argument("--out", required=True, help="directory for results.json, results.md and plots")
    replay.set_defaults(handler=cmd_replay)

    from evospec.config import DistillConfig  # here, not at the top: only this command's options need it

    warm = DistillConfig()
    train = commands.add_parser(
        "train-drafter", help="warm up an eagle or hydra drafter offline, distilled from the target"
    )
    train.add_argument("--target", required=True, help="zoo alias, local directory, .gguf file or HF id")
    train.add_argument("--kind", required=True, help="eagle | hydra")
    train.add_argument(
        "--out", required=True, help="directory for the checkpoint, the optimizer state and the cached traces"
    )
    train.add_argument(
        "--data",
        default=warm.data,
        help="gsm8k (GSM8K train questions, shipped), a .jsonl file (field question, prompt or text), "
        "a .txt file (one prompt a line), or a trace set of evospec traces collect (its answers are reused)",
    )
    _add_int_options(
        train,
        ("--samples", warm.samples, f"prompts the target answers; the last {warm.holdout * 100:.0f}%% are held out"),
        ("--max-new-tokens", warm.max_new_tokens, "longest answer per prompt"),
        ("--epochs", warm.epochs, "passes over the traces"),
        ("--batch-rows", warm.batch_rows, "trace rows per step"),
        (
            "--head-vocab",
            warm.head_vocab,
            "tokens the drafter can propose, the target's most frequent (default: its own)",
        ),
        ("--save-every", warm.save_every, "steps between checkpoints"),
        ("--max-steps", warm.max_steps, "stop after this many steps in all"),
        ("--seed", warm.seed, "the drafter's first weights and each epoch's order"),
        ("--train-depth", warm.train_depth, TRAIN_DEPTH_HELP),
    )
    train.add_argument("--lr", type=float, default=warm.lr, help="Adam's learning rate")
    train.add_argument("--resume", action="store_true", help="go on from the checkpoint and traces in --out")
    train.add_argument("--from", dest="start_from", metavar="CHECKPOINT", help="start from a saved drafter's weights")
    _add_backend_options(train, verifies=False)
    train.set_defaults(handler=cmd_train_drafter)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except EvospecError as error:
        print(f"evospec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("evospec: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
