"""`evospec serve`: the real openai client (and raw HTTP for what it cannot send) against a live uvicorn on
loopback, serving a tiny random model. Every greedy answer must be exactly what `evospec generate` says."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
import torch
import uvicorn

from evospec.cli import main
from evospec.config import GenerationConfig, LoadConfig
from evospec.drafters.registry import build_drafter, new_white_box_drafter
from evospec.drafters.whitebox import WhiteBoxConfig
from evospec.errors import EvospecError
from evospec.generation import TextGenerator, build_engine
from evospec.learning import LearnerConfig, build_learner
from evospec.models.loading import load_model
from evospec.reasoning import StepConfig, StepSpeculator
from evospec.selection import build_selector
from evospec.serve.app import create_app
from evospec.serve.config import ServerConfig
from evospec.serve.state import SAVE_DELAY_ENV, StateStore
from evospec.serve.worker import Served

from conftest import TINY_VOCAB, load_script, tiny_model, word_tokenizer

MODEL = "tiny"
FP32 = LoadConfig(dtype="fp32")
KEY = "sk-test"
K = 3
MAX_NEW = 24  # the server's default max_tokens, and what the tests ask for
LIMITS = {"max_prompt_tokens": 40, "max_prediction_tokens": 60, "max_tokens_limit": 200, "max_body_bytes": 16_384}
DRAFTERS = ("ngram", "suffix", "prediction")
WORDS = ["<unk>", "<eos>", "system", "user", "assistant", *(f"w{i}" for i in range(TINY_VOCAB - 5))]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)
LONG = "w10 w11 w10 w11 w12"  # its greedy continuation runs past 200 tokens without EOS
PROMPTS = ["w1 w2 w3 w4 w1 w2", "w7 w8 w9", LONG, "w40"]  # "w40" ends on EOS
CONVERSATION = [
    {"role": "system", "content": "w5 w6"},
    {"role": "user", "content": "w1 w2 w3"},
    {"role": "assistant", "content": "w4"},
    {"role": "user", "content": "w1 w2"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The tiny target with a word tokenizer that has a (minimal) chat template."""
    directory = tmp_path_factory.mktemp("served")
    tiny_model(seed=0).save_pretrained(directory)
    tokenizer = word_tokenizer(WORDS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return str(directory)


def model_args(model_dir: str) -> list[str]:
    """The same target and drafters for `evospec generate` and the server."""
    return [
        "--target",
        model_dir,
        "--backend",
        "hf",
        "--dtype",
        "fp32",
        *(f"--drafter={spec}" for spec in DRAFTERS),
        "--k",
        str(K),
    ]


def evospec_generate(model_dir: str, prompt: str, chat: bool = False) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(
            [
                "generate",
                prompt,
                *model_args(model_dir),
                "--max-new-tokens",
                str(MAX_NEW),
                "--json",
                *(["--chat"] if chat else []),
            ]
        )
    assert status == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def expected(model_dir) -> dict[str, dict]:
    """What `evospec generate` says for each prompt (greedy)."""
    answers = {prompt: evospec_generate(model_dir, prompt) for prompt in PROMPTS}
    answers["chat"] = evospec_generate(model_dir, "w1 w2 w3", chat=True)
    assert answers["w40"]["finish_reason"] == "stop" and answers[LONG]["finish_reason"] == "length"
    return answers


def load_served(model_dir: str, specs: tuple[str, ...] = DRAFTERS) -> Served:
    target = load_model(model_dir, "hf", FP32)
    drafters = [build_drafter(spec, target, FP32) for spec in specs]
    return Served(
        TextGenerator(
            target, build_engine(target, drafters, selector=build_selector("ucb-bd", [d.name for d in drafters]))
        )
    )


def wait_for(url: str, statuses: tuple[int, ...], timeout_s: float = 60.0) -> None:
    """Until GET /health answers one of statuses."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health").status_code in statuses:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health did not answer {statuses}")


def wait_healthy(url: str) -> None:
    wait_for(url, (200,))


def wait_listening(url: str) -> None:
    wait_for(url, (200, 503))


@contextlib.contextmanager
def running(app) -> Iterator[str]:
    """The app on uvicorn, in a thread, on a free loopback port; its base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def serving(config: ServerConfig, load) -> contextlib.AbstractContextManager[str]:
    return running(create_app(config, MODEL, load, GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=K)))


