"""MetaSD: rewards computed exactly on hand-made p and q, and bandits on synthetic arms with known means."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from evospec.config import SamplingConfig
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.selection import (
    REWARDS,
    SELECTORS,
    SelectorConfig,
    block_divergence,
    block_efficiency,
    build_selector,
    round_speed,
)
from evospec.types import ArmScore, Draft, Offer, RoundTime, Verdict
from evospec.verify import verify_greedy

SAMPLED = Sampler(SamplingConfig(temperature=1.0))
GREEDY = Sampler(SamplingConfig())
NO_VERDICT = Verdict(0, [0])  # sampled block divergence does not read the verdict
TIME = RoundTime(draft_s=0.01, verify_s=0.1, step_s=0.05)  # block divergence and efficiency do not read it


def logits_of(probs: list[list[float]]) -> torch.Tensor:
    """Logits whose softmax (temperature 1) is exactly probs."""
    return torch.tensor(probs).log()


def test_block_divergence_sums_min_p_q_per_position():
    p = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.2, 0.6]]  # the last row is the bonus position
    q = torch.tensor([[0.2, 0.6, 0.2], [0.1, 0.0, 0.9]])
    draft = Draft(torch.tensor([1, 2]), q)
    expected = ((0.2 + 0.3 + 0.2) + (0.1 + 0.0 + 0.8)) / 2
    assert block_divergence(logits_of(p), draft, NO_VERDICT, SAMPLED, k=2, time=TIME) == pytest.approx(expected)
    assert block_divergence(logits_of(p), draft, NO_VERDICT, SAMPLED, k=4, time=TIME) == pytest.approx(
        expected / 2
    )  # asked 4, drafted 2


def test_block_divergence_with_a_one_hot_q_is_p_of_the_drafted_tokens():
    p = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]
    draft = Draft(torch.tensor([1, 2]), None)
    assert block_divergence(logits_of(p), draft, NO_VERDICT, SAMPLED, k=2, time=TIME) == pytest.approx((0.3 + 0.8) / 2)


def test_greedy_block_divergence_counts_positions_where_the_draft_is_the_targets_choice():
    p = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.7, 0.1], [1 / 3, 1 / 3, 1 / 3]]
    draft = Draft(torch.tensor([1, 2, 1]), None)  # wrong, right, right: BE sees none of it, BD two of three
    verdict = verify_greedy(logits_of(p), draft.tokens)
    assert block_divergence(logits_of(p), draft, verdict, GREEDY, k=3, time=TIME) == pytest.approx(2 / 3)
    assert block_efficiency(logits_of(p), draft, Verdict(0, [0]), GREEDY, k=3, time=TIME) == 0.0
    assert block_efficiency(logits_of(p), draft, Verdict(3, [1, 2, 1, 0]), GREEDY, k=3, time=TIME) == 1.0
    assert (
        block_divergence(logits_of(p), Draft(torch.empty(0, dtype=torch.long), None), verdict, GREEDY, k=3, time=TIME)
        == 0.0
    )


def test_round_speed_is_the_rounds_speedup_over_plain_decoding_squashed_into_0_1():
    p = [[0.1, 0.8, 0.1]] * 4
    draft = Draft(torch.tensor([1, 1, 0]), None)
    verdict = verify_greedy(logits_of(p), draft.tokens)  # two accepted, then the target's own token
    speedup = 3 * 0.1 / (0.1 + 0.3)  # 3 tokens in 0.4 s; plain decoding makes one per 0.1 s
    assert round_speed(logits_of(p), draft, verdict, GREEDY, 3, RoundTime(0.1, 0.3, 0.1)) == pytest.approx(
        speedup / (1 + speedup)
    )
    empty = Draft(torch.empty(0, dtype=torch.long), None)  # nothing to propose: a plain step, speedup 1
    assert round_speed(logits_of(p), empty, Verdict(0, [1]), GREEDY, 3, RoundTime(0.0, 0.1, 0.1)) == pytest.approx(0.5)


def test_ucb_on_speed_prefers_the_faster_arm_where_ucb_on_agreement_prefers_the_closer_one():
    """ "slow" agrees more but drafts for twice a verification: 3.4 tokens per 3 time units against
    "fast"'s 1.5 per unit. A bandit on block divergence picks slow, one on round speed picks fast."""
    p = torch.tensor([[0.1, 0.9]] * 4).log()
    outcomes = {"slow": (0.8, 2.0), "fast": (0.5, 0.0)}  # chance that the whole draft is right; draft_s per verify_s

    def play(name: str) -> dict[str, float]:
        selector, rng = build_selector(name, ["slow", "fast"]), random.Random(0)
        for _ in range(2000):
            arm = selector.select()
            chance, draft_cost = outcomes[arm]
            right = rng.random() < chance
            draft = Draft(torch.tensor([1, 1, 1] if right else ([0, 0, 0] if arm == "fast" else [1, 0, 0])), None)
            verdict = verify_greedy(p, draft.tokens)
            reward = REWARDS[selector.reward_kind](p, draft, verdict, GREEDY, 3, RoundTime(draft_cost * 0.1, 0.1, 0.1))
            selector.update(arm, reward)
        return selector.pulls

    assert max(play("ucb-bd").items(), key=lambda item: item[1])[0] == "slow"
    assert play("ucb-speed")["fast"] > 0.8 * 2000


