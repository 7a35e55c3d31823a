"""Load test of `evospec serve`: concurrent streaming chat clients, greedy, every answer checked.

Each client sends its requests one after another; an answer counts as a success only when it is complete
(a finish reason and the usage chunk before [DONE]) and its text equals the server's non-streaming answer
to the same prompt, fetched first. Prints JSON: failures, time to first token and per-request decode
tokens/s (percentiles), the aggregate tokens/s, and by replica (a server of replicas names the one in
each answer's usage) its requests, tau by quarter of the run and the drafter versions it served, from
each answer's usage. With --out X.json, also X-requests.json (one row per request) and, when a drafter
learned, X-tau.png (tau per request against its finish, one colour per replica). Usage:
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --model qwen2.5-coder-1.5b-instruct
    python benchmarks/serve_load.py --target qwen2.5-coder-1.5b-instruct --drafter ngram  # starts its own server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import openai

from evospec.bench.workloads import spec_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server; without it, one is started with the options below")
    parser.add_argument("--model", help="the model name the server serves (default: --target)")
    parser.add_argument("--api-key", default=os.environ.get("EVOSPEC_API_KEY", "none"))
    parser.add_argument("--target", help="for the server this script starts")
    parser.add_argument("--drafter", action="append", default=[], help="for the server this script starts (repeatable)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="one more argument for the server this script starts, e.g. --server-arg=--k=3",
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=25, help="per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", action="append", help="repeatable (default: Spec-Bench, one per category)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if not args.url and not args.target:
        parser.error("give --url of a running server or --target for one to start")
    model = args.model or args.target
    prompts = args.prompt or [prompt.text for prompt in spec_bench(1)]
    process, url = (None, args.url) if args.url else start_server(args)
    try:
        results = asyncio.run(run_load(url, model, args.api_key, prompts, args.clients, args.requests, args.max_tokens))
    finally:
        if process:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    results = {
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        "url": url,
        "model": model,
        **results,
    }
    rows = results.pop("per_request")
    print(json.dumps(results, indent=1))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        out.with_name(f"{out.stem}-requests.json").write_text(json.dumps(rows, indent=1) + "\n")
        if any(row["drafter_version"] for row in rows):
            plot_tau(rows, out.with_name(f"{out.stem}-tau.png"))


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """`evospec serve` on a free loopback port; (process, URL) once /health says it is ready."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "evospec.cli",
        "serve",
        "--target",
        args.target,
        "--port",
        str(port),
        *(f"--drafter={drafter}" for drafter in args.drafter),
        *args.server_arg,
    ]
    if args.model:
        command.append(f"--served-model-name={args.model}")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    while process.poll() is None:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server exited with status {process.returncode}")


async def run_load(
    url: str, model: str, api_key: str, prompts: list[str], clients: int, requests: int, max_tokens: int
) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=3600)
    settings = {"model": model, "max_tokens": max_tokens, "temperature": 0}

    async def reference(prompt: str) -> str:
        answer = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **settings)
        return answer.choices[0].message.content

    expected = {prompt: await reference(prompt) for prompt in prompts}

    async def one_request(prompt: str) -> dict:
        start = time.perf_counter()
        first = None
        pieces, finish_reason, usage = [], None, None
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
            **settings,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                pieces.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish_reason = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
        end = time.perf_counter()
        first = first or end
        tokens = usage.completion_tokens if usage else 0
        served = usage.model_dump() if usage else {}
        return {
            "ok": finish_reason is not None and usage is not None and "".join(pieces) == expected[prompt],
            "ttft_s": first - start,
            "tokens": tokens,
            "tokens_per_s": (tokens - 1) / (end - first) if tokens > 1 and end > first else None,
            "finished_s": end - load_start,
            "replica": served.get("replica", 0),
            "tau": (served.get("spec_decode") or {}).get("tau"),
            "drafter_version": sum((served.get("drafter_versions") or {}).values()),
        }

    async def one_client(index: int) -> list[dict]:
        results = []
        for request in range(requests):
            try:
                results.append(await one_request(prompts[(index * requests + request) % len(prompts)]))
            except openai.OpenAIError as error:
                results.append({"ok": False, "error": str(error)})
        return results

    load_start = time.perf_counter()
    results = [result for group in await asyncio.gather(*map(one_client, range(clients))) for result in group]
    wall = time.perf_counter() - load_start
    done = sorted((result for result in results if "ttft_s" in result), key=lambda result: result["finished_s"])
    return {
        "clients": clients,
        "requests_per_client": requests,
        "max_tokens": max_tokens,
        "prompts": len(prompts),
        "requests": len(results),
        "failures": sum(not result["ok"] for result in results),
        "errors": sorted({result["error"] for result in results if "error" in result})[:5],
        "wall_s": round(wall, 2),
        "aggregate_tokens_per_s": round(sum(r["tokens"] for r in done) / wall, 2),
        "ttft_s": percentiles([r["ttft_s"] for r in done]),
        "tokens_per_s": percentiles([r["tokens_per_s"] for r in done if r["tokens_per_s"] is not None]),
        "replicas": by_replica(done),
        "per_request": done,
    }


def by_replica(done: list[dict]) -> dict[str, dict]:
    """Each replica's requests, its tau (emitted tokens per verification, mean over its requests) in each
    quarter of the run by finish order, and the lowest and highest drafter version its answers report."""
    quarters = [done[len(done) * q // 4 : len(done) * (q + 1) // 4] for q in range(4)]

    def mean_tau(rows: list[dict]) -> float | None:
        taus = [row["tau"] for row in rows if row["tau"] is not None]
        return round(sum(taus) / len(taus), 4) if taus else None

    summary = {}
    for replica in sorted({row["replica"] for row in done}):
        versions = [row["drafter_version"] for row in done if row["replica"] == replica]
        summary[str(replica)] = {
            "requests": len(versions),
            "tau_by_quarter": [mean_tau([row for row in quarter if row["replica"] == replica]) for quarter in quarters],
            "drafter_versions": [min(versions), max(versions)],
        }
    return summary


def plot_tau(done: list[dict], path: Path) -> None:
    """Tau of every request against the time it finished, one colour per replica."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.5))
    for replica in sorted({row["replica"] for row in done}):
        rows = [row for row in done if row["replica"] == replica and row["tau"] is not None]
        axes.plot([row["finished_s"] for row in rows], [row["tau"] for row in rows], ".", label=f"replica {replica}")
    axes.set(xlabel="finished at (s)", ylabel="tau (tokens per verification)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def percentiles(values: list[float]) -> dict[str, float] | None:
    """p50, p90, p99 (nearest rank) and max."""
    ordered = sorted(values)

    def at(quantile: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(quantile * len(ordered)))], 4)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)} if ordered else None


if __name__ == "__main__":
    main()
