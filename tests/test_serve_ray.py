"""`evospec serve --replicas 2` on Ray Serve, started once for the module in a process of its own, serving
a tiny random model with two replicas of one thread each and a learner training an eagle drafter.
Every greedy answer must be plain decoding's; the replicas serve the learner's weights; a replica or
the learner killed with SIGKILL comes back without failing more than the request in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from evospec.cli import main
from evospec.config import GenerationConfig, LoadConfig
from evospec.errors import EvospecError
from evospec.generation import TextGenerator, build_engine
from evospec.models.loading import load_model
from evospec.serve.config import ServerConfig

from conftest import TINY_VOCAB, tiny_model, white_box, word_tokenizer

MODEL = "tiny"
K = 3
MAX_NEW = 24
LONG = "w10 w11 w10 w11 w12"  # its greedy continuation runs past LONGEST tokens without EOS
LONGEST = 1000  # tokens of the answers that are still being made when a replica is killed (seconds)
PROMPTS = ["w1 w2 w3 w4 w1 w2", "w7 w8 w9", LONG, "w40"]
WORDS = ["<unk>", "<eos>", *(f"w{i}" for i in range(TINY_VOCAB - 2))]
ENGINE = "ray::ServeReplica:evospec:EngineReplica"  # the process titles Ray gives the replicas and the learner
LEARNER = "ray::Learner"
START_TIMEOUT_S = 300  # Ray, the learner and two replicas on a busy 2-core machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny target (a word tokenizer) with room for LONGEST tokens, and an eagle checkpoint for it in eagle/."""
    directory = tmp_path_factory.mktemp("replicated")
    model = tiny_model(seed=0)
    model.config.max_position_embeddings = 2 * LONGEST  # rotary positions: the same weights, a longer context
    model.save_pretrained(directory)
    word_tokenizer(WORDS).save_pretrained(directory)
    target = load_model(str(directory), "hf", LoadConfig(dtype="fp32"))
    white_box("eagle", target).save(directory / "eagle", target.name)
    return directory


@pytest.fixture(scope="module")
def expected(model_dir) -> dict[str, tuple[str, str]]:
    """(text, finish_reason) of plain greedy decoding for each prompt."""
    target = load_model(str(model_dir), "hf", LoadConfig(dtype="fp32"))
    plain = TextGenerator(target, build_engine(target, []))
    answers = {prompt: plain.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW)) for prompt in PROMPTS}
    return {prompt: (answer.text, answer.finish_reason) for prompt, answer in answers.items()}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """The server's process, URL and state directory."""

    def __init__(self, process: subprocess.Popen, url: str, state_dir: Path) -> None:
        self.process, self.url, self.state_dir = process, url, state_dir

    def pids(self, title: str) -> list[int]:
        """The server's descendants whose command line starts with title."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(stat.parent.name))
        found, todo = [], [self.process.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                todo.append(child)
                try:
                    if Path(f"/proc/{child}/cmdline").read_bytes().startswith(title.encode()):
                        found.append(child)
                except OSError:
                    continue
        return found


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[Server]:
    """Two replicas of one thread; ngram, suffix and a learning eagle; the state saved after every request."""
    state_dir, log = tmp_path_factory.mktemp("state"), tmp_path_factory.mktemp("log") / "server.log"
    port = free_port()
    command = [
        *(sys.executable, "-m", "evospec.cli", "serve", "--replicas", "2", "--threads-per-replica", "1"),
        *("--target", str(model_dir), "--backend", "hf", "--dtype", "fp32", "--served-model-name", MODEL),
        *("--drafter", "ngram", "--drafter", "suffix", "--drafter", f"eagle:{model_dir / 'eagle'}"),
        *("--learner", "ogd", "--learn-every", "2", "--k", str(K), "--max-new-tokens", str(MAX_NEW)),
        *("--port", str(port), "--state-dir", str(state_dir), "--save-every", "1"),
    ]
    # A session of its own: if it does not stop, its Ray processes go with it.
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    served = Server(process, f"http://127.0.0.1:{port}", state_dir)
    try:

        def started() -> bool:
            assert process.poll() is None, f"the server stopped; its log: {log}"
            return health(served.url) == 200

        until(started, START_TIMEOUT_S, f"the server to start (log: {log})")
        yield served
    finally:
        process.send_signal(signal.SIGTERM)  # the replicas hand what is left to the learner, which saves
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def until(condition: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.2):
    """condition's first true value, asked every every_s seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    raise TimeoutError(f"waited {timeout_s} s for {what}")


def health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code
    except httpx.TransportError:
        return None