def bernoulli_bandit(selector, means: list[float], rounds: int, seed: int = 0) -> list[float]:
    """Play a selector on arms with Bernoulli rewards; return the cumulative pseudo-regret after each round."""
    rng = random.Random(seed)
    best, regret, curve = max(means), 0.0, []
    for _ in range(rounds):
        arm = selector.select()
        mean = means[selector.arms.index(arm)]
        selector.update(arm, float(rng.random() < mean))
        regret += best - mean
        curve.append(regret)
    return curve


def test_ucb_concentrates_on_the_best_arm_with_logarithmic_regret():
    arms = ["a", "b", "c"]
    selector = build_selector("ucb-bd", arms)
    curve = bernoulli_bandit(selector, [0.3, 0.5, 0.8], rounds=4000)
    assert selector.pulls["c"] > 0.9 * 4000
    # log t growth: regret over rounds 1000..4000 grows far less than linearly (4x rounds, ~log ratio).
    assert curve[3999] / curve[999] < 1 + 2 * math.log(4)
    assert curve[3999] < 8 * sum(math.log(4000) / (0.8 - m) for m in (0.3, 0.5))


@pytest.mark.parametrize("name", ["exp3", "thompson", "egreedy", "ucb-be", "thompson-speed"])
def test_every_bandit_prefers_the_best_arm(name):
    selector = build_selector(name, ["a", "b", "c"], SelectorConfig(seed=1))
    bernoulli_bandit(selector, [0.2, 0.4, 0.9], rounds=3000, seed=2)
    assert max(selector.pulls, key=selector.pulls.get) == "c"


def test_hedge_learns_every_cheap_arm_from_every_round_and_a_pulled_neural_arm_unbiased():
    """Full information: a, b, c are scored every round (observe), so Hedge settles on c within a few
    dozen rounds; lm (no counterfactual draft) learns only when pulled, importance-weighted."""
    selector = build_selector("hedge", ["lm", "a", "b", "c"], SelectorConfig(seed=1))
    rng, means, picks = random.Random(0), {"lm": 0.6, "a": 0.2, "b": 0.5, "c": 0.8}, []
    for _ in range(600):
        arm = selector.select()
        picks.append(arm)
        rewards = {name: float(rng.random() < mean) for name, mean in means.items()}
        selector.observe({name: ArmScore(rewards[name], "") for name in "abc"})
        selector.update(arm, rewards[arm])
    assert picks[-200:].count("c") > 0.8 * 200
    assert selector.log_weights["c"] > selector.log_weights["lm"] > selector.log_weights["a"]


