"""crossbar.routing.promptsize: a prompt's tokens guessed from its body's bytes, learned per
model and API from what answers reported, and per conversation from its last turn."""

from __future__ import annotations

from crossbar.routing.promptsize import FIRST_BYTES_PER_TOKEN, MIN_LEARN_BYTES, PromptSizes


def test_before_any_answer_a_body_is_guessed_at_the_first_rate() -> None:
    sizes = PromptSizes()
    guess = sizes.estimate("m", "chat", 30_000)
    assert (guess.tokens, guess.how) == (round(30_000 / FIRST_BYTES_PER_TOKEN), "first")


def test_the_rate_is_learned_per_model_and_api_from_the_answers() -> None:
    sizes = PromptSizes()
    sizes.learn("m", "chat", 40_000, 10_000)  # 4 bytes a token
    assert sizes.estimate("m", "chat", 20_000).tokens == 5_000
    assert sizes.estimate("m", "chat", 20_000).how == "learned"
    assert sizes.estimate("m", "responses", 20_000).how == "first"  # another API: its own
    assert sizes.estimate("other", "chat", 20_000).how == "first"
    for _ in range(30):  # the agent changed: the rate follows within a few answers
        sizes.learn("m", "chat", 20_000, 10_000)
    rate = sizes.rate("m", "chat")
    assert rate is not None and abs(rate - 2.0) < 0.01


def test_numbers_that_cannot_be_a_prompt_s_teach_nothing() -> None:
    sizes = PromptSizes()
    sizes.learn("m", "chat", 100_000, 0)
    sizes.learn("m", "chat", 100_000, 1)  # 100,000 bytes a token
    sizes.learn("m", "chat", 1_000, 10_000)  # ten tokens a byte
    sizes.learn("m", "chat", MIN_LEARN_BYTES - 1, 60)  # too short: the template weighs most
    assert sizes.rate("m", "chat") is None


def test_a_conversation_is_guessed_from_its_last_turn_plus_what_was_added() -> None:
    sizes = PromptSizes()
    sizes.learn("m", "anthropic", 50_000, 10_000, conversation=b"k")  # 5 bytes a token
    guess = sizes.estimate("m", "anthropic", 60_000, conversation=b"k")
    assert (guess.tokens, guess.how) == (12_000, "conversation")
    # Compacted: shorter than its last turn, so guessed afresh from the rate.
    assert sizes.estimate("m", "anthropic", 20_000, conversation=b"k").how == "learned"
    assert sizes.estimate("m", "anthropic", 60_000, conversation=b"new").how == "learned"


def test_the_tables_are_bounded_the_least_recently_used_going_first() -> None:
    sizes = PromptSizes(max_rates=2, max_conversations=2)
    for n in range(3):
        sizes.learn(f"m{n}", "chat", 4_000, 1_000, conversation=b"%d" % n)
    assert sizes.rate("m0", "chat") is None and sizes.rate("m2", "chat") == 4.0
    assert sizes.estimate("m0", "chat", 8_000, conversation=b"0").how == "first"
    assert sizes.estimate("m2", "chat", 8_000, conversation=b"2").how == "conversation"