def completion(url: str, prompt: str, max_tokens: int = MAX_NEW, started: threading.Event | None = None) -> dict:
    """A greedy streamed completion: {"text", "finish_reason", "usage"}, or {"status", "error"} (with
    "retry_after" when the status says). started is set at its first piece."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            response.read()
            retry_after = response.headers.get("retry-after")
            return {"status": response.status_code, "error": response.json()["error"], "retry_after": retry_after}
        text, finish_reason, usage = "", None, None
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line.removeprefix("data: "))
            if "error" in data:  # the stream had begun: its error comes in it
                return {"status": 200, "error": data["error"]}
            for choice in data["choices"]:
                text += choice["text"]
                finish_reason = choice["finish_reason"] or finish_reason
            usage = data.get("usage") or usage
            if started is not None:
                started.set()
    return {"text": text, "finish_reason": finish_reason, "usage": usage}


def metrics(url: str) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(sample name, labels): value}."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_eight_concurrent_streaming_clients_get_plain_greedy_decoding_from_both_replicas(server, expected):
    def one_client(index: int) -> list[dict]:
        return [completion(server.url, PROMPTS[(index + request) % len(PROMPTS)]) for request in range(3)]

    with ThreadPoolExecutor(8) as pool:
        running = pool.map(one_client, range(8))
        assert health(server.url) == 200  # every replica busy: /health waits for none of them
        answers = [answer for answers in running for answer in answers]
    assert all("error" not in answer for answer in answers), answers
    got = [(answer["text"], answer["finish_reason"]) for answer in answers]
    assert got == [expected[PROMPTS[(index + request) % len(PROMPTS)]] for index in range(8) for request in range(3)]
    assert {answer["usage"]["replica"] for answer in answers} == {0, 1}

    def counted() -> bool:  # each replica sends its metrics to the learner right after each request
        samples = metrics(server.url)
        finished = [
            metric(samples, "vllm:request_success_total", finished_reason=reason, replica=replica) or 0
            for reason in ("stop", "length")
            for replica in ("0", "1")
        ]
        return sum(finished) >= 24 and metric(samples, "vllm:generation_tokens_total", replica="1") > 0

    until(counted, 10, "/metrics to count every request")


def test_the_learner_learns_from_both_replicas_and_both_serve_its_new_weights(server, expected):
    """The learner's version rises; each replica's answers (usage) and series (/metrics) say it serves
    weights of a version above 0, loaded from the learner."""
    served_versions: dict[int, int] = {}

    def both_serve_new_weights() -> bool:
        answer = completion(server.url, PROMPTS[0])
        assert (answer["text"], answer["finish_reason"]) == expected[PROMPTS[0]]
        version = answer["usage"]["drafter_versions"]["eagle"]
        served_versions[answer["usage"]["replica"]] = max(version, served_versions.get(answer["usage"]["replica"], 0))
        samples = metrics(server.url)
        replicas = [metric(samples, "evospec:drafter_version", drafter="eagle", replica=str(r)) or 0 for r in (0, 1)]
        return len(served_versions) == 2 and min(served_versions.values()) > 0 and min(replicas) > 0

    until(both_serve_new_weights, 120, "both replicas to serve learned weights", every_s=0)
    samples = metrics(server.url)
    learned = metric(samples, "evospec:drafter_version", drafter="eagle")
    assert learned >= max(served_versions.values()) > 0
    assert metric(samples, "evospec:learner_steps", drafter="eagle", outcome="taken") == learned
    assert metric(samples, "evospec:state_sequence") > 0


def test_a_killed_replica_fails_only_its_request_in_flight_and_comes_back(server, expected):
    """Four long requests on two replicas (two in flight, two queued); one replica is killed with SIGKILL
    mid-answer. Its request gets a clear 503 to retry; the others are answered; Ray starts a new replica.
    Where the kill comes too late to find a request on its replica (a machine slow to stream the first
    pieces), no request fails and it is tried again, up to 3 times."""
    long_answer = completion(server.url, LONG, LONGEST)
    assert long_answer["text"].startswith(expected[LONG][0])
    for _ in range(3):
        failed = kill_a_replica_under_load(server, long_answer["text"])
        if failed:
            break
    assert len(failed) == 1
    assert failed[0]["error"]["code"] == "replica_unavailable" and "again" in failed[0]["error"]["message"]


def kill_a_replica_under_load(server: Server, long_text: str) -> list[dict]:
    """Kill a replica once two of four long requests stream; the answers that failed, once Ray has
    restarted it (each of the others is plain decoding's)."""
    before = server.pids(ENGINE)
    assert len(before) == 2
    starts = [threading.Event() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(completion, server.url, LONG, LONGEST, started) for started in starts]
        until(lambda: sum(started.is_set() for started in starts) == 2, 60, "two requests in flight", every_s=0.01)
        os.kill(before[0], signal.SIGKILL)
        answers = [answer.result() for answer in answers]
    assert all(answer["text"] == long_text for answer in answers if "error" not in answer)

    def restarted() -> bool:  # a new replica process, and two requests at once are answered by two replicas
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda prompt: completion(server.url, prompt), [LONG, LONG]))
        assert all("error" not in answer for answer in answers), answers
        now = server.pids(ENGINE)
        return len(now) == 2 and before[0] not in now and {answer["usage"]["replica"] for answer in answers} == {0, 1}

    until(restarted, 180, "Ray to restart the replica", every_s=0.5)
    failed = [answer for answer in answers if "error" in answer]
    assert len(failed) <= 1, answers  # at most the one request in flight on the killed replica
    return failed


