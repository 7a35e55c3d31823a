#!/bin/bash
cd "$(dirname "$0")/../.."  # the repository root
for c in mixed category:mt_bench category:translation category:summarization category:qa category:math_reasoning category:rag; do
  args=(--method evospec-plain)
  for d in ngram suffix; do
    args+=(--method "evospec:$d/k=auto")
    for e in 0.1 0.2 0.3; do for disc in 0.99 0.995; do for p in 0.5 0.3; do
      args+=(--method "evospec:$d/k=auto@exploration=$e,discount=$disc,prior_acceptance=$p")
    done; done; done
  done
  .venv/bin/python benchmarks/policy_replay.py --traces "${TRACES:?the cache of learning_replay.py}" --stream $c --per-category 4 \
    "${args[@]}" --out "${OUT:?}"/grid-tuning/${c#category:} > "${OUT}"/grid-tuning-${c#category:}.log 2>&1
done

