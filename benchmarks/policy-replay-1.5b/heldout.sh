#!/bin/bash
cd "$(dirname "$0")/../.."  # the repository root
for c in mixed category:mt_bench category:translation category:summarization category:qa category:math_reasoning category:rag; do
  args=(--method evospec-plain)
  for d in ngram suffix; do
    args+=(--method "evospec:$d/k=auto")
    for cfg in exploration=0.2,discount=0.99,prior_acceptance=0.3 exploration=0.2,discount=0.995,prior_acceptance=0.3 exploration=0.1,discount=0.995,prior_acceptance=0.5; do
      args+=(--method "evospec:$d/k=auto@$cfg")
    done
  done
  .venv/bin/python benchmarks/policy_replay.py --traces "${HELDOUT_TRACES:?a cache of the first 10 prompts per category}" --collect-per-category 10 --skip 5 --per-category 5 --stream $c \
    "${args[@]}" --out "${OUT:?}"/grid-heldout/${c#category:} > "${OUT}"/grid-heldout-${c#category:}.log 2>&1
done

