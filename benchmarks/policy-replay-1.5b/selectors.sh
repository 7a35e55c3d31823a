#!/bin/bash
# usage: selectors.sh OTHER_ADAPTIVE_SETTINGS TRACES COLLECT_PER_CATEGORY SKIP PER_CATEGORY OUT: each method with the
# default adaptive draft length and with the settings given (e.g. the old exploration=0.5,discount=0.98,prior_acceptance=0.5)
cd "$(dirname "$0")/../.."  # the repository root
CFG=$1
for c in mixed category:mt_bench category:translation category:summarization category:qa category:math_reasoning category:rag; do
  args=(--method evospec-plain)
  for m in evospec:qwen2.5-coder-0.5b-instruct/k=auto evospec:ngram/k=auto evospec:suffix/k=auto select:ucb-bd/k=auto select:ucb-speed/k=auto select:thompson-speed/k=auto; do
    args+=(--method "$m" --method "$m@$CFG")
  done
  .venv/bin/python benchmarks/policy_replay.py --traces $2 --collect-per-category $3 --skip $4 --per-category $5 --stream $c \
    "${args[@]}" --out $6/${c#category:} > "$6-${c#category:}.log" 2>&1
done
