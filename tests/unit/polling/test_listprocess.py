"""crossbar.polling.listprocess called in place: it says, as JSON, what crossbar keeps of a
model list, or why it is no list, in the same words as a read in place.
"""

from __future__ import annotations

import json

import msgspec

from crossbar.polling.listprocess import answer
from crossbar.polling.modellist import read_models


def test_a_list_is_answered_as_crossbar_keeps_it() -> None:
    body = b'{"data":[{"id":"a","status":{"value":"loaded"}},{"id":"b","status":{"value":"x"}}]}'
    said = json.loads(answer(body))
    assert said == {"models": json.loads(msgspec.json.encode(read_models(body)))}
    assert said["models"]["loaded"] == ["a"] and said["models"]["known"] == ["a", "b"]


def test_no_list_is_answered_with_the_same_words_as_a_read_in_place() -> None:
    try:
        read_models(b'{"data": 3}')
    except ValueError as e:
        words = str(e)
    assert json.loads(answer(b'{"data": 3}')) == {"error": words}
