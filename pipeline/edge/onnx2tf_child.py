"""onnx2tf in a child process, and its reason for failing read from its log.

The child (`python -c DRIVER convert.json`, in the scratch directory) passes the copy through
onnxslim when asked, then makes one onnx2tf.convert call with the keyword arguments the parent wrote.
It runs with this interpreter's directory first on PATH (onnx2tf calls the `onnxsim` command), its
HTTP(S) proxy at a closed port (a download fails at once instead of hanging), no GPU, a timeout, and
its output in a log: tensorflow never loads in pipe's own process, and onnx2tf's prints stay out.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from pipeline.core.errors import CheckFailed

LOG = "onnx2tf.log"
ADVICE = (  # onnx2tf's ERROR lines that give no reason of their own
    "The trace log is below",
    "input_onnx_file_path",
    "onnx_op_name",
    "Read this and deal with it",
    "Alternatively, if the input OP",
    "If the input OP of ONNX",
    "Also, for models that include",
)
NO_NETWORK = "http://127.0.0.1:9"  # a closed port: a download attempt fails at once instead of hanging

# The child: onnxslim on the copy when asked ("slim" in the JSON file argv[1]), then one call of
# onnx2tf.convert with the other keyword arguments there.
DRIVER = (
    "import json, sys; kw = json.load(open(sys.argv[1]))\n"
    "if kw.pop('slim'):\n"
    "    import onnx, onnxslim; onnx.save(onnxslim.slim(kw['input_onnx_file_path']), kw['input_onnx_file_path'])\n"
    "    print('onnxslim: done', flush=True)\n"
    "import onnx2tf; onnx2tf.convert(**kw)"
)


def run_onnx2tf(scratch: Path, timeout_s: float, original: dict[str, str]) -> None:
    """onnx2tf in a child process in `scratch`; a failure or a timeout raises CheckFailed with its reason."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # onnxsim
    env.update({"HTTP_PROXY": NO_NETWORK, "HTTPS_PROXY": NO_NETWORK, "http_proxy": NO_NETWORK,
                "https_proxy": NO_NETWORK, "NO_PROXY": "", "no_proxy": "",
                "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})  # fmt: skip
    log = scratch / LOG
    with log.open("wb") as out:
        child = subprocess.Popen([sys.executable, "-c", DRIVER, "convert.json"], cwd=scratch, env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # onnx2tf and the onnxsim it started
            child.wait()
            raise CheckFailed(f"onnx2tf did not finish within {timeout_s:.3g} s; log: {log}") from None
    if code != 0:
        raise CheckFailed(f"onnx2tf could not convert the model: {reason(log, original)} (log: {log})")


def reason(log: Path, original: dict[str, str]) -> str:
    """onnx2tf's own reason from its log: its specific ERROR lines, the last exception, the node it stopped at."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace")) if log.is_file() else ""
    lines = [line.strip() for line in text.splitlines()]
    node = next((m.group(1) for line in reversed(lines) if (m := re.search(r"onnx_op_name: (\S+)", line))), None)
    where = f"at node {node!r}: " if node else ""
    if node in original:
        where = f"at node {original[node]!r} (renamed {node!r} for onnx2tf): "
    errors = [line.split("ERROR:", 1)[1].strip() for line in lines if line.startswith("ERROR:")]
    said = [e for e in errors if not e.startswith(ADVICE)][-2:]  # e.g. "Frobnicate OP is not yet implemented."
    raised = [i for i, line in enumerate(lines) if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", line)]
    exception: list[str] = []
    for line in lines[raised[-1] : raised[-1] + 6] if raised else []:
        if line.startswith("Call arguments") or (not line and len(exception) > 1):
            break
        if line:  # keras puts a blank line between the exception and its cause
            exception.append(line)
    reason = " ".join([*said, *([f"({' '.join(exception)})"] if said and exception else exception)])
    return where + (reason or " | ".join([line for line in lines if line][-3:]) or "no output")