def test_the_contextual_selector_picks_by_each_rounds_labels_and_beats_every_single_arm():
    """Two cheap arms whose drafts are good with a long match and poor with a short one, the long match
    falling to either arm at random: the contextual selector follows this round's labels, so its
    reward beats both arms', which a selector of one arm (Hedge) cannot."""
    means = {"long": 0.9, "short": 0.2}
    results = {}
    for name in ("contextual", "hedge"):
        selector, rng, total = build_selector(name, ["a", "b"], SelectorConfig(seed=1)), random.Random(0), 0.0
        for _ in range(2000):
            labels = dict(zip("ab", rng.sample(["long", "short"], 2)))
            arm = selector.select({other: Offer(label, asked=4, size=4) for other, label in labels.items()})
            rewards = {other: float(rng.random() < means[labels[other]]) for other in "ab"}
            selector.update(arm, rewards[arm])
            selector.observe({other: ArmScore(rewards[other], labels[other]) for other in "ab"})
            total += rewards[arm]
        results[name] = total / 2000
    assert results["contextual"] > 0.85 > 0.6 > results["hedge"]


def test_the_contextual_selector_explores_an_arm_without_drafts_and_skips_a_cheap_one_without_a_draft():
    selector = build_selector("contextual", ["lm", "a"], SelectorConfig(seed=1))
    match2, match8 = {"a": Offer("match2", 4, 4)}, {"a": Offer("match8", 4, 4)}
    assert selector.select(match2) == "lm"  # never pulled, never scored: tried first
    selector.update("lm", 0.5)
    selector.observe({"a": ArmScore(0.25, "match2")})
    assert selector.select(match2) == "lm"
    selector.observe({"a": ArmScore(1.0, "match8")})
    assert selector.select(match8) == "a"
    assert selector.select({}) == "lm"  # a has nothing to draft this round


@pytest.mark.parametrize("reward", ["bd", "be"])
def test_contextual_ucb_learns_each_labels_arm_from_its_pulls_alone_and_beats_every_single_arm(reward):
    """The stream of the contextual selector's test, with bandit feedback: only the pulled draft's
    reward comes back (observe() hears the others and must not learn from them). UCB per (arm,
    label) still finds that a long match pays on either arm; plain UCB, one arm for all rounds, cannot."""
    means = {"long": 0.9, "short": 0.2}
    results = {}
    for name in (f"ucb-{reward}-contextual", f"ucb-{reward}"):
        selector, rng, total = build_selector(name, ["a", "b"], SelectorConfig(seed=1)), random.Random(0), 0.0
        for _ in range(2000):
            labels = dict(zip("ab", rng.sample(["long", "short"], 2)))
            arm = selector.select({other: Offer(label, asked=4, size=4) for other, label in labels.items()})
            rewards = {other: float(rng.random() < means[labels[other]]) for other in "ab"}
            selector.update(arm, rewards[arm])
            if selector.full_information:
                selector.observe({other: ArmScore(1.0 - rewards[other], labels[other]) for other in "ab"})
            total += rewards[arm]
        results[name] = total / 2000
    assert results[f"ucb-{reward}-contextual"] > 0.85 > 0.6 > results[f"ucb-{reward}"]


def test_contextual_ucb_tries_each_arm_and_label_once_and_skips_a_cheap_arm_without_a_draft():
    selector = build_selector("ucb-bd-contextual", ["lm", "a"], SelectorConfig(seed=1))
    match2, match8 = {"a": Offer("match2", 4, 4)}, {"a": Offer("match8", 4, 4)}
    assert selector.select(match2) == "lm"  # every (arm, label) once first, in the arms' order
    selector.update("lm", 0.5)
    assert selector.select(match2) == "a"
    selector.update("a", 0.25)
    assert selector.contexts == {"lm": {"": [1.0, 0.5]}, "a": {"match2": [1.0, 0.25]}}
    assert selector.select(match8) == "a"  # a new label of a is a new context: tried before UCB picks
    selector.update("a", 1.0)
    assert selector.contexts["a"]["match8"] == [1.0, 1.0]
    assert selector.select({}) == "lm"  # a has nothing to draft this round