def test_a_killed_learner_restarts_from_its_last_complete_save(server, expected):
    completion(server.url, PROMPTS[3])

    def learned() -> tuple[float, float]:
        samples = metrics(server.url)
        return metric(samples, "evospec:state_sequence"), metric(samples, "evospec:drafter_version", drafter="eagle")

    def settled() -> tuple[float, float] | None:
        """What was learned and saved, once two reads more than a sync apart agree (every request handed over)."""
        first = learned()
        time.sleep(1.5)
        return first if learned() == first else None

    sequence, version = until(settled, 30, "the learned state to settle")
    manifest = json.loads((server.state_dir / f"{int(sequence):08d}" / "manifest.json").read_text())
    assert manifest["drafter_version"] == version > 0
    (learner,) = server.pids(LEARNER)
    os.kill(learner, signal.SIGKILL)

    def answers_metrics() -> dict | None:
        try:
            return metrics(server.url)
        except httpx.HTTPError:
            return None

    # The learner may have finished one more save between the read and the kill: the last complete save
    # on disk is what it must come back with.
    last = max(int(save.parent.name) for save in server.state_dir.glob("*/manifest.json"))
    assert last >= sequence
    saved = json.loads((server.state_dir / f"{last:08d}" / "manifest.json").read_text())
    samples = until(lambda: server.pids(LEARNER) and answers_metrics(), 180, "the learner to restart", every_s=0.5)
    assert server.pids(LEARNER) != [learner]
    assert metric(samples, "evospec:state_sequence") == last
    assert metric(samples, "evospec:drafter_version", drafter="eagle") == saved["drafter_version"]  # nothing lost
    answer = completion(server.url, PROMPTS[0])
    assert (answer["text"], answer["finish_reason"]) == expected[PROMPTS[0]]

    def learning_again() -> bool:
        samples = metrics(server.url)
        return metric(samples, "evospec:state_sequence") > last and (
            metric(samples, "evospec:drafter_version", drafter="eagle") > saved["drafter_version"]
        )

    until(learning_again, 60, "the restarted learner to learn and save")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--replicas", "0"], "replicas must be >= 1"),
        (["--replicas", "2", "--threads-per-replica", "0"], "threads-per-replica must be >= 1"),
        (["--ray-address", "127.0.0.1:6379"], "--ray-address: only with --replicas N"),
        (["--replicas", "2", "--ray-address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
        (["--replicas", "2", "--ray-address", "127.0.0.1:x"], "expected HOST:PORT"),
    ],
)
def test_bad_replica_options_are_one_line_errors(model_dir, capsys, options, message):
    status = main(["serve", "--target", str(model_dir), "--backend", "hf", *options])
    error = capsys.readouterr().err
    assert status == 2 and message in error and error.count("\n") == 1


def test_a_learner_whose_model_does_not_load_answers_ready_with_that_error():
    """What the server then stops with (as a server of one process does), not Ray's account of a dead actor."""
    from evospec.serve.cluster import Learner

    def load() -> None:
        raise EvospecError("'/no/such/model': no such file or directory")

    learner = Learner(load, ServerConfig(), threads=torch.get_num_threads())
    with pytest.raises(EvospecError, match="no such file"):
        learner.ready()


def test_without_ray_installed_replicas_say_how_to_install_it(model_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as it does where it is not installed
    monkeypatch.delitem(sys.modules, "evospec.serve.cluster", raising=False)
    status = main(["serve", "--target", str(model_dir), "--backend", "hf", "--replicas", "2"])
    error = capsys.readouterr().err
    assert status == 2 and "pip install 'evospec[serve-ray]'" in error and error.count("\n") == 1


def test_the_single_process_server_never_imports_ray():
    code = (
        "import sys\n"
        "from evospec.cli import build_parser\n"
        "import evospec.serve.app, evospec.serve.worker\n"
        "build_parser().parse_args(['serve', '--target', 'x'])\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'ray'))\n"
    )
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "[]"
