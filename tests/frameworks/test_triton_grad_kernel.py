"""The Triton gradient kernel on the CPU: its arithmetic under the Triton interpreter (the tests
in tests/frameworks/triton_interpreted.py, in a process of their own: Triton decides whether it
interprets when it is imported, for its own library too, so this process's Triton stays
compiled), and the real compiler's output for a CUDA target, which needs no GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[1]


def test_triton_kernel_under_the_interpreter_matches_numpy_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-W", "ignore::DeprecationWarning", str(TESTS / "triton_interpreted.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == 7 and "skipped" not in out, out[-3000:]


# the kernels' signatures as triton.compile takes them (pointer element types, then constexprs)
STAGE_ONE = {"chunk_param": "*i32", "chunk_start": "*i64", "addrs": "*i64", "numels": "*i64", "sign_at": "*i64",
             "bounds": "*fp32", "part_keys": "*i32", "part_ss": "*fp64", "part_counts": "*i32", "payload": "*u8",
             "chunk_base": "i32"}
STAGE_ONE_CONSTANTS = ("DTYPE", "BF16", "NB", "NBP", "SIGNS", "ALIGNED", "CHUNK", "BLOCK")
STAGE_TWO = {"chunk_range": "*i64", "numels": "*i64", "part_keys": "*i32", "part_ss": "*fp64", "part_counts": "*i32",
             "stats": "*fp64"}


def test_triton_kernels_compile_for_a_cuda_target_with_vector_loads(tmp_path, monkeypatch):
    """What the GPU runs, built here for an H100/H200 (sm_90) by Triton's own compiler and ptxas:
    every variant a monitor launches compiles, and aligned whole tiles load 16 bytes at a time."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rlprobe.frameworks import triton_grad_kernel as kernel

    target = GPUTarget("cuda", 90, 32)
    signature = {**STAGE_ONE, **{name: "constexpr" for name in STAGE_ONE_CONSTANTS}}
    for dtype, nb, signs, aligned in [(tl.float32, 3, True, True), (tl.uint16, 0, True, True),
                                      (tl.float16, 5, False, False)]:
        constants = {"DTYPE": dtype, "BF16": dtype == tl.uint16, "NB": nb, "NBP": kernel._pow2(nb), "SIGNS": signs,
                     "ALIGNED": aligned, "CHUNK": kernel.CHUNK, "BLOCK": kernel.BLOCK}
        ptx = triton.compile(ASTSource(kernel._chunk_stats, signature, constexprs=constants), target=target,
                             options={"num_warps": kernel.NUM_WARPS, "enable_fp_fusion": True}).asm["ptx"]
        vector_loads = ptx.count("ld.global.v4")
        assert (vector_loads > 0) == aligned, (dtype, aligned, vector_loads)
        assert ("st.global.b8" in ptx) == signs and ".ftz" not in ptx  # subnormals are values, not zeros
    for nb in (0, 3):
        signature = {**STAGE_TWO, "NB": "constexpr", "NBP1": "constexpr", "R": "constexpr"}
        constants = {"NB": nb, "NBP1": kernel._pow2(nb + 1), "R": kernel.REDUCE_BLOCK}
        ptx = triton.compile(ASTSource(kernel._param_rows, signature, constexprs=constants), target=target,
                             options={"num_warps": 4, "enable_fp_fusion": True}).asm["ptx"]
        assert "sqrt.rn.f64" in ptx  # the norm's square root is correctly rounded
