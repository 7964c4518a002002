"""Planning code and the CLI stay importable without the runtime extra (torch, zmq, FastAPI)."""

from __future__ import annotations

import subprocess
import sys

BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'zmq', 'fastapi', 'uvicorn', 'starlette', 'openai'}:
            raise ImportError(f'blocked: {name}')
sys.meta_path.insert(0, _Block())
"""


def test_cli_and_runtime_config_import_without_runtime_extra():
    code = BLOCK + (
        "import coral.cli.main, coral.cli.serve_cmd, coral.runtime, coral.runtime.config, "
        "coral.runtime.tiny, coral.runtime.stage_router, coral.runtime.tokenizer, "
        "coral.runtime.metrics, coral.runtime.deployment, coral.runtime.vllm, "
        "coral.runtime.skypilot, coral.runtime.checkpoint\n"
        "from coral.runtime.config import ModelConfig, PipelineSpec\n"
        "PipelineSpec.even(ModelConfig(), 3)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