@pytest.fixture(scope="module")
def server(model_dir) -> Iterator[str]:
    """A server with an API key and tight limits, once its model is loaded."""
    with serving(ServerConfig(api_key=KEY, **LIMITS), lambda: load_served(model_dir)) as url:
        wait_healthy(url)
        yield url


def test_health_is_503_until_the_model_is_loaded_and_a_failed_load_is_reported(model_dir):
    loaded = threading.Event()

    def slow_load() -> Served:
        loaded.wait(30)
        return load_served(model_dir)

    with serving(ServerConfig(), slow_load) as url:
        wait_listening(url)
        assert httpx.get(f"{url}/health").json() == {"status": "loading"}
        refused = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "w1"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_not_ready"
        loaded.set()
        wait_healthy(url)

    def failing_load() -> Served:
        raise OSError("no such weights")

    with serving(ServerConfig(), failing_load) as url:
        wait_listening(url)
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health").json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.02)
        response = httpx.get(f"{url}/health")
        assert response.status_code == 503 and response.json() == {"status": "failed"}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    """One sample of /metrics (0 when absent), e.g. 'vllm:request_success_total{finished_reason="abort"}'."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def completion_text(openai_client: openai.OpenAI, prompt: str, stream: bool, max_tokens: int = MAX_NEW):
    """(text, finish_reason, usage) of a greedy completion, streamed or not."""
    response = openai_client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=stream,
        stream_options={"include_usage": True} if stream else None,
    )
    if not stream:
        return response.choices[0].text, response.choices[0].finish_reason, response.usage
    chunks = list(response)
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices), finish[0], chunks[-1].usage


@pytest.mark.parametrize("stream", [False, True])
def test_completions_say_what_evospec_generate_says(server, expected, stream):
    for prompt in PROMPTS:
        text, finish_reason, usage = completion_text(client(server), prompt, stream)
        assert (text, finish_reason) == (expected[prompt]["text"], expected[prompt]["finish_reason"])
        assert usage.completion_tokens == len(expected[prompt]["token_ids"])
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert usage.model_extra["spec_decode"]["new_tokens"] == usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_chat_says_what_evospec_generate_chat_says(server, expected, stream):
    messages = [{"role": "user", "content": "w1 w2 w3"}]
    response = client(server).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=MAX_NEW, temperature=0, stream=stream
    )
    if stream:
        chunks = list(response)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        finish_reason = chunks[-1].choices[0].finish_reason
    else:
        text, finish_reason = response.choices[0].message.content, response.choices[0].finish_reason
        assert response.usage.model_extra["spec_decode"]["num_verifications"] > 0
    assert (text, finish_reason) == (expected["chat"]["text"], expected["chat"]["finish_reason"])


def test_chat_takes_the_whole_conversation(server, model_dir):
    generator = load_served(model_dir).generator
    reference = generator.generate(CONVERSATION, GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=K))
    answer = client(server).chat.completions.create(
        model=MODEL, messages=CONVERSATION, temperature=0, max_completion_tokens=MAX_NEW
    )
    assert answer.choices[0].message.content == reference.text
    assert answer.usage.prompt_tokens == len(reference.prompt_ids) > 10


def test_models_and_metrics(server):
    assert [model.id for model in client(server).models.list()] == [MODEL]
    client(server).completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_NEW, temperature=0)
    response = httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    for name in (
        'vllm:spec_decode_num_drafts_total{drafter="ngram"}',
        'vllm:spec_decode_num_draft_tokens_total{drafter="ngram"}',
        'vllm:spec_decode_num_accepted_tokens_total{drafter="ngram"}',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
        'evospec:selector_pulls_total{drafter="suffix"}',
        "vllm:generation_tokens_total",
        'vllm:request_success_total{finished_reason="length"}',
    ):
        assert metric(server, name) > 0, name
    assert "evospec:drafter_version 0.0" in response.text


def bad(
    name: str,
    path: str,
    status: int,
    *,
    body=None,
    content: bytes | None = None,
    key: str | None = KEY,
    method: str = "POST",
):
    return pytest.param(method, path, body, content, key, status, id=name)


PROMPT = {"model": MODEL, "prompt": "w1"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}]}
BAD_CASES = [
    bad("malformed-json", "/v1/completions", 400, content=b'{"model": "tiny", "prompt": '),
    bad("not-an-object", "/v1/completions", 400, body=[1, 2]),
    bad("no-prompt", "/v1/completions", 400, body={"model": MODEL}),
    bad("no-model", "/v1/completions", 400, body={"prompt": "w1"}),
    bad("prompt-not-text", "/v1/completions", 400, body={"model": MODEL, "prompt": 5}),
    bad("max-tokens-a-string", "/v1/completions", 400, body={**PROMPT, "max_tokens": "10"}),
    bad("max-tokens-negative", "/v1/completions", 400, body={**PROMPT, "max_tokens": -1}),
    bad("max-tokens-huge", "/v1/completions", 400, body={**PROMPT, "max_tokens": 10**9}),
    bad("temperature-negative", "/v1/completions", 400, body={**PROMPT, "temperature": -0.5}),
    bad("top-p-over-1", "/v1/completions", 400, body={**PROMPT, "top_p": 1.5}),
    bad("seed-negative", "/v1/completions", 400, body={**PROMPT, "seed": -3}),
    bad("stop-empty", "/v1/completions", 400, body={**PROMPT, "stop": [""]}),
    bad("n-2", "/v1/completions", 400, body={**PROMPT, "n": 2}),
    bad("stream-a-string", "/v1/completions", 400, body={**PROMPT, "stream": "yes"}),
    bad("prompt-empty", "/v1/completions", 400, body={**PROMPT, "prompt": "   "}),
    bad("prompt-too-long", "/v1/completions", 400, body={**PROMPT, "prompt": "w1 " * 100}),
    bad("unknown-model", "/v1/completions", 404, body={**PROMPT, "model": "gpt-4"}),
    bad("body-too-large", "/v1/completions", 413, content=b'{"model": "tiny", "prompt": "' + b"w1 " * 10_000 + b'"}'),
    bad("messages-empty", "/v1/chat/completions", 400, body={**CHAT, "messages": []}),
    bad("messages-text", "/v1/chat/completions", 400, body={**CHAT, "messages": "w1 w2"}),
    bad("role-unknown", "/v1/chat/completions", 400, body={**CHAT, "messages": [{"role": "x", "content": "w1"}]}),
    bad("content-not-text", "/v1/chat/completions", 400, body={**CHAT, "messages": [{"role": "user", "content": 1}]}),
    bad("prediction-a-string", "/v1/chat/completions", 400, body={**CHAT, "prediction": "w1 w2"}),
    bad(
        "prediction-wrong-type",
        "/v1/chat/completions",
        400,
        body={**CHAT, "prediction": {"type": "text", "content": "w1"}},
    ),
    bad(
        "prediction-image-part",
        "/v1/chat/completions",
        400,
        body={
            **CHAT,
            "prediction": {
                "type": "content",
                "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
            },
        },
    ),
    bad(
        "prediction-too-long",
        "/v1/completions",
        400,
        body={**PROMPT, "prediction": {"type": "content", "content": "w1 " * 100}},
    ),
    bad("no-api-key", "/v1/completions", 401, body=PROMPT, key=None),
    bad("wrong-api-key", "/v1/completions", 401, body=PROMPT, key="sk-wrong"),
    bad("metrics-wrong-api-key", "/metrics", 401, key="sk-wrong", method="GET"),
    bad("no-such-route", "/v1/no-such-route", 404, body={}),
    bad("wrong-method", "/v1/completions", 405, method="GET"),
]


@pytest.mark.parametrize("method, path, body, content, key, status", BAD_CASES)
def test_bad_input_is_an_openai_error_and_the_server_stays_up(server, method, path, body, content, key, status):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if content is not None:
        headers["Content-Type"] = "application/json"
    response = httpx.request(method, f"{server}{path}", json=body, content=content, headers=headers, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert httpx.get(f"{server}/health").status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_prediction_is_drafted_and_its_tokens_are_counted_as_openai_counts_them(server, expected, stream):
    """The predicted text drafted by the prediction drafter: the answer is still the target's own, and
    usage says how many of the prediction's tokens were accepted and rejected."""
    answer = expected["chat"]
    words = answer["text"].split()
    predictions = {"right": answer["text"], "edited": " ".join([*words[:3], "w90", *words[4:]])}
    for kind, prediction in predictions.items():
        parts = [{"type": "text", "text": prediction[:5]}, {"type": "text", "text": prediction[5:]}]
        response = client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "w1 w2 w3"}],
            max_tokens=MAX_NEW,
            temperature=0,
            prediction={"type": "content", "content": parts if kind == "edited" else prediction},
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
        )
        if stream:
            chunks = list(response)
            text, usage = (
                "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices),
                chunks[-1].usage,
            )
        else:
            text, usage = response.choices[0].message.content, response.usage
        assert text == answer["text"], kind
        details = usage.completion_tokens_details
        drafted = usage.model_extra["spec_decode"]["drafters"].get("prediction", {})
        assert details.accepted_prediction_tokens == drafted.get("num_accepted_tokens", 0)
        assert (
            details.rejected_prediction_tokens
            == drafted.get("num_draft_tokens", 0) - details.accepted_prediction_tokens
        )
        if kind == "right":
            assert details.accepted_prediction_tokens > 0