def test_contextual_speed_weighs_each_drafts_accepted_tokens_against_the_cost_of_verifying_it():
    """Asked for 8 tokens, arm a drafts all 8 and gets half of them accepted; b drafts 2 and gets both.
    Per round a is better (4 tokens against 2), so the contextual selector picks it; per second b is,
    where T(9) = 3 T(1) and T(3) = 1.5 T(1): (1 + 2) / 1.5 = 2 against (1 + 4) / 3 = 1.67 one-token steps."""
    offers = {
        "a": Offer("long", asked=8, size=8, verify_steps=3.0),
        "b": Offer("short", asked=8, size=2, verify_steps=1.5),
    }
    selectors = {name: build_selector(name, ["a", "b"]) for name in ("contextual", "contextual-speed")}
    for selector in selectors.values():
        selector.observe({"a": ArmScore(4 / 8, "long"), "b": ArmScore(2 / 8, "short")})
    assert {name: selector.select(offers) for name, selector in selectors.items()} == {
        "contextual": "a",
        "contextual-speed": "b",
    }
    # Where verifying costs the same whatever the length (a GPU at batch 1), both pick a.
    flat = {arm: Offer(offer.label, offer.asked, offer.size, verify_steps=1.0) for arm, offer in offers.items()}
    assert selectors["contextual-speed"].select(flat) == "a"


def test_contextual_speed_weighs_a_neural_arms_round_speed_against_the_cheap_drafts_speedup():
    """lm's pulls earned round-speed rewards of 0.6 (a speedup of 1.5); a's draft is expected to get
    1 of 4 tokens accepted at T(5) = 2.5 T(1), a speedup of 0.8: lm is picked, and a once its draft
    is expected to get all 4 (speedup 2)."""
    selector = build_selector("contextual-speed", ["lm", "a"], SelectorConfig(beta=0.0))
    for _ in range(10):
        selector.update("lm", 0.6)
    selector.observe({"a": ArmScore(0.25, "short")})
    selector.observe({"a": ArmScore(1.0, "long")})
    assert selector.select({"a": Offer("short", 4, 4, verify_steps=2.5)}) == "lm"
    assert selector.select({"a": Offer("long", 4, 4, verify_steps=2.5)}) == "a"
    with pytest.raises(EvospecError, match="forward cost"):
        selector.select({"a": Offer("long", 4, 4)})


def test_gaussian_thompson_concentrates_where_rewards_differ_by_hundredths_and_ucb_does_not():
    """Round-speed rewards: means 0.50, 0.53, 0.47 with spread 0.05. UCB's bonus is scaled for rewards
    anywhere in [0, 1] and keeps pulling every arm; Thompson sampling with each arm's own spread does not."""

    def best_arm_share(name: str, seed: int) -> float:
        selector, rng = build_selector(name, ["a", "b", "c"], SelectorConfig(seed=seed)), random.Random(seed)
        for _ in range(2000):
            arm = selector.select()
            mean = {"a": 0.50, "b": 0.53, "c": 0.47}[arm]
            selector.update(arm, min(1.0, max(0.0, rng.gauss(mean, 0.05))))
        return selector.pulls["b"] / 2000

    for seed in range(3):
        assert best_arm_share("thompson-speed", seed) > 0.9
        assert best_arm_share("ucb-speed", seed) < 0.6


def test_discounting_follows_a_switch_of_the_best_arm():
    picks_of_the_new_best = {}
    for discount in (1.0, 0.99):
        selector = build_selector("ucb-bd", ["a", "b"], SelectorConfig(beta=0.2, discount=discount))
        bernoulli_bandit(selector, [0.9, 0.2], rounds=2000)
        rng, picks = random.Random(1), 0
        for _ in range(500):  # now b is the better arm
            arm = selector.select()
            picks += arm == "b"
            selector.update(arm, float(rng.random() < (0.9 if arm == "b" else 0.2)))
        picks_of_the_new_best[discount] = picks
    assert picks_of_the_new_best[0.99] > 2 * picks_of_the_new_best[1.0]


