"""crossbar.polling.listprocess run as the poller runs it: a child process that reads a long
model list from standard input to its end.
"""

from __future__ import annotations

import json
import subprocess
import sys

from crossbar.polling.modellist import MAX_MODELS


def test_run_as_a_process_it_reads_standard_input_to_its_end() -> None:
    body = b'{"data":[' + b",".join(b'{"id":"%06d"}' % i for i in range(5000)) + b"]}"
    done = subprocess.run(
        [sys.executable, "-m", "crossbar.polling.listprocess"], input=body, capture_output=True
    )
    assert done.returncode == 0 and done.stderr == b""
    models = json.loads(done.stdout)["models"]
    assert (models["listed"], models["cut"], len(models["known"])) == (5000, True, MAX_MODELS)
