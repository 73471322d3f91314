"""Judge replies are read by one JSON reader (`synth.steps.json_reply`): a fenced block or the first
{...} span of the reply, so prose around the object does not send the verdict to the text fallback."""

from synth.steps import json_reply, parse_judge_verdict, parse_pass_fail, parse_score, reply_reason


def test_the_json_object_wins_over_words_in_its_reason():
    reply = 'My verdict: {"verdict": "FAIL", "reason": "it would PASS only with the units"}'
    assert parse_pass_fail(reply) is False
    assert reply_reason(reply) == "it would PASS only with the units"


def test_fenced_and_bare_replies_read_the_same():
    for reply in ('```json\n{"score": 4, "reason": "ok"}\n```', '{"score": 4, "reason": "ok"}', 'Here: {"score": 4, "reason": "ok"}'):
        assert json_reply(reply) == {"score": 4, "reason": "ok"}
        assert parse_score(reply) == 4.0
    assert parse_judge_verdict('Graded. {"verdict": false, "score": 2}') == (False, 2.0)


def test_text_replies_fall_back_to_the_words():
    assert json_reply("PASS, the answer is right") is None
    assert parse_pass_fail("PASS, the answer is right") is True
    assert parse_judge_verdict("yes, score: 5") == (True, 5.0)
    assert parse_score("Score: 3") == 3.0 and parse_score("7") is None