def test_round_robin_and_fixed():
    robin = build_selector("round-robin", ["a", "b", "c"])
    assert [robin.select() for _ in range(5)] == ["a", "b", "c", "a", "b"]
    fixed = build_selector("fixed:b", ["a", "b"])
    assert {fixed.select() for _ in range(5)} == {"b"}


def test_per_request_state_is_dropped_at_each_request():
    selector = build_selector("ucb-bd", ["a", "b"], SelectorConfig(per_request=True))
    bernoulli_bandit(selector, [0.9, 0.1], rounds=50)
    selector.begin_request(["a", "b"])
    assert selector.pulls == {"a": 0.0, "b": 0.0}


@pytest.mark.parametrize("name", sorted(set(SELECTORS) - {"fixed"}))
def test_an_arm_that_sleeps_through_a_request_is_never_selected_and_keeps_what_it_learned(name):
    selector = build_selector(name, ["a", "b", "c"])
    bernoulli_bandit(selector, [0.2, 0.9, 0.5], rounds=60)
    learned = dict(selector.pulls)
    selector.begin_request(["a", "c"])  # b has nothing to draft from in this request
    picks = set()
    for _ in range(40):
        arm = selector.select()
        picks.add(arm)
        selector.update(arm, 0.5)
    assert picks <= {"a", "c"} and selector.pulls["b"] == learned["b"]
    selector.begin_request(["a", "b", "c"])
    pulls_of_b = selector.pulls["b"]
    bernoulli_bandit(selector, [0.2, 0.9, 0.5], rounds=40)
    assert selector.pulls["b"] > pulls_of_b  # awake again, it is pulled again
    with pytest.raises(EvospecError, match="awake"):
        selector.begin_request(["z"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown selector"),
        ("fixed", "needs a drafter"),
        ("fixed:z", "names no drafter"),
        ("exp3:1", "no argument"),
    ],
)
def test_bad_selector_specs_are_clear_errors(spec, message):
    with pytest.raises(EvospecError, match=message):
        build_selector(spec, ["a", "b"])


def test_the_registry_lists_the_issues_selectors():
    assert set(SELECTORS) == {
        "ucb-bd",
        "ucb-be",
        "ucb-speed",
        "ucb-bd-contextual",
        "ucb-be-contextual",
        "exp3",
        "hedge",
        "contextual",
        "contextual-speed",
        "thompson",
        "thompson-speed",
        "egreedy",
        "round-robin",
        "fixed",
    }


@pytest.mark.parametrize("name", sorted(set(SELECTORS) - {"fixed"}) + ["fixed:b"])
def test_a_restored_selector_goes_on_exactly_as_the_saved_one(name):
    def picks(selector, seed: int) -> list[str]:
        rng, means, arms = random.Random(seed), {"a": 0.2, "b": 0.5, "c": 0.7}, []
        for _ in range(300):
            arms.append(selector.select())
            selector.update(arms[-1], float(rng.random() < means[arms[-1]]))
        return arms

    selector = build_selector(name, ["a", "b", "c"], SelectorConfig(seed=3))
    picks(selector, seed=0)
    restored = build_selector(name, ["a", "b", "c"], SelectorConfig(seed=4))  # its random state comes from the save
    restored.load_state_dict(json.loads(json.dumps(selector.state_dict())))  # through JSON, as it is saved
    assert picks(restored, seed=1) == picks(selector, seed=1)
    assert restored.state_dict() == selector.state_dict()


def test_a_selector_state_for_other_arms_is_refused():
    state = build_selector("ucb-bd", ["a", "b"]).state_dict()
    with pytest.raises(EvospecError, match="over"):
        build_selector("ucb-bd", ["a", "c"]).load_state_dict(state)
    with pytest.raises(EvospecError, match="EXP3"):
        build_selector("exp3", ["a", "b"]).load_state_dict(state)