def test_a_prediction_needs_the_prediction_drafter(model_dir):
    with serving(ServerConfig(), lambda: load_served(model_dir, ("ngram",))) as url:
        wait_healthy(url)
        response = httpx.post(
            f"{url}/v1/chat/completions", json={**CHAT, "prediction": {"type": "content", "content": "w1"}}
        )
        assert response.status_code == 400 and "--drafter prediction" in response.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 200


class KeepNoStep:
    """A judge that keeps no drafted step: step-level speculation then answers as plain decoding."""

    name = "keep-none"

    def aligned(self, drafted: str, target: str) -> bool:
        return False


def test_a_reasoning_request_is_answered_by_step_level_speculation(model_dir, expected):
    def load() -> Served:
        target = load_model(model_dir, "hf", FP32)
        drafter = build_drafter(f"lm:{model_dir}", target, FP32)
        steps = StepSpeculator(target, drafter, KeepNoStep(), StepConfig(delimiter="w10", max_step_tokens=5))
        return Served(TextGenerator(target, build_engine(target, [drafter]), steps))

    with serving(ServerConfig(), load) as url:
        wait_healthy(url)
        body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": MAX_NEW, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json={**body, "reasoning_speculation": True}).json()
        assert answer["choices"][0]["text"] == expected[PROMPTS[0]]["text"]
        steps = answer["usage"]["spec_decode"]
        assert steps["num_draft_steps"] >= MAX_NEW // 5 and steps["step_acceptance_rate"] is not None
        metrics = httpx.get(f"{url}/metrics").text
        assert 'evospec:reasoning_steps_total{verdict="rejected"}' in metrics
        token_level = httpx.post(f"{url}/v1/completions", json=body).json()
        assert "num_draft_steps" not in token_level["usage"]["spec_decode"]


