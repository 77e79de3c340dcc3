"""`import sageattention` works without Triton (conda-forge has none on win-64); the Triton path then says what to
install. Run in a child process, where Triton is made unimportable before anything is imported."""
import json
import subprocess
import sys

CHILD = """
import json, os, sys
sys.modules["triton"] = None  # `import triton` now raises ModuleNotFoundError, as where it is not installed
os.environ["TRITON_INTERPRET"] = "1"  # CPU inputs pass the checks and reach the Triton path
import torch
import sageattention as sa
result = {"loaded_at_import": sorted(m for m in sys.modules if m.startswith("sageattention.triton"))}
q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
cu = torch.tensor([0, 8], dtype=torch.int32)
calls = {"sageattn": lambda: sa.sageattn(q, q, q),
         "sageattn_varlen": lambda: sa.sageattn_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1),
                                                       q[0].transpose(0, 1), cu, cu, 8, 8)}
for name, call in calls.items():
    try:
        call()
        result[name] = None
    except RuntimeError as e:
        result[name] = str(e)
print(json.dumps(result))
"""


def test_import_needs_no_triton_and_the_triton_path_names_what_to_install():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["loaded_at_import"] == [], "import sageattention loaded the Triton backend"
    for name in ("sageattn", "sageattn_varlen"):
        message = result[name]
        assert message is not None, f"{name} ran without Triton"
        assert "pip install triton`" in message and "pip install triton-windows`" in message, message
        assert "compiled CUDA kernels of this build are not available for cpu" in message, message
