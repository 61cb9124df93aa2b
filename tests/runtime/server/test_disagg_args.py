"""Bad disaggregation settings are refused at start: ServerArgs and `radixlm router`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixlm.config import ServerArgs


def test_server_args_refuse_bad_disaggregation_settings():
    with pytest.raises(ValueError, match="disaggregation_mode needs dp_size 1"):
        ServerArgs(disaggregation_mode="decode", dp_size=2)
    with pytest.raises(ValueError, match="disaggregation_timeout must be > 0"):
        ServerArgs(disaggregation_timeout=0)
    assert ServerArgs(disaggregation_mode="prefill").disaggregation_mode == "prefill"


@pytest.mark.parametrize(
    "flags",
    [
        ["--prefill-urls", "http://127.0.0.1:1"],
        ["--worker-urls", "http://127.0.0.1:1", "--decode-urls", "http://127.0.0.1:2"],
        [],
    ],
)
def test_router_needs_worker_urls_or_both_prefill_and_decode_urls(flags):
    cmd = [sys.executable, "-m", "radixlm", "router", "--port", "0", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "give --worker-urls, or --prefill-urls and --decode-urls" in done.stderr
