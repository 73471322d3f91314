"""The MCQ generator end to end against a scripted teacher over real HTTP: look-alikes with the
seed's option count, N solutions each, strict majority and key agreement, traces kept."""

from __future__ import annotations

import threading

import pytest

from purokit.errors import ContractError
from synth.domains.seeds import load_mcq_seeds

SEEDS = """schema: mcq_seeds/1
seeds:
  - {id: s-good, source: test, question: "Which planet is closest to the sun?", options: {A: Venus, B: Mercury, C: Mars, D: Earth}, answer: B}
  - {id: s-key, source: test, question: "Which gas do we breathe out?", options: {A: Oxygen, B: Carbon dioxide, C: Helium, D: Neon}, answer: B}
"""

Q = {  # variant text -> solver answers (a multiset, order-free)
    "Which planet has the shortest year?": ["B", "B", "B", "C"],          # majority B = key B: 3 traces kept
    "Which planet is the hottest?": ["B", "B", "C", "C"],                # tie: no strict majority
    "Which gas do plants take in?": ["B", "B", "B", "B"],                # majority B, but the key says A
}


def question(text: str, key: str, n: int = 4) -> str:
    opts = ["Venus", "Mercury", "Mars", "Earth"][:n]
    return "Question: " + text + "\n" + "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(opts)) + f"\nAnswer: {key}"


@pytest.fixture
def mcq_script(script):
    counters: dict[str, int] = {}
    lock = threading.Lock()

    def generate(text, req):
        if "Which planet is closest" in text:
            if "variant 1" in text:
                return question("Which planet has the shortest year?", "B")
            if "variant 2" in text:
                return question("Which planet has no moons?", "A", n=3)          # 3 options: rejected
            return question("Which planet is the hottest?", "B")
        return question("Which gas do plants take in?", "A").replace("Venus", "Nitrogen")

    def solve(text, req):
        for q, answers in Q.items():
            if q in text:
                with lock:
                    i = counters.get(q, 0)
                    counters[q] = i + 1
                return f"Thinking about {q.lower()} step by step (attempt {i})...\nAnswer: {answers[i % len(answers)]}"
        return "Answer: A"

    script.on("Write one new multiple-choice question", reply=generate, name="generate")
    script.on("Answer this multiple-choice question", reply=solve, name="solve")
    return script


def test_mcq_generator_keeps_majority_traces(mcq_script, teacher, run_gen, tmp_path, jsonl):
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text(SEEDS)
    res = run_gen("mcq", teacher.base_url, tmp_path / "run", overrides=[f"source.path={seeds}"])
    assert mcq_script.unmatched == []
    records = jsonl(res.records_path)
    assert len(records) == 3
    for r in records:
        m = r["meta"]
        assert m["seed_id"] == "s-good" and m["n_options"] == 4 and m["question"] == "Which planet has the shortest year?"
        assert m["answer"] == m["majority_answer"] == m["key"] == "B" and m["vote_share"] == pytest.approx(0.75)
        assert len(m["solver_samples"]) == 4 and r["messages"][1]["content"].endswith("Answer: B")
    reasons = [x["reason"] for x in jsonl(res.out_dir / "rejects.jsonl")]
    assert any("3 options, the seed has 4" in x for x in reasons)
    assert any(x.startswith("no strict majority over 4 solutions") for x in reasons)
    assert any("disagrees with the generated key A" in x for x in reasons)
    assert sum(x == "answer C disagrees with the majority B" for x in reasons) == 1
    steps = res.manifest.steps
    assert (steps["generate"]["in"], steps["generate"]["out"]) == (6, 5)
    assert (steps["solve"]["in"], steps["solve"]["out"]) == (5, 1)


def test_shipped_seeds_load_and_bad_seeds_are_refused(tmp_path):
    seeds = load_mcq_seeds()
    assert len(seeds) == 12 and all(s.answer in s.options for s in seeds)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "question": "q?", "options": {"A": "1", "B": "2"}, "answer": "C"}\n')
    with pytest.raises(ContractError, match="answer 'C' is not an option"):
        load_mcq_seeds(bad)
