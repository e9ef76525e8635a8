"""crossbar.polling.listprocess: the child that reads a long model list says, as JSON, what
crossbar keeps of it, or why it is no list; run as the poller runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec

from crossbar.polling.listprocess import answer
from crossbar.polling.modellist import MAX_MODELS, read_models


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


def test_run_as_a_process_it_reads_standard_input_to_its_end() -> None:
    body = b'{"data":[' + b",".join(b'{"id":"%06d"}' % i for i in range(5000)) + b"]}"
    done = subprocess.run(
        [sys.executable, "-m", "crossbar.polling.listprocess"], input=body, capture_output=True
    )
    assert done.returncode == 0 and done.stderr == b""
    models = json.loads(done.stdout)["models"]
    assert (models["listed"], models["cut"], len(models["known"])) == (5000, True, MAX_MODELS)