def test_a_reasoning_request_needs_a_server_that_speculates_by_steps(server):
    body = {"model": MODEL, "prompt": "w1 w2", "max_tokens": 4, "reasoning_speculation": True}
    response = httpx.post(f"{server}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and "--reasoning-speculation" in response.json()["error"]["message"]


def test_concurrent_streaming_clients_each_get_their_own_complete_answer(server, expected):
    def one_client(index: int) -> list[bool]:
        openai_client = client(server)
        results = []
        for request in range(3):
            prompt = PROMPTS[(index + request) % len(PROMPTS)]
            text, finish_reason, usage = completion_text(openai_client, prompt, stream=True)
            results.append((text, finish_reason) == (expected[prompt]["text"], expected[prompt]["finish_reason"]))
        return results

    with ThreadPoolExecutor(8) as pool:
        outcomes = [ok for results in pool.map(one_client, range(8)) for ok in results]
    assert outcomes == [True] * 24


def test_the_load_benchmark_in_small_reports_no_failures_and_its_percentiles(server):
    """benchmarks/serve_load.py itself, 4 streaming clients x 3 requests (the issue's run: 8 x 25)."""
    load = load_script("serve_load")
    results = asyncio.run(load.run_load(server, MODEL, KEY, PROMPTS, clients=4, requests=3, max_tokens=MAX_NEW))
    assert results["requests"] == 12 and results["failures"] == 0 and not results["errors"]
    assert 0 < results["ttft_s"]["p50"] <= results["ttft_s"]["p90"] <= results["ttft_s"]["max"]
    assert results["tokens_per_s"]["p50"] > 0 and results["aggregate_tokens_per_s"] > 0
    assert list(results["replicas"]) == ["0"] and results["replicas"]["0"]["requests"] == 12
    finished = [row["finished_s"] for row in results["per_request"]]
    assert finished == sorted(finished) and all(row["tau"] >= 1 for row in results["per_request"])


def test_a_client_that_leaves_stops_its_generation(server, expected):
    aborted = 'vllm:request_success_total{finished_reason="abort"}'
    aborts, tokens = metric(server, aborted), metric(server, "vllm:generation_tokens_total")
    body = {"model": MODEL, "prompt": LONG, "max_tokens": LIMITS["max_tokens_limit"], "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, headers=headers) as response:
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    deadline = time.monotonic() + 10
    while metric(server, aborted) == aborts and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(server, aborted) == aborts + 1  # not "length": it did not run to the end
    assert metric(server, "vllm:generation_tokens_total") - tokens < LIMITS["max_tokens_limit"]
    text, finish_reason, _ = completion_text(client(server), LONG, stream=False)
    assert (text, finish_reason) == (expected[LONG]["text"], expected[LONG]["finish_reason"])


def learning_server(model_dir: str) -> Served:
    """The tiny target with a fresh eagle drafter that an OGD learner trains every other round."""
    target = load_model(model_dir, "hf", FP32)
    torch.manual_seed(0)
    drafter = new_white_box_drafter(
        "eagle", target, config=WhiteBoxConfig("eagle", 64, head_vocab=80, intermediate_size=96)
    )
    learner = build_learner("ogd", drafter, LearnerConfig(every=2, batch_rows=16))
    return Served.with_learners(TextGenerator(target, build_engine(target, [drafter], learners=[learner])))


def test_a_learning_server_answers_as_generate_and_goes_on_learning_after_a_restart(model_dir, expected, tmp_path):
    """The drafter changes between and within requests, the text never does; what it learned is saved
    at shutdown and restored at start."""
    config = ServerConfig(state_dir=tmp_path, **LIMITS)
    versions = []
    for prompts in (PROMPTS[:2], PROMPTS[2:]):
        with serving(config, lambda: learning_server(model_dir)) as url:
            wait_healthy(url)
            restored = metric(url, "evospec:drafter_version")
            openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            for prompt in prompts:
                text, finish_reason, usage = completion_text(openai_client, prompt, stream=True)
                assert (text, finish_reason) == (expected[prompt]["text"], expected[prompt]["finish_reason"])
                assert usage.model_extra["spec_decode"]["learn_s"] > 0
            versions.append((restored, metric(url, "evospec:drafter_version")))
            assert metric(url, 'evospec:learner_steps{drafter="eagle",outcome="taken"}') == versions[-1][1]
            assert metric(url, "evospec:learn_seconds_total") > 0
    (first_start, first_end), (second_start, second_end) = versions
    assert first_start == 0 and first_end > 0
    assert second_start == first_end and second_end > second_start


class Weights:
    """A Stateful component with tensors, as a learner will be."""

    def __init__(self, value: float) -> None:
        self.weight, self.steps = torch.full((3, 2), value), int(value)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def state_meta(self) -> dict:
        return {"steps": self.steps}

    def load_state(self, tensors, meta) -> None:
        self.weight, self.steps = tensors["weight"], meta["steps"]


def test_state_store_keeps_components_whose_names_are_no_file_names(tmp_path):
    """The server names a learner after its drafter: 'learner:lora:MODEL', 'learner:eagle'."""
    store = StateStore(tmp_path)
    names = ("learner:lora:models/qwen", "learner:eagle")
    store.save({name: Weights(float(index)) for index, name in enumerate(names)}, drafter_version=1)
    assert sorted(path.name for path in (tmp_path / "00000001").iterdir()) == [
        "learner_eagle.json",
        "learner_eagle.safetensors",
        "learner_lora_models_qwen.json",
        "learner_lora_models_qwen.safetensors",
        "manifest.json",
    ]
    restored = {name: Weights(7.0) for name in names}
    assert store.load(restored).sequence == 1
    assert [float(restored[name].weight[0, 0]) for name in names] == [0.0, 1.0]
    with pytest.raises(EvospecError, match="would share files"):
        store.save({"learner:eagle": Weights(1.0), "learner_eagle": Weights(2.0)}, drafter_version=1)


def test_state_store_loads_the_newest_complete_save(tmp_path, caplog):
    store = StateStore(tmp_path, keep=3)
    for value in (1.0, 2.0, 3.0):
        store.save({"learner": Weights(value)}, drafter_version=int(value))
    (tmp_path / "00000003" / "learner.safetensors").write_bytes(b"not what was saved")  # a bad disk
    (tmp_path / "00000004").mkdir()  # a save killed before its manifest
    restored = Weights(0.0)
    saved = store.load({"learner": restored, "newcomer": Weights(5.0)})
    assert (saved.sequence, saved.drafter_version) == (2, 2)
    assert torch.equal(restored.weight, torch.full((3, 2), 2.0)) and restored.steps == 2
    assert "00000004: no manifest" in caplog.text and "checksum mismatch in learner.safetensors" in caplog.text
    assert "nothing for newcomer" in caplog.text
    assert store.save({"learner": restored}, drafter_version=2).sequence == 5  # numbers are never reused
    assert sorted(path.name for path in tmp_path.iterdir()) == ["00000002", "00000003", "00000005"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir: str, state_dir: Path, log: Path, save_every: int, env: dict[str, str]):
    """`python -m evospec.cli serve` in a process of its own, output appended to log; (process, URL) once healthy."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "evospec.cli",
        "serve",
        *model_args(model_dir),
        "--served-model-name",
        MODEL,
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        "--save-every",
        str(save_every),
        "--max-new-tokens",
        str(MAX_NEW),
    ]
    process = subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    return process, url


def test_a_server_killed_mid_save_restarts_from_the_last_complete_state(model_dir, expected, tmp_path):
    state, log = tmp_path / "state", tmp_path / "server.log"
    process, url = start_server(model_dir, state, log, 1, {SAVE_DELAY_ENV: "0.5"})  # each save takes 1 s
    try:
        openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        completion_text(openai_client, PROMPTS[0], stream=False)
        deadline = time.monotonic() + 20
        while not (state / "00000001" / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        completion_text(openai_client, PROMPTS[1], stream=False)
        while not (state / "00000002" / "selector.safetensors").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert (state / "00000001" / "manifest.json").exists()
    assert not (state / "00000002" / "manifest.json").exists()  # killed mid-save: one file written, not the rest

    process, url = start_server(model_dir, state, log, 100, {})
    try:
        assert metric(url, "evospec:state_sequence") == 1  # the last complete save, not the partial one
        openai_client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        text, finish_reason, _ = completion_text(openai_client, PROMPTS[2], stream=True)
        assert (text, finish_reason) == (expected[PROMPTS[2]]["text"], expected[PROMPTS[2]]["finish_reason"])
    finally:
        process.send_signal(signal.SIGTERM)  # a clean stop saves once more (uvicorn then re-raises SIGTERM)
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert sorted(path.name for path in state.iterdir()) == ["00000001", "00000003"]  # the partial save is gone
    assert (state / "00000003" / "manifest.json").exists()
    assert "skipping state" in log.read_text() and "restored state 1" in log.read_text()
