"""crossbar.testing.simulator.window: a simulated slot's window, what it says of it, and
how it refuses a prompt too long for it, as llama-server does."""

from __future__ import annotations

import pytest

from crossbar.testing.simulator.replies import HttpError
from crossbar.testing.simulator.window import (
    TINY_TRAINED,
    UNKNOWN_WINDOW,
    check_prompt,
    meta,
    props_window,
    window_of,
    within_window,
)


def test_a_host_s_windows_are_one_for_all_models_one_per_model_or_none() -> None:
    assert window_of(2048, "any") == 2048
    assert window_of({"a": 4096}, "a") == 4096
    assert window_of({"a": 4096}, "b") is None
    assert window_of(None, "a") is None


def test_a_prompt_as_long_as_the_window_is_refused_with_the_host_s_numbers() -> None:
    with pytest.raises(HttpError) as refused:
        check_prompt(2048, 2048)
    assert refused.value.status == 400
    assert refused.value.kind == "exceed_context_size_error"
    assert refused.value.extra == {"n_prompt_tokens": 2048, "n_ctx": 2048}
    check_prompt(2047, 2048)  # one token less fits
    check_prompt(10**6, None)  # no window: everything fits


def test_an_answer_stops_where_the_window_ends() -> None:
    chat = {"max_tokens": 500}
    assert within_window(chat, 1000, 2048) is chat  # room for all of it
    assert within_window(chat, 1800, 2048)["n_predict"] == 247
    assert within_window(chat, 1800, None) is chat


def test_the_model_list_and_props_tell_the_window() -> None:
    assert meta(4096, 2)["n_ctx"] == 8192
    assert meta(512, 1)["n_ctx_train"] == TINY_TRAINED  # never less than the training context
    assert props_window(None) == UNKNOWN_WINDOW
    assert props_window(1024) == 1024
